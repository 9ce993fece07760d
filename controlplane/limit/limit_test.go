package limit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestPeerRate(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
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
				if got := l.allowPeer(s.addr); got != s.want {
					t.Errorf("step %d (%s): allowed %t, want %t", i, s.addr, got, s.want)
				}
			}
			if n := l.lru.Len(); n > l.cfg.MaxPeers || n != len(l.peers) {
				t.Errorf("%d buckets in the list and %d in the map, want equal and at most %d", n, len(l.peers), l.cfg.MaxPeers)
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
		grpc.ChainUnaryInterceptor(l.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(l.StreamInterceptor(), l.AgentInterceptor()))
	pb.RegisterTableServiceServer(gs, srv)
	healthpb.RegisterHealthServer(gs, health.NewServer())
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

// TestCaps: Sync streams past MaxAgents and streams of any kind past
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
	if _, err := pb.NewTableServiceClient(cc).ListNodes(ctx, &pb.ListNodesRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("unary call past --max-streams: %v, want ResourceExhausted", err)
	}
	close(srv.release)
	waitFor(t, "streams to end", func() bool { return l.streams.Load() == 0 && l.agents.Load() == 0 })
	if _, err := pb.NewTableServiceClient(cc).ListNodes(ctx, &pb.ListNodesRequest{}); err != nil {
		t.Errorf("call after the streams ended: %v", err)
	}
}

// TestCallRate: calls past a peer's burst are refused with
// ResourceExhausted, health checks aside.
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
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check past the rate: %v", err)
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
