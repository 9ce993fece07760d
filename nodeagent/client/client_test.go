package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

const waitFor = 10 * time.Second

// fakeControlPlane serves scripted Sync streams: each stream's handler
// gets the stream and returns when the test is done with it.
type fakeControlPlane struct {
	pb.UnimplementedTableServiceServer
	streams chan grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]
	done    chan struct{}
}

func (f *fakeControlPlane) Sync(s grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) error {
	f.streams <- s
	select {
	case <-f.done:
	case <-s.Context().Done():
	}
	return nil
}

// listeners serves a fake control plane on each named in-memory address.
func listeners(t *testing.T, names ...string) (map[string]*fakeControlPlane, grpc.DialOption) {
	t.Helper()
	lis := map[string]*bufconn.Listener{}
	fakes := map[string]*fakeControlPlane{}
	for _, n := range names {
		l := bufconn.Listen(1 << 20)
		f := &fakeControlPlane{streams: make(chan grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse], 4), done: make(chan struct{})}
		gs := grpc.NewServer()
		pb.RegisterTableServiceServer(gs, f)
		go func() { _ = gs.Serve(l) }()
		t.Cleanup(func() { close(f.done); gs.Stop() })
		lis[n], fakes[n] = l, f
	}
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if l, ok := lis[addr]; ok {
			return l.DialContext(ctx)
		}
		return nil, errors.New("connection refused")
	})
	return fakes, dialer
}

// fakeApplier records what it is given and answers as told.
type fakeApplier struct {
	held    *proxytable.Table
	mu      sync.Mutex
	applied []*pb.SyncResponse
	fail    error
	block   chan struct{} // when set, Apply waits on it
}

func (a *fakeApplier) Held() *proxytable.Table { return a.held }
func (a *fakeApplier) Apply(ctx context.Context, r *pb.SyncResponse) (string, error) {
	if a.block != nil {
		select {
		case <-a.block:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.applied = append(a.applied, r)
	if a.fail != nil {
		return "", a.fail
	}
	return r.GetSnapshot().GetVersion() + r.GetDelta().GetVersion(), nil
}

// start runs the client in plaintext against the named in-memory
// addresses until the test ends.
func start(t *testing.T, a Applier, dial grpc.DialOption, names ...string) {
	t.Helper()
	startWith(t, a, Credentials{Insecure: true}, slog.New(slog.DiscardHandler), dial, names...)
}

// startWith is start with the given credentials and logger.
func startWith(t *testing.T, a Applier, creds Credentials, log *slog.Logger, dial grpc.DialOption, names ...string) {
	t.Helper()
	var addrs []string
	for _, n := range names {
		addrs = append(addrs, "passthrough:///"+n) // the in-memory dialer resolves names
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Run(ctx, Options{
			Addresses: addrs, NodeName: "node-1", Capabilities: &pb.Capabilities{Deltas: true},
			Credentials: creds, DialOptions: []grpc.DialOption{dial},
			BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
			SilenceTimeout: 300 * time.Millisecond, MaxRecvMessageBytes: 4 << 20,
		}, a, log)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func accept(t *testing.T, f *fakeControlPlane) grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse] {
	t.Helper()
	select {
	case s := <-f.streams:
		return s
	case <-time.After(waitFor):
		t.Fatal("the agent never connected")
		return nil
	}
}

func recv(t *testing.T, s grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) *pb.SyncRequest {
	t.Helper()
	ch := make(chan *pb.SyncRequest, 1)
	go func() {
		m, err := s.Recv()
		if err != nil {
			close(ch)
			return
		}
		ch <- m
	}()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatal("stream ended")
		}
		return m
	case <-time.After(waitFor):
		t.Fatal("no message from the agent")
		return nil
	}
}

func heldTable() *proxytable.Table {
	return &proxytable.Table{
		Version: "0000000000000003",
		Node:    &pb.NodeInfo{Name: "node-1", Hash: 1},
		Entries: map[string]*pb.ServiceEntry{"default/a": {Key: "default/a", Hash: 2}},
	}
}

func TestHelloCarriesHeldTable(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	start(t, &fakeApplier{held: heldTable()}, dial, "cp")
	h := recv(t, accept(t, fakes["cp"])).GetHello()
	if h.GetNodeName() != "node-1" || h.GetVersion() != "0000000000000003" || h.GetNodeHash() != 1 ||
		h.GetEntryHashes()["default/a"] != 2 || !h.GetCapabilities().GetDeltas() {
		t.Errorf("hello = %v; want the held table's version, node hash and entry hashes", h)
	}
}

func TestAckAndNack(t *testing.T) {
	cases := []struct {
		name string
		fail error
		want func(*pb.SyncRequest) bool
	}{
		{"applied is acked", nil, func(m *pb.SyncRequest) bool {
			return m.GetAck().GetVersion() == "00000000000000aa" && m.GetAck().GetNonce() == "n1"
		}},
		{"rejected is nacked with entry errors", &proxytable.ValidationError{Entries: []*proxytable.EntryError{{Key: "default/x", Err: errors.New("bad port")}}},
			func(m *pb.SyncRequest) bool {
				n := m.GetNack()
				return n.GetNonce() == "n1" && n.GetVersion() == "00000000000000aa" &&
					len(n.GetEntryErrors()) == 1 && n.GetEntryErrors()[0].GetKey() == "default/x"
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fakes, dial := listeners(t, "cp")
			start(t, &fakeApplier{held: proxytable.Empty(), fail: tc.fail}, dial, "cp")
			s := accept(t, fakes["cp"])
			recv(t, s) // hello
			_ = s.Send(&pb.SyncResponse{Nonce: "n1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: "00000000000000aa"}}})
			if m := recv(t, s); !tc.want(m) {
				t.Errorf("answer = %v", m)
			}
		})
	}
}

func TestKeepalivesAnsweredDuringApply(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	a := &fakeApplier{held: proxytable.Empty(), block: make(chan struct{})}
	start(t, a, dial, "cp")
	s := accept(t, fakes["cp"])
	recv(t, s) // hello
	_ = s.Send(&pb.SyncResponse{Nonce: "n1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: "00000000000000aa"}}})
	_ = s.Send(&pb.SyncResponse{Kind: &pb.SyncResponse_Keepalive{Keepalive: &pb.Keepalive{}}})
	if m := recv(t, s); m.GetKeepalive() == nil {
		t.Fatalf("while applying, the agent answered %v; want a keepalive", m)
	}
	close(a.block)
	if m := recv(t, s); m.GetAck() == nil {
		t.Fatalf("after applying, the agent answered %v; want an ack", m)
	}
}

func TestFailoverAndReconnect(t *testing.T) {
	fakes, dial := listeners(t, "second")
	start(t, &fakeApplier{held: proxytable.Empty()}, dial, "first-is-down", "second")
	s := accept(t, fakes["second"])
	recv(t, s) // hello
	// The control plane goes silent: the agent gives up on the stream
	// after the silence timeout and reconnects.
	if s2 := accept(t, fakes["second"]); recv(t, s2).GetHello() == nil {
		t.Fatal("the reconnected stream did not start with a hello")
	}
}

func TestFailedApplyIsRetriedOnANewStream(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	start(t, &fakeApplier{held: proxytable.Empty(), fail: errors.New("xtables lock held")}, dial, "cp")
	s := accept(t, fakes["cp"])
	recv(t, s) // hello
	_ = s.Send(&pb.SyncResponse{Nonce: "n1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: "00000000000000aa"}}})
	if m := recv(t, s); m.GetNack() == nil {
		t.Fatalf("answer %v, want a nack", m)
	}
	// The table was valid: the agent reconnects so that it is sent again.
	if h := recv(t, accept(t, fakes["cp"])).GetHello(); h == nil {
		t.Fatal("no new hello after a failed apply")
	}
}

// TestFirstAddressSpreads checks that agents start on different replicas:
// 3,000 node names over 3 addresses land within 10% of an even share, and
// a node always starts at the same one.
func TestFirstAddressSpreads(t *testing.T) {
	counts := make([]int, 3)
	for i := range 3000 {
		name := fmt.Sprintf("node-%d", i)
		first := firstAddress(name, 3)
		if again := firstAddress(name, 3); again != first {
			t.Fatalf("%s starts at %d, then %d", name, first, again)
		}
		counts[first]++
	}
	for i, c := range counts {
		if c < 900 || c > 1100 {
			t.Errorf("address %d is first for %d of 3000 nodes, want about 1000 (all: %v)", i, c, counts)
		}
	}
}
