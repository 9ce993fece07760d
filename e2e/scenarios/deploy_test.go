package scenarios

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/proxyplane/proxyplane/e2e/box"
)

// testDeployApplied checks what Start did with deploy/: every rendered
// object is on the server, applied by the box (so the real API server
// accepted each manifest under strict field validation), and the identity
// the control planes run as may do exactly what deploy/'s RBAC grants:
// list and watch Services, EndpointSlices and Nodes, nothing else.
func (e *env) testDeployApplied(t *testing.T) {
	ctx := e.begin(t)
	d := e.b.Deployment()
	if err := d.Check(ctx, e.b.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, u := range d.Objects {
		kinds[u.GetKind()]++
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "DaemonSet", "PodDisruptionBudget", "Service"} {
		if kinds[k] == 0 {
			t.Errorf("rendered deploy/ has no %s (kinds: %v)", k, kinds)
		}
	}
	figure(t, "deploy-applied", "objects=%d kinds=%d", len(d.Objects), len(kinds))

	// The replicas run with the Deployment's arguments and the token's
	// kubeconfig, not admin's.
	for _, c := range e.b.ControlPlanes {
		for _, a := range d.ControlplaneArgs {
			if !slices.Contains(c.Args(), a) {
				t.Errorf("%s runs without the Deployment's %q: %q", c.Name(), a, c.Args())
			}
		}
	}

	cs, err := kubernetes.NewForConfig(e.b.ControlplaneConfig())
	if err != nil {
		t.Fatal(err)
	}
	allowed := []struct {
		what string
		call func() error
	}{
		{"list services", func() error { _, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{}); return err }},
		{"list endpointslices", func() error {
			_, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list nodes", func() error { _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err }},
		{"watch services", func() error {
			w, err := cs.CoreV1().Services("").Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
	}
	for _, a := range allowed {
		if err := a.call(); err != nil {
			t.Errorf("control plane identity cannot %s: %v", a.what, err)
		}
	}
	denied := []struct {
		what string
		call func() error
	}{
		// Informers never GET; deploy/ grants list and watch only.
		{"get a service", func() error {
			_, err := cs.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
			return err
		}},
		{"list pods", func() error { _, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err }},
		{"list secrets", func() error { _, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err }},
		{"list configmaps", func() error { _, err := cs.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{}); return err }},
		{"delete a node", func() error {
			return cs.CoreV1().Nodes().Delete(ctx, "node-0", metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}},
		{"create a service", func() error {
			_, err := cs.CoreV1().Services(box.Namespace).Create(ctx, box.NewService("forbidden"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"create events", func() error {
			_, err := cs.CoreV1().Events(box.Namespace).Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: "forbidden"},
				InvolvedObject: corev1.ObjectReference{Kind: "Service", Namespace: box.Namespace, Name: "web"},
			}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
	}
	for _, d := range denied {
		if err := d.call(); !apierrors.IsForbidden(err) {
			t.Errorf("control plane identity may %s: err = %v, want Forbidden", d.what, err)
		}
	}
}
