package watch

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
)

func svc(name, clusterIP string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
}

func slice(name, service string, addrs ...string) *discoveryv1.EndpointSlice {
	port, portName := int32(8080), "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return s
}

// waitWorld waits until the store's world satisfies cond.
func waitWorld(t *testing.T, store *table.Store, what string, cond func(*table.World) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if w := store.Current(); w != nil && cond(w) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func endpointsOf(w *table.World, key string) int {
	s := w.Service(key)
	if s == nil {
		return -1
	}
	n := compute.BuildNode("node-1", nil)
	return s.EntryFor(n).Size()
}

func TestWatcher(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		svc("web", "10.96.0.10", nil),
		slice("web-1", "web", "10.244.0.5"),
		// Handled by another proxy, and headless: the informers' label
		// selector and compute.SkipReason keep both out of every table.
		svc("other", "10.96.0.11", map[string]string{compute.LabelServiceProxyName: "foo"}),
		svc("headless", corev1.ClusterIPNone, nil),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{corev1.LabelTopologyZone: "z1"}}},
	)
	// The fake clientset drops events made before a watch is established
	// (it has no resource versions), so wait for all three watches.
	watching := make(chan struct{}, 3)
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		gvr := action.GetResource()
		ns := action.GetNamespace()
		w, err := client.Tracker().Watch(gvr, ns)
		if err != nil {
			return false, nil, err
		}
		watching <- struct{}{}
		return true, w, nil
	})
	store := table.NewStore(100)
	w, err := New(client, store, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	select {
	case <-store.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("store never became ready")
	}
	for range 3 {
		select {
		case <-watching:
		case <-time.After(10 * time.Second):
			t.Fatal("informers never started watching")
		}
	}
	world := store.Current()
	if world.Len() != 1 || world.Service("default/web") == nil {
		t.Fatalf("first world has %d services (%v); want only default/web", world.Len(), world.Keys())
	}
	if !world.Known("node-1") || world.Node("node-1").Zone != "z1" {
		t.Errorf("node-1 not known with its zone: %+v", world.Node("node-1"))
	}

	// A slice change recomputes the Service.
	before := endpointsOf(world, "default/web")
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("web-1", "web", "10.244.0.5", "10.244.0.6"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "the second endpoint", func(w *table.World) bool { return endpointsOf(w, "default/web") > before })

	// An invalid update keeps the last good state; a valid one replaces it.
	good := store.Current().Service("default/web")
	bad := svc("web", "10.96.0.10", nil)
	bad.Spec.Ports[0].Protocol = "BOGUS"
	if _, err := client.CoreV1().Services("default").Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A later valid change to another Service proves the bad one was seen.
	if _, err := client.CoreV1().Services("default").Create(ctx, svc("api", "10.96.0.12", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "default/api", func(w *table.World) bool { return w.Service("default/api") != nil })
	if got := store.Current().Service("default/web"); got != good {
		t.Errorf("an invalid update replaced the last good state")
	}

	// Deleting a Service removes it; deleting a Node forgets it.
	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "node-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "web and node-1 gone", func(w *table.World) bool {
		return w.Service("default/web") == nil && !w.Known("node-1")
	})

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestTrimKeepsOnlyWhatTablesUse(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{corev1.LabelTopologyZone: "z", "big": "label"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:   corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"x"}}}},
	}
	out, err := trim(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Node)
	if len(got.Labels) != 1 || got.Labels[corev1.LabelTopologyZone] != "z" || len(got.Status.Images) != 0 || len(got.ManagedFields) != 0 {
		t.Errorf("trimmed node kept too much or too little: %+v", got)
	}
	if !compute.BuildNode("n", got).Equal(compute.BuildNode("n", n)) {
		t.Errorf("trimming changed what the table sees of the node")
	}
}
