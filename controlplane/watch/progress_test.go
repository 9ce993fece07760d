package watch

import (
	"context"
	"log/slog"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/proxyplane/proxyplane/controlplane/table"
)

func withRV(rv string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: rv}}
}

// The world's bound is the lowest informer's, each informer's the higher
// of its handled events (as of the last swap) and its reflector position
// read a sample ago.
func TestProgressBound(t *testing.T) {
	var p progress
	positions := []string{"", ""}
	a := p.add(func() string { return positions[0] })
	b := p.add(func() string { return positions[1] })

	p.handle(a, withRV("40"))
	p.handle(b, withRV("30"))
	p.handle(b, withRV("20")) // never falls
	if got := p.bound(); got != 0 {
		t.Fatalf("before any swap: bound %d, want 0 (handled events count once swapped)", got)
	}
	p.swapped()
	if got := p.bound(); got != 30 {
		t.Fatalf("after a swap: bound %d, want 30, the lower informer's", got)
	}

	// b is quiet but its reflector moves on (a bookmark): the position
	// counts one sample after it was read.
	positions[0], positions[1] = "40", "90"
	p.sample()
	if got := p.bound(); got != 30 {
		t.Fatalf("position just read: bound %d, want 30", got)
	}
	p.sample()
	if got := p.bound(); got != 40 {
		t.Fatalf("position read a sample ago: bound %d, want 40, now a's", got)
	}

	// A tombstone counts its last known state; garbage counts nothing.
	p.handle(a, cache.DeletedFinalStateUnknown{Key: "n", Obj: withRV("95")})
	p.handle(a, withRV("not-a-number"))
	p.handle(a, "not an object")
	p.swapped()
	if got := p.bound(); got != 90 {
		t.Fatalf("after a tombstone at 95: bound %d, want 90, now b's", got)
	}
}

// The watcher's world carries the resourceVersion through which it has
// seen every watched kind, and moves it with events.
func TestWatcherResourceVersion(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	web := svc("web", "10.96.0.10", nil)
	web.ResourceVersion = "50"
	webSlice := slice("web-1", "web", "10.244.0.5")
	webSlice.ResourceVersion = "70"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", ResourceVersion: "30"}}
	cidr := serviceCIDR("kubernetes", "10.96.0.0/16")
	cidr.ResourceVersion = "60"
	client, store, _, _ := start(ctx, t, slog.New(slog.DiscardHandler), web, webSlice, node, cidr)

	waitWorld(t, store, "resource version 30, the Nodes'", func(w *table.World) bool { return w.ResourceVersion() == 30 })
	node = node.DeepCopy()
	node.ResourceVersion = "80"
	node.Labels = map[string]string{corev1.LabelTopologyZone: "z1"}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "resource version 50, the Services'", func(w *table.World) bool { return w.ResourceVersion() == 50 })
}
