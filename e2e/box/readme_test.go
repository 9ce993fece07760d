package box

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// yamlBlock is a fenced YAML block of a Markdown file.
var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// TestREADMEPatches applies every kustomize patch deploy/README.md gives
// operators, each in an overlay of deploy/ as the README says, and checks
// that the result is what server-side apply would accept and the pod
// could run: each container's variables named once, none holding both a
// value and a reference, and every $(VAR) an argument uses still
// defined. A JSON patch by list index broke all three when the list
// changed under it.
func TestREADMEPatches(t *testing.T) {
	deployDir, err := FindDeployDir()
	if err != nil {
		t.Skipf("no deploy/ above the working directory: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var patches []string
	for _, m := range yamlBlock.FindAllStringSubmatch(string(readme), -1) {
		if strings.HasPrefix(m[1], "patches:") {
			patches = append(patches, m[1])
		}
	}
	if len(patches) < 2 {
		t.Fatalf("found %d patch blocks in deploy/README.md, want the managed-cluster and the one-node ones", len(patches))
	}
	for i, p := range patches {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			dir := t.TempDir()
			base, err := relPath(dir, deployDir)
			if err != nil {
				t.Fatal(err)
			}
			k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + base + "\n" + p
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
				t.Fatal(err)
			}
			resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
			if err != nil {
				t.Fatalf("rendering the README's patch:\n%s\n%v", p, err)
			}
			for _, r := range resMap.Resources() {
				if r.GetKind() != "Deployment" && r.GetKind() != "DaemonSet" {
					continue
				}
				data, err := r.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				u := &unstructured.Unstructured{}
				if err := u.UnmarshalJSON(data); err != nil {
					t.Fatal(err)
				}
				var d appsv1.Deployment // only the pod template is read
				if err := fromUnstructured(u, &d); err != nil {
					t.Fatal(err)
				}
				for _, c := range d.Spec.Template.Spec.Containers {
					checkContainerEnv(t, r.GetKind()+"/"+c.Name, c.Env, c.Args)
				}
			}
		})
	}
}

func checkContainerEnv(t *testing.T, what string, env []corev1.EnvVar, args []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range env {
		if seen[e.Name] {
			t.Errorf("%s: variable %s twice: server-side apply refuses a duplicate key", what, e.Name)
		}
		seen[e.Name] = true
		if e.Value != "" && e.ValueFrom != nil {
			t.Errorf("%s: variable %s has both a value and valueFrom: the API server refuses it", what, e.Name)
		}
	}
	for _, a := range args {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if !seen[m[1]] {
				t.Errorf("%s: argument %q uses $(%s), which no variable defines: it stays unexpanded", what, a, m[1])
			}
		}
	}
}
