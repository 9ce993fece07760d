package deploy

import (
	"bufio"
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	cpapp "github.com/proxyplane/proxyplane/controlplane/app"
	agentapp "github.com/proxyplane/proxyplane/nodeagent/app"
	agentconfig "github.com/proxyplane/proxyplane/nodeagent/config"
)

// The workloads' configuration files, which kustomization.yaml mounts
// where each --config points (e2e/box's TestRenderDeploy checks that
// through kustomize).
const (
	kubeProxyConf    = "kube-proxy.conf"
	controlplaneConf = "controlplane.conf"
)

// TestNodeagentConfig runs the agent's option handling on the DaemonSet's
// arguments and kube-proxy.conf, as a pod would: the file must load
// strictly, with no field the agent ignores and no flag given beside it
// that it overrides (each would be a warning in every agent's log), and
// the result must be valid. The init container's must be too.
func TestNodeagentConfig(t *testing.T) {
	var ds appsv1.DaemonSet
	readManifest(t, "nodeagent.yaml", "DaemonSet", &ds)
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 1 {
		t.Fatalf("want one container and one init container, got %d and %d", len(spec.Containers), len(spec.InitContainers))
	}
	t.Setenv("NODE_NAME", "node-0")
	for _, c := range []corev1.Container{spec.InitContainers[0], spec.Containers[0]} {
		t.Run(c.Name, func(t *testing.T) {
			o := agentapp.NewOptions()
			fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(args(t, c, kubeProxyConf)); err != nil {
				t.Fatal(err)
			}
			loaded, err := o.Complete(fs)
			if err != nil {
				t.Fatal(err)
			}
			if loaded == nil {
				t.Fatal("no --config")
			}
			if loaded.Lenient != nil || len(loaded.Ignored) > 0 || len(loaded.IgnoredFlags) > 0 {
				t.Errorf("warnings: lenient %v, ignored fields %q, ignored flags %q", loaded.Lenient, loaded.Ignored, loaded.IgnoredFlags)
			}
			if err := o.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestKubeProxyConfModes checks that switching kube-proxy.conf's mode
// alone keeps the sync period and masquerade settings: each mode reads
// its own section, so the sections must agree.
func TestKubeProxyConfModes(t *testing.T) {
	data, err := os.ReadFile(kubeProxyConf)
	if err != nil {
		t.Fatal(err)
	}
	c, lenient, err := agentconfig.Decode(data)
	if err != nil || lenient != nil {
		t.Fatalf("decoding: %v (lenient: %v)", err, lenient)
	}
	var first *agentconfig.Proxy
	for _, mode := range agentconfig.Modes {
		c.Mode = kubeproxy.ProxyMode(mode)
		f, err := agentconfig.FromKubeProxy(c)
		if err != nil {
			t.Fatalf("mode %s: %v", mode, err)
		}
		p := f.Proxy
		if first == nil {
			first = &p
			continue
		}
		if p.SyncPeriod != first.SyncPeriod || p.MasqueradeBit != first.MasqueradeBit || p.MasqueradeAll != first.MasqueradeAll {
			t.Errorf("mode %s: syncPeriod %s, masqueradeBit %d, masqueradeAll %t; mode %s: %s, %d, %t", mode,
				p.SyncPeriod, p.MasqueradeBit, p.MasqueradeAll, agentconfig.Modes[0], first.SyncPeriod, first.MasqueradeBit, first.MasqueradeAll)
		}
	}
}

// TestControlplaneConfig runs the control plane's option handling on the
// Deployment's arguments and controlplane.conf: strict decoding, and a
// valid result.
func TestControlplaneConfig(t *testing.T) {
	var dep appsv1.Deployment
	readManifest(t, "controlplane.yaml", "Deployment", &dep)
	if len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(dep.Spec.Template.Spec.Containers))
	}
	o := cpapp.NewOptions()
	fs := pflag.NewFlagSet("controlplane", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args(t, dep.Spec.Template.Spec.Containers[0], controlplaneConf)); err != nil {
		t.Fatal(err)
	}
	if o.ConfigFile == "" {
		t.Fatal("no --config")
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
}

// readManifest decodes the document of kind in file, strictly.
func readManifest(t *testing.T, file, kind string, into any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if meta.Kind == kind {
			if err := yaml.UnmarshalStrict(doc, into); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			return
		}
	}
	t.Fatalf("%s holds no %s", file, kind)
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// args returns c's arguments as the kubelet would expand them, with
// config.env's values (CONTROL_PLANE_ADDRESSES set, as operators must)
// and the downward API's, and --config pointed at conf, the file its
// volume holds.
func args(t *testing.T, c corev1.Container, conf string) []string {
	t.Helper()
	values := configEnv(t)
	values["CONTROL_PLANE_ADDRESSES"] = "10.0.0.11:9640,10.0.0.12:9640"
	fields := map[string]string{"spec.nodeName": "node-0", "metadata.namespace": "proxyplane-system"}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			v, ok := values[e.ValueFrom.ConfigMapKeyRef.Key]
			if !ok {
				t.Errorf("env %s reads %s, not in config.env", e.Name, e.ValueFrom.ConfigMapKeyRef.Key)
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = fields[e.ValueFrom.FieldRef.FieldPath]
		}
	}
	out := make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + conf
		}
		out = append(out, varRef.ReplaceAllStringFunc(a, func(m string) string {
			v, ok := env[m[2:len(m)-1]]
			if !ok {
				t.Errorf("%s: %s is not in the container's env", a, m)
			}
			return v
		}))
	}
	return out
}

// configEnv reads config.env's KEY=VALUE lines.
func configEnv(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("config.env")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	values := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("config.env: %q is not KEY=VALUE", line)
		}
		values[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return values
}
