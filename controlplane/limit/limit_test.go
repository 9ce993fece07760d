package limit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/grpc/test/bufconn"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestPeerRate(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	// c and d share a /64, e is in the next one.
	c, d, e := netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::ffff:1"), netip.MustParseAddr("2001:db8:0:1::1")
	type step struct {
		advance time.Duration
		addr    netip.Addr
		want    bool
	}
	cases := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			"burst then refused",
			Config{PeerRate: 1, PeerBurst: 2},
			[]step{{0, a, true}, {0, a, true}, {0, a, false}},
		},
		{
			"other addresses keep their own bucket",
			Config{PeerRate: 1, PeerBurst: 1},
			[]step{{0, a, true}, {0, a, false}, {0, b, true}},
		},
		{
			"the bucket refills at the rate",
			Config{PeerRate: 2, PeerBurst: 1},
			[]step{{0, a, true}, {0, a, false}, {500 * time.Millisecond, a, true}, {0, a, false}},
		},
		{
			"each address of an IPv6 /64 has its own bucket",
			Config{PeerRate: 1, PeerBurst: 1},
			[]step{{0, c, true}, {0, c, false}, {0, d, true}, {0, e, true}},
		},
		{
			"a negative rate turns the limit off",
			Config{PeerRate: -1, PeerBurst: 1},
			[]step{{0, a, true}, {0, a, true}, {0, a, true}},
		},
		{
			"the least recently seen address is forgotten past MaxPeers",
			Config{PeerRate: 1, PeerBurst: 1, MaxPeers: 1},
			[]step{{0, a, true}, {0, b, true}, {0, a, true}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.cfg, discard())
			now := time.Now()
			l.now = func() time.Time { return now }
			for i, s := range tc.steps {
				now = now.Add(s.advance)
				if got := l.allowPeer(SourceOf(s.addr)); got != s.want {
					t.Errorf("step %d (%s): allowed %t, want %t", i, s.addr, got, s.want)
				}
			}
			if l.peers == nil {
				return
			}
			if n := l.peers.addrs.lru.Len(); n > l.cfg.MaxPeers || n != len(l.peers.addrs.m) {
				t.Errorf("%d buckets in the list and %d in the map, want equal and at most %d", n, len(l.peers.addrs.m), l.cfg.MaxPeers)
			}
		})
	}
}

// blockingServer's streams stay open until release is closed, so that
// they hold their slots.
type blockingServer struct {
	pb.UnimplementedTableServiceServer
	release chan struct{}
	open    atomic.Int64
}

func (s *blockingServer) Sync(stream grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) error {
	return s.hold(stream.Context())
}

func (s *blockingServer) WatchTable(_ *pb.WatchTableRequest, stream grpc.ServerStreamingServer[pb.WatchTableResponse]) error {
	return s.hold(stream.Context())
}

func (s *blockingServer) ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	return &pb.ListNodesResponse{}, nil
}

func (s *blockingServer) hold(ctx context.Context) error {
	s.open.Add(1)
	defer s.open.Add(-1)
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil
}

func serve(t *testing.T, l *Limiter, srv *blockingServer) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(
		grpc.InTapHandle(l.Tap),
		grpc.ChainStreamInterceptor(l.StreamInterceptor(), l.AgentInterceptor()))
	pb.RegisterTableServiceServer(gs, srv)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	reflection.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// openStream starts rpc and returns the code it ends with, or OK if it
// is still open (admitted) once the server holds want streams.
func openStream(ctx context.Context, t *testing.T, cc *grpc.ClientConn, srv *blockingServer, rpc string, want int64) codes.Code {
	t.Helper()
	c := pb.NewTableServiceClient(cc)
	recv := make(chan error, 1)
	switch rpc {
	case "Sync":
		s, err := c.Sync(ctx)
		if err != nil {
			return status.Code(err)
		}
		go func() { _, err := s.Recv(); recv <- err }()
	case "WatchTable":
		s, err := c.WatchTable(ctx, &pb.WatchTableRequest{NodeName: "n"})
		if err != nil {
			return status.Code(err)
		}
		go func() { _, err := s.Recv(); recv <- err }()
	}
	for {
		select {
		case err := <-recv:
			if errors.Is(err, io.EOF) {
				return codes.OK
			}
			return status.Code(err)
		default:
		}
		if srv.open.Load() >= want {
			return codes.OK
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCaps: Sync streams past MaxAgents and TableService streams past
// MaxStreams are refused with ResourceExhausted, and a slot freed is
// reusable.
func TestCaps(t *testing.T) {
	srv := &blockingServer{release: make(chan struct{})}
	l := New(Config{MaxAgents: 2, MaxStreams: 3, PeerRate: -1}, discard())
	cc := serve(t, l, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []struct {
		name string
		rpc  string
		open int64 // streams open once admitted
		want codes.Code
	}{
		{"first agent", "Sync", 1, codes.OK},
		{"second agent", "Sync", 2, codes.OK},
		{"agent past --max-agents", "Sync", 3, codes.ResourceExhausted},
		{"a watch fits under --max-streams", "WatchTable", 3, codes.OK},
		{"a watch past --max-streams", "WatchTable", 4, codes.ResourceExhausted},
	}
	for _, s := range steps {
		if got := openStream(ctx, t, cc, srv, s.rpc, s.open); got != s.want {
			t.Errorf("%s: %s, want %s", s.name, got, s.want)
		}
	}
	close(srv.release)
	waitFor(t, "streams to end", func() bool { return l.streams.Load() == 0 && l.agents.Load() == 0 })
	if _, err := pb.NewTableServiceClient(cc).ListNodes(ctx, &pb.ListNodesRequest{}); err != nil {
		t.Errorf("call after the streams ended: %v", err)
	}
}

// TestCallRate: calls past a source's burst are refused with
// ResourceExhausted, health checks included: they cost little to answer,
// but a flood of them is a flood.
func TestCallRate(t *testing.T) {
	srv := &blockingServer{release: make(chan struct{})}
	l := New(Config{PeerRate: 0.001, PeerBurst: 2}, discard())
	cc := serve(t, l, srv)
	ctx := context.Background()
	c := pb.NewTableServiceClient(cc)
	want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted}
	for i, w := range want {
		if _, err := c.ListNodes(ctx, &pb.ListNodesRequest{}); status.Code(err) != w {
			t.Errorf("call %d: %v, want %s", i, err, w)
		}
	}
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("health check past the rate: %v, want ResourceExhausted", err)
	}
}

// TestListener: connections past MaxConnections, or past a peer's rate,
// are closed as accepted; a closed connection frees its slot once.
func TestListener(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		// wantOpen says, for each connection dialled in turn (none closed),
		// whether the server keeps it.
		wantOpen []bool
		// afterClose: whether a connection dialled once the first is
		// closed is kept.
		afterClose bool
	}{
		{"connection cap", Config{MaxConnections: 2, PeerRate: -1}, []bool{true, true, false}, true},
		{"peer rate", Config{MaxConnections: 10, PeerRate: 0.001, PeerBurst: 2}, []bool{true, true, false}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := New(tc.cfg, discard())
			ln := l.Listener(raw)
			t.Cleanup(func() { _ = ln.Close() })
			accepted := make(chan net.Conn, 10)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					accepted <- c
				}
			}()
			var servers []net.Conn // the server's side of kept connections
			for i, want := range tc.wantOpen {
				srv := dial(t, raw.Addr().String(), accepted)
				if got := srv != nil; got != want {
					t.Errorf("connection %d kept %t, want %t", i, got, want)
				}
				if srv != nil {
					servers = append(servers, srv)
				}
			}
			// The server closes its side of the first connection, twice:
			// the slot must come back once.
			_ = servers[0].Close()
			_ = servers[0].Close()
			if got := dial(t, raw.Addr().String(), accepted) != nil; got != tc.afterClose {
				t.Errorf("connection after a close kept %t, want %t", got, tc.afterClose)
			}
			open := int64(len(servers) - 1)
			if tc.afterClose {
				open++
			}
			if n := l.conns.Load(); n != open {
				t.Errorf("%d connections counted, want the %d open", n, open)
			}
		})
	}
}

// dial connects to addr and returns the server's side of the connection
// if the listener accepted it, or nil if it closed it (the client reads
// EOF).
func dial(t *testing.T, addr string, accepted <-chan net.Conn) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	eof := make(chan struct{})
	go func() {
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			close(eof)
		}
	}()
	select {
	case s := <-accepted:
		t.Cleanup(func() { _ = s.Close() })
		return s
	case <-eof:
		return nil
	case <-time.After(10 * time.Second):
		t.Fatal("connection neither accepted nor closed")
		return nil
	}
}

// TestStrangersCannotFillAgentsBudget is issue 21's first attack: one
// source opens health watches and reflection streams, which need no
// token, until the replica refuses them. They fill only the unverified
// budget, whose refusals are ResourceExhausted, and an agent's Sync
// stream is still admitted.
func TestStrangersCannotFillAgentsBudget(t *testing.T) {
	srv := &blockingServer{release: make(chan struct{})}
	defer close(srv.release)
	const maxStreams = 4
	l := New(Config{MaxStreams: maxStreams, MaxUnverified: 3, PeerRate: -1}, discard())
	cc := serve(t, l, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Twice the agents' budget of strangers' streams, half of each kind.
	var refused int
	for i := range 2 * maxStreams {
		var err error
		if i%2 == 0 {
			var w grpc.ServerStreamingClient[healthpb.HealthCheckResponse]
			if w, err = healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
				_, err = w.Recv() // the first status, or the refusal
			}
		} else {
			var r grpc.BidiStreamingClient[reflectionpb.ServerReflectionRequest, reflectionpb.ServerReflectionResponse]
			if r, err = reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx); err == nil {
				// A stream the server refused makes Send fail with io.EOF;
				// gRPC gives its status to Recv.
				if err = r.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err == nil || errors.Is(err, io.EOF) {
					_, err = r.Recv()
				}
			}
		}
		switch status.Code(err) {
		case codes.OK:
		case codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("stranger's stream %d: %v, want OK or ResourceExhausted", i, err)
		}
	}
	if want := 2*maxStreams - 3; refused != want {
		t.Errorf("%d strangers' streams refused, want %d (all past the unverified cap)", refused, want)
	}
	if got := openStream(ctx, t, cc, srv, "Sync", 1); got != codes.OK {
		t.Errorf("agent's Sync stream with strangers' streams open: %s, want admitted", got)
	}
}

// TestIdleTimeout: an unverified stream that sends nothing ends after the
// idle timeout, and gives its slot back.
func TestIdleTimeout(t *testing.T) {
	srv := &blockingServer{release: make(chan struct{})}
	defer close(srv.release)
	l := New(Config{MaxUnverified: 1, IdleTimeout: 100 * time.Millisecond, PeerRate: -1}, discard())
	cc := serve(t, l, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("first status: %v", err)
	}
	for {
		if _, err = w.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) == codes.OK || errors.Is(err, io.EOF) {
		t.Errorf("idle watch ended with %v, want an error", err)
	}
	waitFor(t, "the slot to come back", func() bool { return l.unverified.Load() == 0 })
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check once the idle watch ended: %v", err)
	}
}

// BenchmarkTap measures the admission of one call in grpc-go's tap, with
// the per-source rate on: an agent's Sync stream, and an unverified call
// with its idle timer; "none" is the contexts each iteration makes, which
// grpc-go makes for every stream anyway. Each iteration's call ends at
// once.
func BenchmarkTap(b *testing.B) {
	l := New(Config{PeerRate: 1e9, PeerBurst: 1 << 30, MaxUnverified: 1 << 30, MaxUnverifiedPerSource: 1 << 30}, discard())
	p := &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 40000}}
	for _, method := range []string{"none", pb.TableService_Sync_FullMethodName, healthpb.Health_Check_FullMethodName} {
		b.Run(strings.ReplaceAll(method, "/", "_"), func(b *testing.B) {
			info := &tap.Info{FullMethodName: method}
			b.ReportAllocs()
			for range b.N {
				ctx, cancel := context.WithCancel(peer.NewContext(context.Background(), p))
				if method != "none" {
					if _, err := l.Tap(ctx, info); err != nil {
						b.Fatal(err)
					}
				}
				cancel()
			}
		})
	}
}

// TestBucketsRefund: a token taken and given back is there again at
// once, later as well, and once only.
func TestBucketsRefund(t *testing.T) {
	src := SourceOf(netip.MustParseAddr("10.0.0.1"))
	now := time.Now()
	b := NewBuckets(0.001, 2, 10)
	refund, ok := b.Take(src, now)
	if !ok {
		t.Fatal("first token refused")
	}
	now = now.Add(time.Second) // long after the take, as a review ends
	refund()
	refund()
	for i, want := range []bool{true, true, false} {
		if _, got := b.Take(src, now); got != want {
			t.Errorf("take %d after the refund: %t, want %t", i, got, want)
		}
	}
}

// TestSourceBuckets: an IPv6 /64 as a whole gets share times an
// address's allowance; a take its network refuses costs the address
// nothing; a refund gives both back. IPv4 addresses have no network
// bucket.
func TestSourceBuckets(t *testing.T) {
	now := time.Now()
	b := NewSourceBuckets(0.001, 1, 2, 10)
	a, c, d := SourceOf(netip.MustParseAddr("fd00::1")), SourceOf(netip.MustParseAddr("fd00::2")), SourceOf(netip.MustParseAddr("fd00::3"))
	refundA, _, ok := b.Take(a, now)
	if !ok {
		t.Fatal("first address refused")
	}
	if _, _, ok := b.Take(c, now); !ok {
		t.Fatal("second address refused")
	}
	for range 2 {
		if _, limited, ok := b.Take(d, now); ok || limited != NetworkOf(d) {
			t.Errorf("third address: %t, limited %s; want refused by its /64", ok, limited)
		}
	}
	if _, limited, ok := b.Take(a, now); ok || limited != a {
		t.Errorf("first address again: %t, limited %s; want refused by its own bucket", ok, limited)
	}
	refundA()
	// The network's token back, and d's own never spent.
	if _, _, ok := b.Take(d, now); !ok {
		t.Error("third address refused after a refund")
	}
	v4 := SourceOf(netip.MustParseAddr("10.0.0.1"))
	if _, _, ok := b.Take(v4, now); !ok {
		t.Fatal("IPv4 address refused")
	}
	if _, limited, ok := b.Take(v4, now); ok || limited != v4 {
		t.Errorf("IPv4 address again: %t, limited %s; want refused by its own bucket", ok, limited)
	}
}

// TestOneSourceCannotTakeUnverifiedBudget: a pod's health watches stop at
// its per-source share, and another address's health check and a
// ListNodes are still served.
func TestOneSourceCannotTakeUnverifiedBudget(t *testing.T) {
	srv := &blockingServer{release: make(chan struct{})}
	defer close(srv.release)
	l := New(Config{MaxUnverified: 6, MaxUnverifiedPerSource: 2, PeerRate: -1}, discard())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.InTapHandle(l.Tap), grpc.ChainStreamInterceptor(l.StreamInterceptor(), l.AgentInterceptor()))
	pb.RegisterTableServiceServer(gs, srv)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	// from dials the server from local address ip (any of 127/8 is ours).
	from := func(ip string) *grpc.ClientConn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	attacker := healthpb.NewHealthClient(from("127.0.0.2"))
	// As many watches as the whole budget: only its share is admitted.
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted, codes.ResourceExhausted, codes.ResourceExhausted, codes.ResourceExhausted} {
		w, err := attacker.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if status.Code(err) != want {
			t.Errorf("attacker's watch %d: %v, want %s", i, err, want)
		}
	}
	operator := from("127.0.0.3")
	if _, err := healthpb.NewHealthClient(operator).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another address's health check: %v", err)
	}
	if _, err := pb.NewTableServiceClient(operator).ListNodes(ctx, &pb.ListNodesRequest{}); err != nil {
		t.Errorf("another address's ListNodes: %v", err)
	}
}

// TestNetworkRate: an attacker rotating through the addresses of its
// IPv6 /64, one call each, is held to NetworkShare addresses' burst,
// while the next /64 is not.
func TestNetworkRate(t *testing.T) {
	l := New(Config{PeerRate: 1, PeerBurst: 1}, discard())
	now := time.Now()
	l.now = func() time.Time { return now }
	var allowed int
	for i := range 3 * NetworkShare {
		addr := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
		if l.allowPeer(SourceOf(addr)) {
			allowed++
		}
	}
	if allowed != NetworkShare {
		t.Errorf("%d calls from distinct addresses of one /64 allowed, want %d", allowed, NetworkShare)
	}
	if !l.allowPeer(SourceOf(netip.MustParseAddr("2001:db8:0:1::1"))) {
		t.Error("the next /64 is refused")
	}
}
