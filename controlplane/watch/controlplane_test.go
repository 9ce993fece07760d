package watch

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
)

// controlPlaneSlice is an EndpointSlice of the control plane's Service
// with its grpc port at 9640 and the given ready addresses.
func controlPlaneSlice(name string, ready ...string) *discoveryv1.EndpointSlice {
	port, portName := int32(9640), compute.ControlPlanePortName
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "proxyplane-system", Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: "proxyplane-controlplane"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
	}
	for _, a := range ready {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return s
}

// TestWatcherControlPlaneAddresses checks that the ready endpoints of the
// control plane's own Service reach every node's NodeInfo, in the first
// world and as replicas are replaced, and that they go when the Service
// goes.
func TestWatcherControlPlaneAddresses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cpSvc := svc("proxyplane-controlplane", "10.96.0.50", nil)
	cpSvc.Namespace = "proxyplane-system"
	client, store, _, done := startWith(ctx, t, slog.New(slog.DiscardHandler),
		func(w *Watcher) { w.SetControlPlaneService("proxyplane-system", "proxyplane-controlplane") },
		cpSvc, controlPlaneSlice("cp-1", "192.168.0.10", "192.168.0.11"),
		// Another Service's endpoints are not the control plane's.
		svc("web", "10.96.0.10", nil), slice("web-1", "web", "10.244.0.5"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
	)
	addrsOf := func(w *table.World, node string) []string { return w.Node(node).ControlPlaneAddresses().List() }
	want := []string{"192.168.0.10:9640", "192.168.0.11:9640"}
	for _, node := range []string{"node-1", "not-registered"} {
		if got := addrsOf(store.Current(), node); !slices.Equal(got, want) {
			t.Errorf("first world, %s: control plane addresses %v, want %v", node, got, want)
		}
	}

	// A control-plane machine replaced: the slice now lists another node.
	replaced := controlPlaneSlice("cp-1", "192.168.0.10", "192.168.0.12")
	if _, err := client.DiscoveryV1().EndpointSlices("proxyplane-system").Update(ctx, replaced, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = []string{"192.168.0.10:9640", "192.168.0.12:9640"}
	waitWorld(t, store, "the replaced replica", func(w *table.World) bool { return slices.Equal(addrsOf(w, "node-1"), want) })

	// The Service deleted: unknown, so agents keep to their seeds.
	if err := client.CoreV1().Services("proxyplane-system").Delete(ctx, "proxyplane-controlplane", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "the deleted Service", func(w *table.World) bool { return len(addrsOf(w, "node-1")) == 0 })

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
