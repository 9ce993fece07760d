package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	protoiface "google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/limit"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// countingCodec counts the messages it decodes, by type.
type countingCodec struct {
	encoding.CodecV2
	mu      sync.Mutex
	decoded map[string]int
}

func (c *countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.mu.Lock()
	c.decoded[fmt.Sprintf("%T", v)]++
	c.mu.Unlock()
	return c.CodecV2.Unmarshal(data, v)
}

func (c *countingCodec) count(v any) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.decoded[fmt.Sprintf("%T", v)]
}

// padded is m with an unknown field of n bytes: what any client can send.
func padded[M protoiface.Message](m M, n int) M {
	b := protowire.AppendTag(nil, 1000, protowire.BytesType)
	b = protowire.AppendBytes(b, make([]byte, n))
	m.ProtoReflect().SetUnknown(b)
	return m
}

// TestOversizedRequestsRefusedUndecoded is issue 21's second attack: a
// client sends requests of megabytes to calls that take a few bytes,
// unary (decoded by grpc-go before any interceptor runs) and streaming.
// Each is refused with ResourceExhausted and never decoded, while
// requests of their real size are served, and an agent's hello larger
// than the small bound is still accepted.
func TestOversizedRequestsRefusedUndecoded(t *testing.T) {
	store := cluster(t)
	counting := &countingCodec{CodecV2: encoding.GetCodecV2(proto.Name), decoded: map[string]int{}}
	lis := bufconn.Listen(1 << 20)
	sc := newCodecOf(counting)
	gs := grpc.NewServer(append(grpcOptions(sc), grpc.MaxRecvMsgSize(8<<20))...)
	New(store, Options{}, slog.New(slog.DiscardHandler)).Register(gs)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	client, hc := pb.NewTableServiceClient(conn), healthpb.NewHealthClient(conn)
	const big = 4 << 20

	calls := []struct {
		name string
		msg  any // the request type, for the codec's count
		call func(pad int) error
	}{
		{"ListNodes", &pb.ListNodesRequest{}, func(pad int) error {
			_, err := client.ListNodes(ctx, padded(&pb.ListNodesRequest{}, pad))
			return err
		}},
		{"Health.Check", &healthpb.HealthCheckRequest{}, func(pad int) error {
			_, err := hc.Check(ctx, padded(&healthpb.HealthCheckRequest{}, pad))
			return err
		}},
		{"Health.Watch", &healthpb.HealthCheckRequest{}, func(pad int) error {
			w, err := hc.Watch(ctx, padded(&healthpb.HealthCheckRequest{}, pad))
			if err == nil {
				_, err = w.Recv()
			}
			return err
		}},
		{"WatchTable", &pb.WatchTableRequest{}, func(pad int) error {
			w, err := client.WatchTable(ctx, padded(&pb.WatchTableRequest{NodeName: "node-1"}, pad))
			if err == nil {
				_, err = w.Recv()
			}
			return err
		}},
	}
	for _, c := range calls {
		before := counting.count(c.msg)
		if err := c.call(big); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%s with a %d-byte request: %v, want ResourceExhausted", c.name, big, err)
		}
		if n := counting.count(c.msg) - before; n != 0 {
			t.Errorf("%s: the oversized request was decoded (%d times)", c.name, n)
		}
		if err := c.call(100); err != nil {
			t.Errorf("%s with a request of its real size: %v", c.name, err)
		}
		if n := counting.count(c.msg) - before; n != 1 {
			t.Errorf("%s: %d requests decoded, want the small one", c.name, n)
		}
	}

	// A hello lists every entry the agent holds: thousands of bytes.
	held := map[string]uint64{}
	for i := range 1000 {
		held[fmt.Sprintf("default/held-%04d", i)] = uint64(i)
	}
	a := connect(t, client, &pb.Hello{NodeName: "node-1", Version: "0000000000000001", EntryHashes: held})
	if r := a.recv(); r.GetSnapshot() == nil && r.GetDelta() == nil {
		t.Errorf("large hello answered with %v, want a table", r)
	}
	// Every mark was taken out by the interceptor that refused it.
	sc.oversized.Range(func(k, _ any) bool {
		t.Errorf("a refused %T is still marked", k)
		return true
	})
}

// TestMaxAgentsKeepsConnectedAgents runs the server as the control plane
// does, behind the limiter's tap and interceptors, with --max-agents 2:
// a third agent is refused with ResourceExhausted (and goes to another
// replica), while the two connected keep their streams and their
// changes; once one leaves, an agent is admitted again.
func TestMaxAgentsKeepsConnectedAgents(t *testing.T) {
	store := cluster(t)
	l := limit.New(limit.Config{MaxAgents: 2, PeerRate: -1}, slog.New(slog.DiscardHandler))
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(append(GRPCOptions(), grpc.InTapHandle(l.Tap), grpc.ChainStreamInterceptor(l.StreamInterceptor(), l.AgentInterceptor()))...)
	New(store, Options{}, slog.New(slog.DiscardHandler)).Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := pb.NewTableServiceClient(conn)

	var agents []*agent
	for _, node := range []string{"node-1", "node-2"} {
		a := connect(t, client, &pb.Hello{NodeName: node})
		a.ack(a.recv())
		agents = append(agents, a)
	}
	// A refused stream's status is read from Recv: Send may see only
	// io.EOF once the server has ended the stream.
	tryAgent := func(node string) error {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		stream, err := client.Sync(ctx)
		if err != nil {
			return err
		}
		_ = stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: node}}})
		_, err = stream.Recv()
		return err
	}
	if err := tryAgent("node-3"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third agent: %v, want ResourceExhausted", err)
	}

	// The two served keep their streams: a change reaches both.
	publish(t, store, map[string]*compute.Service{"c": service(t, "c", 1, 1)})
	for _, a := range agents {
		r := a.recv()
		if r.GetDelta() == nil {
			t.Fatalf("%s: %v, want a delta", a.node, r)
		}
		a.ack(r)
		eventually(t, a.node+" connected with the change acknowledged", func() bool {
			st := nodeStatus(t, client, a.node)
			return st.GetConnected() && st.GetAckedVersion() == a.version
		})
	}

	// One leaves: its slot is free again.
	agents[0].close()
	eventually(t, "a third agent admitted", func() bool {
		return status.Code(tryAgent("node-3")) != codes.ResourceExhausted
	})
}

// BenchmarkConnectLimits measures what admission costs an agent's
// connect: a connection, a Sync stream and its hello, until the first
// table arrives, with and without the limits' tap and interceptors.
func BenchmarkConnectLimits(b *testing.B) {
	for _, withLimits := range []bool{false, true} {
		b.Run(fmt.Sprintf("limits=%t", withLimits), func(b *testing.B) {
			store := cluster(b)
			lis := bufconn.Listen(1 << 20)
			opts := GRPCOptions()
			if withLimits {
				l := limit.New(limit.Config{PeerRate: -1}, slog.New(slog.DiscardHandler))
				opts = append(opts, grpc.InTapHandle(l.Tap), grpc.ChainStreamInterceptor(l.StreamInterceptor(), l.AgentInterceptor()))
			}
			gs := grpc.NewServer(opts...)
			New(store, Options{AdmissionRate: 1e9, AdmissionBurst: 1 << 20}, slog.New(slog.DiscardHandler)).Register(gs)
			go func() { _ = gs.Serve(lis) }()
			b.Cleanup(gs.Stop)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				conn, err := grpc.NewClient("passthrough:///bufconn",
					grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
					grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					b.Fatal(err)
				}
				a := connect(b, pb.NewTableServiceClient(conn), &pb.Hello{NodeName: "node-1"})
				a.recv()
				a.close()
				_ = conn.Close()
			}
		})
	}
}
