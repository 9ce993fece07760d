package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

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
	kick    chan struct{} // ends the stream being served
	kickErr chan error    // ends it with an error
}

func newFakeControlPlane() *fakeControlPlane {
	return &fakeControlPlane{
		streams: make(chan grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse], 4),
		done:    make(chan struct{}), kick: make(chan struct{}), kickErr: make(chan error),
	}
}

func (f *fakeControlPlane) Sync(s grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) error {
	f.streams <- s
	select {
	case <-f.done:
	case <-f.kick:
	case err := <-f.kickErr:
		return err
	case <-s.Context().Done():
	}
	return nil
}

// end ends the stream being served, as a control plane's failure would.
func (f *fakeControlPlane) end(t *testing.T) {
	t.Helper()
	select {
	case f.kick <- struct{}{}:
	case <-time.After(waitFor):
		t.Fatal("no stream to end")
	}
}

// listeners serves a fake control plane on each named in-memory address.
func listeners(t *testing.T, names ...string) (map[string]*fakeControlPlane, grpc.DialOption) {
	t.Helper()
	lis := map[string]*bufconn.Listener{}
	fakes := map[string]*fakeControlPlane{}
	for _, n := range names {
		l := bufconn.Listen(1 << 20)
		f := newFakeControlPlane()
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
func (a *fakeApplier) Apply(ctx context.Context, r *pb.SyncResponse, _ bool) (string, error) {
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
	startOpts(t, a, log, dial, func(o *Options) { o.Credentials = creds }, names...)
}

// startOpts runs the client against the named in-memory addresses until
// the test ends, with the tests' options changed by edit (when not nil).
func startOpts(t *testing.T, a Applier, log *slog.Logger, dial grpc.DialOption, edit func(*Options), names ...string) {
	t.Helper()
	var addrs []string
	for _, n := range names {
		addrs = append(addrs, "passthrough:///"+n) // the in-memory dialer resolves names
	}
	o := Options{
		Addresses: addrs, NodeName: "node-1", Capabilities: &pb.Capabilities{Deltas: true},
		Credentials: Credentials{Insecure: true}, DialOptions: []grpc.DialOption{dial},
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		SilenceTimeout: 300 * time.Millisecond, MaxRecvMessageBytes: 4 << 20,
	}
	if edit != nil {
		edit(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Run(ctx, o, a, log)
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
		Version:         "0000000000000003",
		ResourceVersion: 77,
		Node:            &pb.NodeInfo{Name: "node-1", Hash: 1},
		Entries:         map[string]*pb.ServiceEntry{"default/a": {Key: "default/a", Hash: 2}},
	}
}

func TestHelloCarriesHeldTable(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	start(t, &fakeApplier{held: heldTable()}, dial, "cp")
	h := recv(t, accept(t, fakes["cp"])).GetHello()
	if h.GetNodeName() != "node-1" || h.GetVersion() != "0000000000000003" || h.GetNodeHash() != 1 ||
		h.GetEntryHashes()["default/a"] != 2 || !h.GetCapabilities().GetDeltas() || h.GetResourceVersion() != 77 {
		t.Errorf("hello = %v; want the held table's version, resource version, node hash and entry hashes", h)
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
		{
			"rejected is nacked with entry errors", &proxytable.ValidationError{Entries: []*proxytable.EntryError{{Key: "default/x", Err: errors.New("bad port")}}},
			func(m *pb.SyncRequest) bool {
				n := m.GetNack()
				return n.GetNonce() == "n1" && n.GetVersion() == "00000000000000aa" &&
					len(n.GetEntryErrors()) == 1 && n.GetEntryErrors()[0].GetKey() == "default/x"
			},
		},
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
	// The agent half-closes after its NACK rather than cancelling the
	// stream, which could drop the NACK in the transport.
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the NACK the stream gave %v, want io.EOF (a half-close)", err)
	}
	fakes["cp"].end(t)
	// The table was valid: the agent reconnects so that it is sent again.
	if h := recv(t, accept(t, fakes["cp"])).GetHello(); h == nil {
		t.Fatal("no new hello after a failed apply")
	}
}

// TestFirstAddressSpreads checks that agents start on different replicas:
// 3,000 node names over 3 addresses land within 10% of an even share, and
// a node always starts at the same one.
func TestFirstAddressSpreads(t *testing.T) {
	addrs := []string{"10.0.0.1:9640", "10.0.0.2:9640", "10.0.0.3:9640"}
	counts := map[string]int{}
	for i := range 3000 {
		name := fmt.Sprintf("node-%d", i)
		first := rendezvous(name, addrs)[0]
		reversed := slices.Clone(addrs)
		slices.Reverse(reversed)
		if again := rendezvous(name, reversed); again[0] != first {
			t.Fatalf("%s starts at %s, then, with the list reversed, at %s", name, first, again[0])
		}
		counts[first]++
	}
	for _, a := range addrs {
		if c := counts[a]; c < 900 || c > 1100 {
			t.Errorf("%s is first for %d of 3000 nodes, want about 1000 (all: %v)", a, c, counts)
		}
	}
}

// TestFailoverSpreads checks rendezvous ordering where it differs from a
// rotation of the list: when one of three replicas goes, its nodes spread
// evenly over the other two (each within 10% of even), and nobody else
// moves; when a fourth comes, it takes an even share and no node moves
// between the old three.
func TestFailoverSpreads(t *testing.T) {
	three := []string{"10.0.0.1:9640", "10.0.0.2:9640", "10.0.0.3:9640"}
	four := append(slices.Clone(three), "10.0.0.4:9640")
	lost := three[0]
	movedTo := map[string]int{}
	taken := 0
	const nodes = 6000
	for i := range nodes {
		name := fmt.Sprintf("node-%d", i)
		order := rendezvous(name, three)
		// Failover goes down the node's own order.
		if order[0] == lost {
			movedTo[order[1]]++
		}
		if first := rendezvous(name, four)[0]; first != order[0] {
			if first != four[3] {
				t.Fatalf("%s moved from %s to %s when %s was added", name, order[0], first, four[3])
			}
			taken++
		}
	}
	moved := movedTo[three[1]] + movedTo[three[2]]
	for _, a := range three[1:] {
		if c := movedTo[a]; c < moved/2*9/10 || c > moved/2*11/10 {
			t.Errorf("of the %d nodes of the lost replica, %d moved to %s, want about %d (all: %v)", moved, c, a, moved/2, movedTo)
		}
	}
	if taken < nodes/4*9/10 || taken > nodes/4*11/10 {
		t.Errorf("a fourth replica took %d of %d nodes, want about %d", taken, nodes, nodes/4)
	}
}

// TestBackoff checks the reconnect delay: full jitter over [0, delay], so
// that agents leaving one replica spread over the whole delay, doubling up
// to the maximum, and back to the minimum once a stream was established.
func TestBackoff(t *testing.T) {
	const lo, hi = 100 * time.Millisecond, 800 * time.Millisecond
	b := newBackoff(lo, hi)
	for range 10 {
		b.next()
	}
	early := 0
	for range 1000 {
		w := b.next()
		if w < 0 || w > hi {
			t.Fatalf("wait %v outside [0, %v]", w, hi)
		}
		if w < hi/4 {
			early++
		}
	}
	// Uniform over [0, 800 ms]: a quarter fall below 200 ms. Jitter over
	// [delay/2, delay] would put none there.
	if early < 150 {
		t.Errorf("%d of 1000 waits below %v, want about 250", early, hi/4)
	}
	b.reset()
	if w := b.next(); w > lo {
		t.Errorf("first wait after a reset %v, want at most %v", w, lo)
	}
}

// TestBackoffResetsOnceEstablished checks that a stream the control plane
// answered resets the backoff however briefly it lived: a second failover
// soon after the first is as quick as the first.
func TestBackoffResetsOnceEstablished(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	var mu sync.Mutex
	var connects []time.Time
	startOpts(t, &fakeApplier{held: proxytable.Empty()}, slog.New(slog.DiscardHandler), dial, func(o *Options) {
		// A minimum far below the maximum: without the reset, the fifth
		// reconnect would wait up to 16 times the minimum.
		o.BackoffMin, o.BackoffMax, o.SilenceTimeout = 20*time.Millisecond, 10*time.Second, time.Minute
		o.OnConnected = func(up bool) {
			if up {
				mu.Lock()
				connects = append(connects, time.Now())
				mu.Unlock()
			}
		}
	}, "cp")
	for range 8 {
		s := accept(t, fakes["cp"])
		recv(t, s) // hello
		// Established: a keepalive answered. Then the stream fails.
		if err := s.Send(&pb.SyncResponse{Kind: &pb.SyncResponse_Keepalive{Keepalive: &pb.Keepalive{}}}); err != nil {
			t.Fatal(err)
		}
		if m := recv(t, s); m.GetKeepalive() == nil {
			t.Fatalf("answer %v, want a keepalive", m)
		}
		fakes["cp"].end(t)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(connects); i++ {
		// Generous against a loaded machine, and still far below the
		// 320 ms to 5 s a doubling backoff would reach.
		if gap := connects[i].Sub(connects[i-1]); gap > 250*time.Millisecond {
			t.Errorf("reconnect %d took %v after an established stream, want about the 20 ms minimum", i, gap)
		}
	}
}

// TestFailback checks that an agent that failed over returns to its
// preferred replica once that one serves again, saying in its hello what
// it holds, so that nothing is resent.
func TestFailback(t *testing.T) {
	names := []string{"cp-0", "cp-1"}
	order := rendezvous("node-1", names)
	preferred, other := order[0], order[1]
	replicas := map[string]*lateListener{preferred: newLateListener(t), other: newLateListener(t)}
	both := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		return replicas[addr].dial(ctx)
	})
	fakeOther := replicas[other].serve()
	held := heldTable()
	startOpts(t, &fakeApplier{held: held}, slog.New(slog.DiscardHandler), both, func(o *Options) {
		o.SilenceTimeout, o.FailbackInterval = time.Minute, 20*time.Millisecond
	}, names...)

	s := accept(t, fakeOther)
	recv(t, s) // hello: the preferred replica is down
	f := replicas[preferred].serve()
	h := recv(t, accept(t, f)).GetHello()
	if h == nil || h.GetVersion() != held.Version || len(h.GetEntryHashes()) != len(held.Entries) {
		t.Fatalf("hello to the returned replica %v, want the held version %s and its hashes", h, held.Version)
	}
	select {
	case <-s.Context().Done():
	case <-time.After(waitFor):
		t.Error("the stream to the other replica stayed open after the failback")
	}
}

// lateListener is an in-memory replica that refuses connections until it
// serves, with a health service answering SERVING.
type lateListener struct {
	t      *testing.T
	l      *bufconn.Listener
	served atomic.Bool
}

func newLateListener(t *testing.T) *lateListener {
	t.Helper()
	return &lateListener{t: t, l: bufconn.Listen(1 << 20)}
}

func (l *lateListener) dial(ctx context.Context) (net.Conn, error) {
	if !l.served.Load() {
		return nil, errors.New("connection refused")
	}
	return l.l.DialContext(ctx)
}

// serve starts serving and returns the replica's fake control plane.
func (l *lateListener) serve() *fakeControlPlane {
	f := newFakeControlPlane()
	gs := grpc.NewServer()
	pb.RegisterTableServiceServer(gs, f)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(l.l) }()
	l.t.Cleanup(func() { close(f.done); gs.Stop() })
	l.served.Store(true)
	return f
}

// rawBytes are sent as they are by rawServerCodec.
type rawBytes []byte

// rawServerCodec lets a fake control plane send bytes that are not a
// SyncResponse.
type rawServerCodec struct{ encoding.CodecV2 }

func (c rawServerCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(rawBytes); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// TestGarbageIsNackedAndRulesKept checks that bytes from the control plane
// that are not a SyncResponse are NACKed (with the nonce they carry), that
// nothing is applied, and that the agent starts over on a new stream.
func TestGarbageIsNackedAndRulesKept(t *testing.T) {
	l := bufconn.Listen(1 << 20)
	f := newFakeControlPlane()
	gs := grpc.NewServer(grpc.ForceServerCodecV2(rawServerCodec{encoding.GetCodecV2("proto")}))
	pb.RegisterTableServiceServer(gs, f)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(func() { close(f.done); gs.Stop() })
	dial := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) })
	a := &fakeApplier{held: heldTable()}
	start(t, a, dial, "cp")

	s := accept(t, f)
	recv(t, s) // hello
	// A nonce, then a snapshot whose first field's length runs past the
	// end of the message.
	garbage := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "n7")
	garbage = protowire.AppendTag(garbage, 2, protowire.BytesType)
	garbage = protowire.AppendBytes(garbage, []byte{0x0a, 0x7f, 0x01})
	if err := s.SendMsg(rawBytes(garbage)); err != nil {
		t.Fatal(err)
	}
	n := recv(t, s).GetNack()
	if n == nil || n.GetNonce() != "n7" || !strings.Contains(n.GetError(), "undecodable") {
		t.Fatalf("answer %v, want a NACK of nonce n7 saying the response is undecodable", n)
	}
	// The agent half-closes after its NACK rather than cancelling the
	// stream, which could drop the NACK in the transport.
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the NACK the stream gave %v, want io.EOF (a half-close)", err)
	}
	f.end(t)
	if h := recv(t, accept(t, f)).GetHello(); h == nil || h.GetVersion() != heldTable().Version {
		t.Fatalf("new stream's first message %v, want a hello with the held version", h)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.applied) != 0 {
		t.Errorf("applied %v from garbage", a.applied)
	}
}

func TestTopLevelNonce(t *testing.T) {
	ok, err := proto.Marshal(&pb.SyncResponse{Nonce: "abc", Kind: &pb.SyncResponse_Keepalive{Keepalive: &pb.Keepalive{}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"whole message", ok, "abc"},
		{"cut short", ok[:len(ok)-1], "abc"},
		{"nonce cut short", ok[:3], ""},
		{"nothing", nil, ""},
		{"garbage", []byte{0xff, 0xff, 0xff}, ""},
	} {
		if got := topLevelNonce(tc.b); got != tc.want {
			t.Errorf("%s: nonce %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestHeadersEstablish checks that a control plane's headers, which it
// sends once it accepted the hello, count as an answer: a current agent
// gets no table and would otherwise wait for a keepalive to be told
// connected (its /healthz and its backoff depend on it).
func TestHeadersEstablish(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	up := make(chan bool, 4)
	startOpts(t, &fakeApplier{held: heldTable()}, slog.New(slog.DiscardHandler), dial, func(o *Options) {
		o.SilenceTimeout, o.OnConnected = time.Minute, func(b bool) { up <- b }
	}, "cp")
	s := accept(t, fakes["cp"])
	recv(t, s) // hello
	select {
	case b := <-up:
		t.Fatalf("told connected=%v before the control plane answered", b)
	case <-time.After(50 * time.Millisecond):
	}
	if err := s.SendHeader(nil); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-up:
		if !b {
			t.Fatal("told disconnected, want connected")
		}
	case <-time.After(waitFor):
		t.Fatal("headers did not count as an answer")
	}
	fakes["cp"].end(t)
	select {
	case b := <-up:
		if b {
			t.Fatal("told connected again, want disconnected")
		}
	case <-time.After(waitFor):
		t.Fatal("the stream's end was not told")
	}
}

// TestExpiredTokenReconnectsToSameReplica: a replica ends a stream it
// served with Unauthenticated when the token the stream opened with
// expires (the kubelet has rotated the file by then). The agent opens the
// next stream to the same replica with the new token, rather than moving
// every agent to its next address once an hour.
func TestExpiredTokenReconnectsToSameReplica(t *testing.T) {
	fakes, dial := listeners(t, "a", "b")
	up := make(chan bool, 4)
	startOpts(t, &fakeApplier{held: heldTable()}, slog.New(slog.DiscardHandler), dial, func(o *Options) {
		o.SilenceTimeout, o.OnConnected = time.Minute, func(b bool) { up <- b }
	}, "a", "b")
	var first string
	var s grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]
	select {
	case s = <-fakes["a"].streams:
		first = "a"
	case s = <-fakes["b"].streams:
		first = "b"
	case <-time.After(waitFor):
		t.Fatal("no stream opened")
	}
	recv(t, s)                                // hello
	if err := s.SendHeader(nil); err != nil { // the replica answered
		t.Fatal(err)
	}
	// The token expires long after the agent saw the answer.
	select {
	case b := <-up:
		if !b {
			t.Fatal("told disconnected, want connected")
		}
	case <-time.After(waitFor):
		t.Fatal("the agent never took the stream as answered")
	}
	select {
	case fakes[first].kickErr <- status.Error(codes.Unauthenticated, "unauthenticated"):
	case <-time.After(waitFor):
		t.Fatal("no stream to end")
	}
	other := map[string]string{"a": "b", "b": "a"}[first]
	select {
	case s2 := <-fakes[first].streams:
		if recv(t, s2).GetHello() == nil {
			t.Fatal("the new stream did not start with a hello")
		}
	case <-fakes[other].streams:
		t.Fatalf("the agent moved to %s after its token expired on %s, want %s again", other, first, first)
	case <-time.After(waitFor):
		t.Fatal("no new stream after the token expired")
	}
}

// TestDriftReported checks that the agent's drift repairs reach the
// control plane on a keepalive: at the start of a stream, and at each new
// repair.
func TestDriftReported(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	var mu sync.Mutex
	report := &pb.DriftReport{Repairs: []*pb.DriftRepair{{Dataplane: "nftables", IpFamily: "IPv4", Count: 1}}}
	changed := make(chan struct{})
	drift := func() (*pb.DriftReport, <-chan struct{}) {
		mu.Lock()
		defer mu.Unlock()
		return report, changed
	}
	startOpts(t, &fakeApplier{held: heldTable()}, slog.New(slog.DiscardHandler), dial, func(o *Options) { o.Drift = drift }, "cp")
	s := accept(t, fakes["cp"])
	if recv(t, s).GetHello() == nil {
		t.Fatal("the first message is not a hello")
	}
	m := recv(t, s)
	if m.GetKeepalive() == nil || m.GetDrift().GetRepairs()[0].GetCount() != 1 {
		t.Fatalf("after the hello: %v; want a keepalive with the drift report", m)
	}
	mu.Lock()
	report = &pb.DriftReport{Repairs: []*pb.DriftRepair{{Dataplane: "nftables", IpFamily: "IPv4", Count: 2}}}
	close(changed)
	changed = make(chan struct{})
	mu.Unlock()
	if m := recv(t, s); m.GetKeepalive() == nil || m.GetDrift().GetRepairs()[0].GetCount() != 2 {
		t.Fatalf("after a repair: %v; want a keepalive with the new report", m)
	}
}
