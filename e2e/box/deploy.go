package box

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Names the box looks for in the rendered base: the workloads whose
// command lines it runs, and the ConfigMap generator of config.env, into
// which its overlay merges its own values.
const (
	controlplaneDeployment = "proxyplane-controlplane"
	nodeagentDaemonSet     = "proxyplane-nodeagent"
	configMapGenerator     = "proxyplane-config"
	// FieldManager owns every field the box applies.
	FieldManager = "proxyplane-e2e"
	// tokenLifetime is asked of the TokenRequest API for the control
	// plane's token: longer than any test, and than most demos.
	tokenLifetime = 24 * 60 * 60
)

// Deployment is deploy/ as rendered for the box and applied to its API
// server.
type Deployment struct {
	// OverlayDir is the generated overlay that was rendered: the base plus
	// the box's config.env values, as deploy/README.md tells operators to
	// write one.
	OverlayDir string
	// Objects are the rendered objects in the order applied.
	Objects []*unstructured.Unstructured
	// ControlplaneArgs and NodeagentArgs are the containers' arguments
	// with every $(VAR) expanded as the kubelet would, from the rendered
	// ConfigMap and the downward API; "$(NODE_NAME)" stays for the agent,
	// which the box fills per node.
	ControlplaneArgs, NodeagentArgs []string
	// ControlplaneEnv and NodeagentEnv are the containers' environments
	// as NAME=value, resolved the same way; variables the box cannot
	// resolve outside a pod (resource limits, status.hostIP) are left out.
	ControlplaneEnv, NodeagentEnv []string
	// NodeagentInit are the DaemonSet's init containers, expanded the
	// same way, which the box runs to completion on each node before its
	// agent, as the kubelet would.
	NodeagentInit []Container
	// ControlplaneFiles and NodeagentFiles are the files the pods' ConfigMap
	// volumes put in their containers, for the ConfigMaps deploy/ renders
	// itself (the configuration files). The ConfigMap the control plane
	// publishes at run time, the CA bundle, is in AgentMounts instead.
	ControlplaneFiles, NodeagentFiles []File
	// ServiceAccount is the control plane Deployment's ServiceAccount,
	// as namespace and name.
	ServiceAccount types.NamespacedName
	// Namespace is the workloads' namespace.
	Namespace string
	// AgentPod is the DaemonSet's pod template, from which the box makes
	// each node's Pod object, as the DaemonSet controller would.
	AgentPod corev1.PodTemplateSpec
	// AgentMounts are where the agent's pod gets its token and CA bundle.
	AgentMounts AgentMounts
}

// Container is one container of a workload as the box runs it.
type Container struct {
	// Name is the container's name.
	Name string
	// Args and Env are its arguments and environment (NAME=value),
	// expanded as Deployment's are.
	Args, Env []string
}

// File is a file a ConfigMap volume puts in a container.
type File struct {
	// Path is the file's path in the container.
	Path string
	// Data is its content.
	Data []byte
}

// writeFiles writes files under root, each at its container path, as the
// kubelet would mount them: the box gives each pod a directory standing
// for its containers' root.
func writeFiles(root string, files []File) error {
	for _, f := range files {
		p := hostPath(root, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return fmt.Errorf("creating the directory of %s: %w", p, err)
		}
		if err := os.WriteFile(p, f.Data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	return nil
}

// hostArgs returns, for each argument --name=PATH naming one of files in
// the container, --name=<its copy under root>. Appended to the arguments,
// they point the binary at the files writeFiles wrote: pflag keeps the
// last value of a repeated flag, and the Deployment's own arguments stay
// on the command line, as they are.
func hostArgs(args []string, files []File, root string) []string {
	var out []string
	for _, a := range args {
		name, value, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(name, "--") {
			continue
		}
		if slices.ContainsFunc(files, func(f File) bool { return f.Path == value }) {
			out = append(out, name+"="+hostPath(root, value))
		}
	}
	return out
}

// AgentMounts are the agent's projected token and CA bundle as the
// DaemonSet declares them: what the kubelet would write, and where in the
// container.
type AgentMounts struct {
	// TokenPath is the token's path in the container.
	TokenPath string
	// TokenAudience and TokenExpirationSeconds are the projected token's.
	TokenAudience          string
	TokenExpirationSeconds int64
	// CAPath is the bundle's path in the container.
	CAPath string
	// CAConfigMap and CAKey name the ConfigMap and key mounted there.
	CAConfigMap, CAKey string
}

// DeployDirEnv names the environment variable that overrides which
// kustomize base the box renders (an overlay under test, say).
const DeployDirEnv = "E2E_DEPLOY_DIR"

// FindDeployDir returns $E2E_DEPLOY_DIR if set, otherwise deploy/ of the
// repository: the nearest directory named deploy holding a
// kustomization.yaml above the working directory.
func FindDeployDir() (string, error) {
	if d := os.Getenv(DeployDirEnv); d != "" {
		return d, nil
	}
	return findUp(func(dir string) (string, bool) {
		p := filepath.Join(dir, "deploy")
		_, err := os.Stat(filepath.Join(p, "kustomization.yaml"))
		return p, err == nil
	}, "deploy/kustomization.yaml")
}

// renderDeploy writes an overlay of deployDir into dir that merges config
// into the base's ConfigMap generator (deploy/README.md's overlay), and
// renders it with kustomize's API, as `kubectl apply -k` would.
func renderDeploy(deployDir, dir string, config map[string]string) (*Deployment, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating overlay dir: %w", err)
	}
	// kustomize takes a base only by a path relative to the overlay.
	base, err := relPath(dir, deployDir)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(config))
	for k := range config {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by the e2e box: deploy/ with the box's addresses.\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\nconfigMapGenerator:\n  - name: %s\n    behavior: merge\n    literals:\n", base, configMapGenerator)
	for _, k := range keys {
		// JSON strings are valid YAML scalars, so any value is quoted
		// safely.
		q, _ := json.Marshal(k + "=" + config[k])
		fmt.Fprintf(&b, "      - %s\n", q)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o600); err != nil {
		return nil, fmt.Errorf("writing overlay: %w", err)
	}
	// Disk, not memory: the overlay names the base by its path, and a
	// person can re-render the same directory with `kubectl kustomize`.
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("rendering %s: %w", dir, err)
	}
	d := &Deployment{OverlayDir: dir}
	for _, r := range resMap.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", r.CurId(), err)
		}
		d.Objects = append(d.Objects, u)
	}
	// Namespaces first: the namespaced objects need theirs to exist.
	slices.SortStableFunc(d.Objects, func(a, b *unstructured.Unstructured) int {
		return boolRank(a.GetKind() != "Namespace") - boolRank(b.GetKind() != "Namespace")
	})
	if err := d.workloadArgs(); err != nil {
		return nil, err
	}
	return d, nil
}

// relPath returns target relative to dir, both made absolute first.
func relPath(dir, target string) (string, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", dir, err)
	}
	absTarget, err := filepath.Abs(target)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", target, err)
	}
	rel, err := filepath.Rel(absDir, absTarget)
	if err != nil {
		return "", fmt.Errorf("locating %s from %s: %w", target, dir, err)
	}
	return rel, nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// workloadArgs extracts the two workloads' command lines.
func (d *Deployment) workloadArgs() error {
	cms := map[string]*corev1.ConfigMap{}
	generated := false
	var dep *appsv1.Deployment
	var ds *appsv1.DaemonSet
	for _, u := range d.Objects {
		var into any
		switch {
		case u.GetKind() == "ConfigMap":
			cm := &corev1.ConfigMap{}
			cms[u.GetName()] = cm
			generated = generated || strings.HasPrefix(u.GetName(), configMapGenerator+"-")
			into = cm
		case u.GetKind() == "Deployment" && u.GetName() == controlplaneDeployment:
			dep = &appsv1.Deployment{}
			into = dep
		case u.GetKind() == "DaemonSet" && u.GetName() == nodeagentDaemonSet:
			ds = &appsv1.DaemonSet{}
			into = ds
		default:
			continue
		}
		if err := fromUnstructured(u, into); err != nil {
			return err
		}
	}
	if !generated || dep == nil || ds == nil {
		return fmt.Errorf("rendered deploy/ lacks ConfigMap %s-<hash>, Deployment %s or DaemonSet %s", configMapGenerator, controlplaneDeployment, nodeagentDaemonSet)
	}
	if len(dep.Spec.Template.Spec.Containers) != 1 || len(ds.Spec.Template.Spec.Containers) != 1 {
		return errors.New("the control plane and agent pods must have one container each")
	}
	var err error
	d.Namespace = ds.Namespace
	fields := func(ns, sa string) map[string]string {
		return map[string]string{"metadata.namespace": ns, "spec.serviceAccountName": sa}
	}
	if d.ControlplaneArgs, d.ControlplaneEnv, err = expandArgs(dep.Spec.Template.Spec.Containers[0], cms, fields(dep.Namespace, dep.Spec.Template.Spec.ServiceAccountName)); err != nil {
		return fmt.Errorf("Deployment %s: %w", dep.Name, err)
	}
	if len(dep.Spec.Template.Spec.InitContainers) > 0 {
		return fmt.Errorf("Deployment %s: the box runs no init containers of the control plane", dep.Name)
	}
	if d.ControlplaneFiles, err = configMapFiles(dep.Spec.Template.Spec, cms); err != nil {
		return fmt.Errorf("Deployment %s: %w", dep.Name, err)
	}
	// The agent's node name comes from spec.nodeName; the box fills it in
	// per node.
	agentFields := fields(ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
	agentFields["spec.nodeName"] = "$(NODE_NAME)"
	agent := ds.Spec.Template.Spec.Containers[0]
	if d.NodeagentArgs, d.NodeagentEnv, err = expandArgs(agent, cms, agentFields); err != nil {
		return fmt.Errorf("DaemonSet %s: %w", ds.Name, err)
	}
	for _, c := range ds.Spec.Template.Spec.InitContainers {
		// The box has the binaries of proxyplane's images only.
		if c.Image != agent.Image || len(c.Command) > 0 {
			return fmt.Errorf("DaemonSet %s: init container %s runs %s %q, not the agent's image and entrypoint", ds.Name, c.Name, c.Image, c.Command)
		}
		ic := Container{Name: c.Name}
		if ic.Args, ic.Env, err = expandArgs(c, cms, agentFields); err != nil {
			return fmt.Errorf("DaemonSet %s: init container %s: %w", ds.Name, c.Name, err)
		}
		d.NodeagentInit = append(d.NodeagentInit, ic)
	}
	if d.NodeagentFiles, err = configMapFiles(ds.Spec.Template.Spec, cms); err != nil {
		return fmt.Errorf("DaemonSet %s: %w", ds.Name, err)
	}
	d.ServiceAccount = types.NamespacedName{Namespace: dep.Namespace, Name: dep.Spec.Template.Spec.ServiceAccountName}
	if d.ServiceAccount.Name == "" {
		return fmt.Errorf("Deployment %s names no ServiceAccount", dep.Name)
	}
	d.AgentPod = ds.Spec.Template
	if d.AgentMounts, err = agentMounts(ds.Spec.Template.Spec, cms); err != nil {
		return fmt.Errorf("DaemonSet %s: %w", ds.Name, err)
	}
	// The flags must name the files the volumes put there, or the agent
	// would wait for credentials forever.
	for _, f := range []struct{ flag, path string }{{"--ca-file", d.AgentMounts.CAPath}, {"--token-file", d.AgentMounts.TokenPath}} {
		for _, a := range d.NodeagentArgs {
			if v, ok := strings.CutPrefix(a, f.flag+"="); ok && v != f.path {
				return fmt.Errorf("DaemonSet %s: %s=%s, but the volume is mounted at %s", ds.Name, f.flag, v, f.path)
			}
		}
	}
	return nil
}

// configMapFiles returns the files that spec's ConfigMap volumes of
// rendered ConfigMaps put in its containers (init containers included):
// every key, or the items listed, under the mount path. Volumes of other
// ConfigMaps, which the API server holds only at run time, are left out.
func configMapFiles(spec corev1.PodSpec, rendered map[string]*corev1.ConfigMap) ([]File, error) {
	volumes := map[string]*corev1.ConfigMapVolumeSource{}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && rendered[v.ConfigMap.Name] != nil {
			volumes[v.Name] = v.ConfigMap
		}
	}
	var files []File
	add := func(p string, data []byte) error {
		for _, f := range files {
			if f.Path == p {
				if !slices.Equal(f.Data, data) {
					return fmt.Errorf("two containers mount different files at %s", p)
				}
				return nil
			}
		}
		files = append(files, File{Path: p, Data: data})
		return nil
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, vm := range c.VolumeMounts {
			src := volumes[vm.Name]
			if src == nil {
				continue
			}
			if vm.SubPath != "" {
				return nil, fmt.Errorf("container %s mounts ConfigMap %s with a subPath, which the box does not play", c.Name, src.Name)
			}
			cm := rendered[src.Name]
			items := src.Items
			if len(items) == 0 {
				for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
					items = append(items, corev1.KeyToPath{Key: k, Path: k})
				}
			}
			for _, it := range items {
				data, ok := cm.Data[it.Key]
				if !ok && !ptr.Deref(src.Optional, false) {
					return nil, fmt.Errorf("container %s mounts key %q, absent from ConfigMap %s", c.Name, it.Key, cm.Name)
				}
				if err := add(path.Join(vm.MountPath, it.Path), []byte(data)); err != nil {
					return nil, err
				}
			}
		}
	}
	return files, nil
}

// agentMounts finds the agent's projected ServiceAccount token and its
// CA bundle, the one ConfigMap volume of a ConfigMap deploy/ does not
// render (the control plane publishes it), in its pod spec: the box plays
// the kubelet for both, so it writes what the manifest asks for, where it
// asks.
func agentMounts(spec corev1.PodSpec, rendered map[string]*corev1.ConfigMap) (AgentMounts, error) {
	var m AgentMounts
	c := spec.Containers[0]
	mountOf := func(volume string) (string, bool) {
		for _, vm := range c.VolumeMounts {
			if vm.Name == volume {
				return vm.MountPath, true
			}
		}
		return "", false
	}
	for _, v := range spec.Volumes {
		dir, mounted := mountOf(v.Name)
		switch {
		case !mounted:
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if t := src.ServiceAccountToken; t != nil {
					m.TokenPath = filepath.Join(dir, t.Path)
					m.TokenAudience = t.Audience
					m.TokenExpirationSeconds = ptr.Deref(t.ExpirationSeconds, 3600)
				}
			}
		case v.ConfigMap != nil && rendered[v.ConfigMap.Name] != nil:
			// A configuration file: configMapFiles.
		case v.ConfigMap != nil:
			if m.CAConfigMap != "" {
				return m, fmt.Errorf("ConfigMaps %s and %s are both mounted and neither is rendered: which is the CA bundle?", m.CAConfigMap, v.ConfigMap.Name)
			}
			m.CAConfigMap = v.ConfigMap.Name
			for _, it := range v.ConfigMap.Items {
				m.CAKey, m.CAPath = it.Key, filepath.Join(dir, it.Path)
			}
		}
	}
	if m.TokenPath == "" || m.CAPath == "" {
		return m, fmt.Errorf("the agent mounts no projected ServiceAccount token or no ConfigMap CA bundle (found %+v)", m)
	}
	return m, nil
}

func fromUnstructured(u *unstructured.Unstructured, into any) error {
	data, err := u.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encoding %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("decoding %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

// varRef is the kubelet's $(VAR) reference syntax.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandArgs expands $(VAR) in c's args from its env, resolving
// configMapKeyRef against the rendered ConfigMaps, by name, and fieldRef
// against fields, as the kubelet does, and returns the args and the
// resolved environment (NAME=value, in the container's order). Unlike the
// kubelet, which leaves an unknown reference as it is, a reference to a
// variable that cannot be resolved is an error: in a manifest under test
// it is a bug. A configMapKeyRef to a ConfigMap not rendered is one too,
// since kustomize should have rewritten it to the generated name.
func expandArgs(c corev1.Container, rendered map[string]*corev1.ConfigMap, fields map[string]string) ([]string, []string, error) {
	env := map[string]string{}
	unresolved := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = varRef.ReplaceAllStringFunc(e.Value, func(m string) string {
				if v, ok := env[m[2:len(m)-1]]; ok {
					return v
				}
				return m
			})
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := rendered[ref.Name]
			if cm == nil {
				return nil, nil, fmt.Errorf("env %s reads ConfigMap %q, which deploy/ does not render", e.Name, ref.Name)
			}
			v, ok := cm.Data[ref.Key]
			if !ok && !ptr.Deref(ref.Optional, false) {
				return nil, nil, fmt.Errorf("env %s reads key %q, absent from ConfigMap %s", e.Name, ref.Key, cm.Name)
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil:
			v, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				unresolved[e.Name] = "fieldRef " + e.ValueFrom.FieldRef.FieldPath
				continue
			}
			env[e.Name] = v
		default:
			unresolved[e.Name] = "a resource or secret reference"
		}
	}
	args := make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		var missing []string
		a = varRef.ReplaceAllStringFunc(a, func(m string) string {
			name := m[2 : len(m)-1]
			if v, ok := env[name]; ok {
				return v
			}
			if why, ok := unresolved[name]; ok {
				missing = append(missing, fmt.Sprintf("%s (from %s)", name, why))
			} else {
				missing = append(missing, name+" (not in env)")
			}
			return m
		})
		if len(missing) > 0 {
			return nil, nil, fmt.Errorf("arg %q: cannot expand %s", a, strings.Join(missing, ", "))
		}
		args = append(args, a)
	}
	var environ []string
	for _, e := range c.Env {
		if v, ok := env[e.Name]; ok {
			environ = append(environ, e.Name+"="+v)
		}
	}
	return args, environ, nil
}

// apply server-side applies every rendered object as FieldManager, with
// strict field validation, so the real API server checks each manifest:
// an unknown or duplicated field fails the apply instead of being dropped.
func (d *Deployment) apply(ctx context.Context, cfg *rest.Config) error {
	c, err := newObjectClient(cfg)
	if err != nil {
		return err
	}
	for _, u := range d.Objects {
		ri, err := c.resource(u)
		if err != nil {
			return err
		}
		data, err := u.MarshalJSON()
		if err != nil {
			return fmt.Errorf("encoding %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: FieldManager, Force: ptr.To(true), FieldValidation: metav1.FieldValidationStrict,
		}); err != nil {
			return fmt.Errorf("applying %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}

// Check reads back every rendered object from the API server and
// reports those missing, or not managed by FieldManager.
func (d *Deployment) Check(ctx context.Context, cfg *rest.Config) error {
	c, err := newObjectClient(cfg)
	if err != nil {
		return err
	}
	var errs []error
	for _, u := range d.Objects {
		ri, err := c.resource(u)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		got, err := ri.Get(ctx, u.GetName(), metav1.GetOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("getting %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err))
			continue
		}
		if !slices.ContainsFunc(got.GetManagedFields(), func(m metav1.ManagedFieldsEntry) bool {
			return m.Manager == FieldManager && m.Operation == metav1.ManagedFieldsOperationApply
		}) {
			errs = append(errs, fmt.Errorf("%s %s/%s is not applied by %s", u.GetKind(), u.GetNamespace(), u.GetName(), FieldManager))
		}
	}
	return errors.Join(errs...)
}

// objectClient reaches any kind of object the API server serves.
type objectClient struct {
	mapper *restmapper.DeferredDiscoveryRESTMapper
	dyn    *dynamic.DynamicClient
}

func newObjectClient(cfg *rest.Config) (*objectClient, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	return &objectClient{mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), dyn: dyn}, nil
}

// resource returns the client for u's kind, in u's namespace when the
// kind is namespaced.
func (c *objectClient) resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(u.GetNamespace()), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

// serviceAccountKubeconfig asks the TokenRequest API for a token of sa and
// writes a kubeconfig with it for server, trusting caFile: what the
// control plane's pod would get from its projected token, so the control
// plane runs with exactly the RBAC deploy/ grants that ServiceAccount.
func serviceAccountKubeconfig(ctx context.Context, admin kubernetes.Interface, sa types.NamespacedName, server, caFile, path string) error {
	tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](tokenLifetime)},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token for ServiceAccount %s: %w", sa, err)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("reading the API server's CA: %w", err)
	}
	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// findUp walks up from the working directory until match accepts a
// directory, returning what match returned.
func findUp(match func(dir string) (string, bool), what string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", what, err)
	}
	// The repository is a few levels up at most; the bound only stops the
	// walk at the filesystem root.
	for range 64 {
		if p, ok := match(dir); ok {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", fmt.Errorf("no %s above the working directory: %w", what, fs.ErrNotExist)
}
