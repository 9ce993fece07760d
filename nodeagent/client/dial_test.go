package client

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// loopbackControlPlane serves a fake control plane on a loopback TCP port
// and returns it with its "ip:port", as the control plane reports its
// replicas.
func loopbackControlPlane(t *testing.T) (*fakeControlPlane, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeControlPlane()
	gs := grpc.NewServer()
	pb.RegisterTableServiceServer(gs, f)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(func() { close(f.done); gs.Stop() })
	return f, l.Addr().String()
}

// deadAddress returns a loopback "ip:port" nothing listens on: a
// control-plane machine that was replaced.
func deadAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// tableLearning is a table in force whose NodeInfo carries learned.
func tableLearning(learned ...string) *proxytable.Table {
	t := heldTable()
	t.Node.ControlPlaneAddresses = learned
	return t
}

// runLoopback runs the client against real loopback addresses.
func runLoopback(t *testing.T, a Applier, cached *proxytable.Table, seed ...string) {
	t.Helper()
	startOpts(t, a, slog.New(slog.DiscardHandler), grpc.EmptyDialOption{}, func(o *Options) {
		o.Addresses, o.Cached = seed, cached
	})
}

// TestDialsLearnedAddressWhenSeedsAreDead checks that an agent whose
// configured addresses all went stale (control-plane machines replaced)
// reaches a replica at an address the control plane reported in the
// table in force.
func TestDialsLearnedAddressWhenSeedsAreDead(t *testing.T) {
	f, addr := loopbackControlPlane(t)
	runLoopback(t, &fakeApplier{held: tableLearning(addr)}, nil, deadAddress(t), deadAddress(t))
	if h := recv(t, accept(t, f)).GetHello(); h == nil || h.GetNodeName() != "node-1" {
		t.Fatalf("first message %v, want the agent's hello", h)
	}
}

// TestDialsCachedLearnedAddress checks that an agent restarting with
// nothing in force yet (its cached table not programmed, say) and only
// stale configured addresses reaches the control plane at an address
// learned in its cached table.
func TestDialsCachedLearnedAddress(t *testing.T) {
	f, addr := loopbackControlPlane(t)
	runLoopback(t, &fakeApplier{held: proxytable.Empty()}, tableLearning(addr), deadAddress(t))
	if h := recv(t, accept(t, f)).GetHello(); h == nil {
		t.Fatal("the agent did not say hello")
	}
}

func TestDialOrder(t *testing.T) {
	seed := []string{"10.0.0.1:9640", "10.0.0.2:9640", "10.0.0.3:9640"}
	// Nothing learned: the seed alone, in the node's rendezvous order.
	for i := range 30 {
		node := fmt.Sprintf("node-%d", i)
		if got, want := dialOrder(node, seed, nil), rendezvous(node, seed); !slices.Equal(got, want) {
			t.Fatalf("%s: %q, want %q", node, got, want)
		}
	}
	// Learned addresses first, rotated for the node, then the seed; each
	// address once.
	learned := []string{"10.0.0.2:9640", "10.0.0.9:9640"}
	got := dialOrder("node-1", seed, learned)
	if len(got) != 4 || !slices.Contains(learned, got[0]) || !slices.Contains(learned, got[1]) {
		t.Fatalf("%q: want both learned addresses first, then the two other seeds", got)
	}
	for _, a := range append(slices.Clone(seed), learned...) {
		if !slices.Contains(got, a) {
			t.Errorf("%q lacks %s", got, a)
		}
	}
	// The learned addresses spread nodes over the replicas as the seed
	// does.
	firsts := map[string]int{}
	for i := range 300 {
		firsts[dialOrder(fmt.Sprintf("node-%d", i), seed, learned)[0]]++
	}
	for _, a := range learned {
		if firsts[a] < 100 {
			t.Errorf("%s is first for %d of 300 nodes, want about 150 (%v)", a, firsts[a], firsts)
		}
	}
}

func TestLearnedAddresses(t *testing.T) {
	inForce, cached := tableLearning("10.0.0.1:9640"), tableLearning("10.0.0.2:9640")
	for _, tc := range []struct {
		name         string
		held, cached *proxytable.Table
		want         []string
	}{
		{"the table in force wins", inForce, cached, []string{"10.0.0.1:9640"}},
		{"the cached table before one is in force", proxytable.Empty(), cached, []string{"10.0.0.2:9640"}},
		{"a table in force that learned nothing", tableLearning(), cached, nil},
		{"nothing at all", proxytable.Empty(), nil, nil},
	} {
		if got := LearnedAddresses(tc.held, tc.cached); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
