package watch

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/table"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
	}
}

// TestWatcherServiceCIDRs checks that the ServiceCIDRs reach every node's
// NodeInfo, in the first world and as they change.
func TestWatcherServiceCIDRs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, store, _, done := start(ctx, t, slog.New(slog.DiscardHandler),
		serviceCIDR("kubernetes", "fd00:10:96::/112", "10.96.0.0/16"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
	)
	cidrsOf := func(w *table.World, node string) []string { return w.Node(node).ServiceCIDRs().List() }
	want := []string{"10.96.0.0/16", "fd00:10:96::/112"}
	// The first world carries them already: agents never see a table
	// without them while the cluster has some.
	for _, node := range []string{"node-1", "not-registered"} {
		if got := cidrsOf(store.Current(), node); !slices.Equal(got, want) {
			t.Errorf("first world, %s: service CIDRs %v, want %v", node, got, want)
		}
	}

	extra := serviceCIDR("extra", "10.97.0.0/16")
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want = []string{"10.96.0.0/16", "10.97.0.0/16", "fd00:10:96::/112"}
	waitWorld(t, store, "the added ServiceCIDR", func(w *table.World) bool { return slices.Equal(cidrsOf(w, "node-1"), want) })

	// A status change alone changes nothing: upstream takes every object.
	extra.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionFalse, Reason: "x"}}
	before := store.Current().Revision
	if _, err := client.NetworkingV1().ServiceCIDRs().UpdateStatus(ctx, extra, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want = []string{"10.97.0.0/16"}
	waitWorld(t, store, "the deleted ServiceCIDR", func(w *table.World) bool { return slices.Equal(cidrsOf(w, "node-1"), want) })
	if got := store.Current().Revision; got != before+1 {
		t.Errorf("revision %d after a status change and a deletion, want %d: the status change published a world", got, before+1)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
