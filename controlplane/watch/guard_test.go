package watch

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/capture"
)

// externalIPs decodes the Service under key as node-1 sees it and lists
// its external IPs; nil when the Service is absent.
func externalIPs(t *testing.T, w *table.World, key string) []string {
	t.Helper()
	svc := w.Service(key)
	if svc == nil {
		return nil
	}
	e := svc.EntryFor(compute.BuildNode("node-1", nil))
	var s pb.Service
	if err := proto.Unmarshal(slices.Concat(e.Shared.Bytes, e.Local.Bytes), &s); err != nil {
		t.Fatalf("decoding %s: %v", key, err)
	}
	return s.GetExternalIps()
}

// hasValueEvent reports whether events hold an InvalidValue event about
// Service name whose message contains text.
func hasValueEvent(events []*pb.Event, name, text string) bool {
	return slices.ContainsFunc(events, func(e *pb.Event) bool {
		return e.GetName() == name && e.GetReason() == compute.ReasonInvalidValue && strings.Contains(e.GetMessage(), text)
	})
}

// TestWatcherGuardsAddresses checks that an external IP every agent would
// refuse is left out of the tables, as an InvalidValue event, whether it
// is a configured control plane address, one learned later from the
// control plane's own Service, or a Node's address that appears later;
// and that the Service gets it back when the address stops being guarded.
func TestWatcherGuardsAddresses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	withExternal := func(name, ip string, ips ...string) *corev1.Service {
		s := svc(name, ip, nil)
		s.Spec.ExternalIPs = ips
		return s
	}
	cpSvc := svc("proxyplane-controlplane", "10.96.0.50", nil)
	cpSvc.Namespace = "proxyplane-system"
	client, store, w, done := startWith(ctx, t, slog.New(slog.DiscardHandler),
		func(w *Watcher) {
			w.SetControlPlaneService("proxyplane-system", "proxyplane-controlplane")
			w.SetGuard([]netip.AddrPort{netip.MustParseAddrPort("192.168.0.10:9640")}, capture.PortRange{}, false)
		},
		cpSvc,
		withExternal("seed", "10.96.0.10", "192.168.0.10", "203.0.113.1"),
		withExternal("node", "10.96.0.11", "192.168.0.21"),
		withExternal("learned", "10.96.0.12", "192.168.0.30"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
	)
	world := store.Current()
	for key, want := range map[string][]string{
		"default/seed": {"203.0.113.1"}, "default/node": {"192.168.0.21"}, "default/learned": {"192.168.0.30"},
	} {
		if got := externalIPs(t, world, key); !slices.Equal(got, want) {
			t.Errorf("first world: %s has external IPs %q, want %q", key, got, want)
		}
	}
	waitEvents(t, w, "the seed's event", func(ev []*pb.Event) bool {
		return hasValueEvent(ev, "seed", `externalIPs[0] "192.168.0.10": external IP 192.168.0.10 is control plane address 192.168.0.10:9640`)
	})

	// The Node reports its address: the Service on port 80 of it goes.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.21"}}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "the node's address left out", func(w *table.World) bool { return len(externalIPs(t, w, "default/node")) == 0 })
	waitEvents(t, w, "the node's event", func(ev []*pb.Event) bool {
		return hasValueEvent(ev, "node", "is an address of the node, and port 80 is outside the node port range")
	})

	// A replica learned from the control plane's Service is guarded too.
	if _, err := client.DiscoveryV1().EndpointSlices("proxyplane-system").Create(ctx, controlPlaneSlice("cp-1", "192.168.0.30"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "the learned address left out", func(w *table.World) bool { return len(externalIPs(t, w, "default/learned")) == 0 })

	// The Node loses the address: the Service has it back, and the
	// event goes.
	node.Status.Addresses = nil
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "the node's address back", func(w *table.World) bool {
		return slices.Equal(externalIPs(t, w, "default/node"), []string{"192.168.0.21"})
	})
	waitEvents(t, w, "the node's event gone", func(ev []*pb.Event) bool { return !hasValueEvent(ev, "node", "") })

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestWatcherGuardsReportedAddresses checks that the addresses an agent's
// hello reports (a bridge such as containerd's cni0, which no Node object
// lists) are guarded like a Node's own, from the moment
// ReportNodeAddresses returns, while the Node exists; and that a report
// for a name that is no Node guards nothing.
func TestWatcherGuardsReportedAddresses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	withExternal := func(name, ip string, ips ...string) *corev1.Service {
		s := svc(name, ip, nil)
		s.Spec.ExternalIPs = ips
		return s
	}
	client, store, w, done := startWith(ctx, t, slog.New(slog.DiscardHandler),
		func(w *Watcher) { w.SetGuard(nil, capture.PortRange{}, false) },
		withExternal("bridge", "10.96.0.10", "10.88.0.1"),
		withExternal("other", "10.96.0.11", "203.0.113.9"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
	)
	if got := externalIPs(t, store.Current(), "default/bridge"); !slices.Equal(got, []string{"10.88.0.1"}) {
		t.Fatalf("first world: external IPs %q, want the bridge's", got)
	}
	report := func(node string, addrs ...string) {
		t.Helper()
		var as []netip.Addr
		for _, a := range addrs {
			as = append(as, netip.MustParseAddr(a))
		}
		if err := w.ReportNodeAddresses(ctx, node, as); err != nil {
			t.Fatalf("ReportNodeAddresses(%s): %v", node, err)
		}
	}

	// No waiting: the world is guarded once the report returns.
	report("node-1", "10.88.0.1", "192.168.0.21")
	if got := externalIPs(t, store.Current(), "default/bridge"); len(got) != 0 {
		t.Errorf("after node-1 reported its bridge: external IPs %q, want none", got)
	}
	waitEvents(t, w, "the bridge's event", func(ev []*pb.Event) bool {
		return hasValueEvent(ev, "bridge", "is an address of the node, and port 80 is outside the node port range")
	})
	// The same report again changes nothing and returns at once.
	report("node-1", "192.168.0.21", "10.88.0.1")

	// A name that is no Node guards nothing.
	report("ghost", "203.0.113.9")
	if got := externalIPs(t, store.Current(), "default/other"); !slices.Equal(got, []string{"203.0.113.9"}) {
		t.Errorf("after a report for no Node: external IPs %q, want 203.0.113.9 kept", got)
	}

	// A later report without the bridge gives it back.
	report("node-1", "192.168.0.21")
	if got := externalIPs(t, store.Current(), "default/bridge"); !slices.Equal(got, []string{"10.88.0.1"}) {
		t.Errorf("after node-1 dropped its bridge: external IPs %q, want it back", got)
	}

	// Reported again, then the Node goes: its report goes with it.
	report("node-1", "10.88.0.1")
	if got := externalIPs(t, store.Current(), "default/bridge"); len(got) != 0 {
		t.Errorf("reported again: external IPs %q, want none", got)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "node-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "the bridge's address back with node-1 gone", func(w *table.World) bool {
		return slices.Equal(externalIPs(t, w, "default/bridge"), []string{"10.88.0.1"})
	})

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
