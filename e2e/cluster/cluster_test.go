package cluster_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/cluster"
)

// wantVersion is the kube-apiserver release e2e/go.mod pins and the
// Makefile stamps into the binary; /version must report it or clients that
// gate features on the server version misbehave.
const wantVersion = "v1.36.4"

// TestSmoke checks what later e2e tests rely on: the admin can write the
// objects the control plane watches, the controlplane identity is bound by
// RBAC alone, and objects survive a restart on the same ports.
func TestSmoke(t *testing.T) {
	c := cluster.Start(t, cluster.RequireBinary(t))
	ctx := t.Context()
	admin := clientset(t, c.AdminConfig)
	controlplane := clientset(t, c.ControlplaneConfig)

	v, err := admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("GET /version: %v", err)
	}
	if v.GitVersion != wantVersion {
		t.Errorf("/version gitVersion = %q, want %q (built without the Makefile's -ldflags?)", v.GitVersion, wantVersion)
	}

	svc := createServiceWithSlice(ctx, t, admin)

	if _, err := controlplane.CoreV1().Services("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("controlplane listing Services before any RBAC: err = %v, want Forbidden", err)
	}
	grantWatch(ctx, t, admin)
	// The RBAC authorizer reads roles through an informer, so the grant
	// takes effect a moment after the create returns.
	eventually(t, 30*time.Second, func() error {
		_, err := controlplane.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		return err
	})
	if _, err := controlplane.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("controlplane listing EndpointSlices after the grant: %v", err)
	}
	if _, err := controlplane.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("controlplane listing Nodes after the grant: %v", err)
	}
	if err := controlplane.CoreV1().Services("smoke").Delete(ctx, "web", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("controlplane deleting a Service with a list/watch grant: err = %v, want Forbidden", err)
	}

	urlBefore := c.URL()
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if c.URL() != urlBefore {
		t.Errorf("URL after restart = %s, want %s", c.URL(), urlBefore)
	}
	// Clients made before the restart must work after it: that is what a
	// running control plane sees.
	got, err := admin.CoreV1().Services("smoke").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting the Service after restart: %v", err)
	}
	if got.UID != svc.UID || got.Spec.ClusterIP != svc.Spec.ClusterIP {
		t.Errorf("Service after restart: uid %s clusterIP %s, want uid %s clusterIP %s",
			got.UID, got.Spec.ClusterIP, svc.UID, svc.Spec.ClusterIP)
	}
	slices, err := controlplane.DiscoveryV1().EndpointSlices("smoke").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("controlplane listing EndpointSlices after restart: %v", err)
	}
	if len(slices.Items) != 1 {
		t.Errorf("EndpointSlices after restart: %d, want 1", len(slices.Items))
	}
}

func clientset(t *testing.T, config func() (*rest.Config, error)) *kubernetes.Clientset {
	t.Helper()
	cfg, err := config()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("creating clientset: %v", err)
	}
	return cs
}

// createServiceWithSlice creates namespace smoke, Service web and one
// EndpointSlice for it, as the tests that follow will (no controller
// manager runs to make the slice).
func createServiceWithSlice(ctx context.Context, t *testing.T, cs kubernetes.Interface) *corev1.Service {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Namespace: %v", err)
	}
	svc, err := cs.CoreV1().Services("smoke").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service: %v", err)
	}
	if svc.Spec.ClusterIP == "" {
		t.Fatalf("Service got no ClusterIP")
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("smoke").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "web-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			// TEST-NET-1: documentation addresses, never routed.
			Addresses:  []string{"192.0.2.10"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080),
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating EndpointSlice: %v", err)
	}
	return svc
}

// grantWatch gives proxyplane-controlplane what a proxy control plane needs
// to read, and nothing more.
func grantWatch(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	const name = "smoke-proxyplane-controlplane"
	read := []string{"list", "watch"}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: read},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRole: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "proxyplane-controlplane"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRoleBinding: %v", err)
	}
}

// eventually calls f until it returns nil, failing t with f's last error
// once timeout has passed.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("still failing after %s: %v", timeout, err)
		case <-t.Context().Done():
			t.Fatalf("test ended while waiting: %v", errors.Join(err, t.Context().Err()))
		case <-tick.C:
		}
	}
}
