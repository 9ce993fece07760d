package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/wire"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeRequest checks that decodeRequest decodes every request as
// proto does, with a hello's entry hashes apart.
func TestDecodeRequest(t *testing.T) {
	hello := &pb.Hello{
		NodeName: "node-1", Version: "0123456789abcdef", NodeHash: 7,
		Capabilities: &pb.Capabilities{Deltas: true, Dataplane: "nftables"},
		EntryHashes:  map[string]uint64{"default/a": 1, "default/b": 2, "kube-system/dns": 3},
	}
	helloReq := &pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: hello}}
	ack := &pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: "0123456789abcdef", Nonce: "3"}}}
	cases := []struct {
		name        string
		raw         []byte
		want        *pb.SyncRequest // with entry hashes, as proto decodes it
		wantErr     bool
		wantEntries bool // entry hashes split off, to decode later
	}{
		{name: "hello", raw: mustMarshal(t, helloReq), want: helloReq, wantEntries: true},
		{
			name: "hello holding nothing", raw: mustMarshal(t, &pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: "n"}}}),
			want: &pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: "n"}}},
		},
		{name: "ack", raw: mustMarshal(t, ack), want: ack},
		{
			name: "keepalive", raw: mustMarshal(t, &pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}}),
			want: &pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}},
		},
		{name: "empty", raw: nil, want: &pb.SyncRequest{}},
		{name: "hello with its entries apart", raw: protowire.AppendBytes(protowire.AppendTag(nil, wire.SyncRequestHello, protowire.BytesType),
			append(append(mustMarshal(t, &pb.Hello{NodeName: "n", EntryHashes: map[string]uint64{"default/a": 1}}),
				mustMarshal(t, &pb.Hello{Version: "0123456789abcdef"})...),
				mustMarshal(t, &pb.Hello{EntryHashes: map[string]uint64{"default/b": 2}})...)), wantEntries: true},
		{name: "hello twice, merged as proto merges", raw: append(mustMarshal(t, helloReq), mustMarshal(t, &pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeHash: 9}}})...)},
		{name: "hello and ack", raw: append(mustMarshal(t, helloReq), mustMarshal(t, ack)...), wantErr: true},
		{name: "garbage", raw: []byte{0xff, 0xff, 0xff, 0xff, 0x0f}, wantErr: true},
		{name: "truncated hello", raw: mustMarshal(t, helloReq)[:20], wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, entries, err := decodeRequest(tc.raw)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("decoded %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == nil {
				want = &pb.SyncRequest{}
				if err := proto.Unmarshal(tc.raw, want); err != nil {
					t.Fatal(err)
				}
			}
			if (len(entries) > 0) != tc.wantEntries {
				t.Fatalf("entries split off: %d bytes, want some: %v", len(entries), tc.wantEntries)
			}
			if len(entries) > 0 {
				if len(got.GetHello().GetEntryHashes()) != 0 {
					t.Errorf("hello decoded with its entry hashes: %v", got.GetHello().GetEntryHashes())
				}
				e, err := lazyEntries(entries)()
				if err != nil {
					t.Fatal(err)
				}
				got = proto.CloneOf(got)
				got.GetHello().EntryHashes = e
			}
			if !proto.Equal(got, want) {
				t.Errorf("decoded %v, want %v", got, want)
			}
		})
	}
}

// TestCurrentAgentsHashesStayEncoded checks that the entry hashes of an
// agent whose version is current are never decoded: a hello whose hashes
// are not even valid protobuf is served as current (it would be refused as
// undecodable were they decoded), while the same hashes with a stale
// version are decoded and refused.
func TestCurrentAgentsHashesStayEncoded(t *testing.T) {
	store := cluster(t)
	_, conn, _ := newTestServer(t, store, Options{})
	w := store.Current()
	current := compute.FormatVersion(w.Version(w.Node("node-1")))
	badEntries := protowire.AppendTag(nil, wire.HelloEntryHashes, protowire.BytesType)
	badEntries = protowire.AppendBytes(badEntries, []byte{0x11, 0x01}) // a fixed64 cut short
	hello := func(version string) []byte {
		h := mustMarshal(t, &pb.Hello{NodeName: "node-1", Version: version, NodeHash: w.Node("node-1").Hash})
		return protowire.AppendBytes(protowire.AppendTag(nil, wire.SyncRequestHello, protowire.BytesType), append(h, badEntries...))
	}
	open := func(raw []byte) grpc.ClientStream {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, pb.TableService_Sync_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.SendMsg(raw); err != nil {
			t.Fatal(err)
		}
		return s
	}

	open(hello(current))
	eventually(t, "the current agent connected", func() bool {
		st := nodeStatus(t, pb.NewTableServiceClient(conn), "node-1")
		return st.GetConnected() && st.GetAckedVersion() == current
	})
	stale := open(hello("0123456789abcdef"))
	if err := stale.RecvMsg(new([]byte)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stale agent with undecodable hashes: %v, want InvalidArgument", err)
	}
}

// countingStream counts the messages a handler receives.
type countingStream struct {
	grpc.ServerStream
	n *atomic.Int64
}

func (s countingStream) RecvMsg(m any) error {
	s.n.Add(1)
	return s.ServerStream.RecvMsg(m)
}

// TestHellosWaitForTheFirstWorld checks that a replica still syncing its
// informers reads no hello: agents that reconnect to it at once would
// otherwise each have their hello, a hash per Service, held in memory
// until the first world exists.
func TestHellosWaitForTheFirstWorld(t *testing.T) {
	store := table.NewStore(100)
	var received atomic.Int64
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(append(GRPCOptions(), grpc.StreamInterceptor(
		func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			return handler(srv, countingStream{ss, &received})
		}))...)
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
	for i := range 3 {
		agents = append(agents, connect(t, client, &pb.Hello{NodeName: fmt.Sprintf("node-%d", i), EntryHashes: map[string]uint64{"default/a": 1}}))
	}
	// The hellos are on the wire; give the handlers a moment to (wrongly)
	// read them.
	time.Sleep(200 * time.Millisecond)
	if n := received.Load(); n != 0 {
		t.Fatalf("%d messages read before the first world, want none", n)
	}
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 1, 1)})
	for _, a := range agents {
		if r := a.recv(); r.GetSnapshot() == nil {
			t.Fatalf("%s got %v after the first world, want a snapshot", a.node, r)
		}
	}
}

// TestHelloSlotsBoundHellos checks that streams between admission and
// their cursor are bounded: with every slot held by a stream that has not
// said hello, a new agent waits, and is served once a slot frees.
func TestHelloSlotsBoundHellos(t *testing.T) {
	store := cluster(t)
	srv := New(store, Options{AdmissionRate: 1e6, AdmissionBurst: 1e6}, slog.New(slog.DiscardHandler))
	client, _, _, _ := serve(t, srv)
	var silent []context.CancelFunc
	for range maxHellos {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		if _, err := client.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		silent = append(silent, cancel)
	}
	eventually(t, "every hello slot held", func() bool { return len(srv.helloSlots) == maxHellos })
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	got := make(chan *pb.SyncResponse, 1)
	go func() {
		r, err := a.stream.Recv()
		if err == nil {
			got <- r
		}
		close(got)
	}()
	select {
	case r := <-got:
		t.Fatalf("agent served (%v) while every hello slot was held", r)
	case <-time.After(300 * time.Millisecond):
	}
	silent[0]()
	select {
	case r := <-got:
		if r.GetSnapshot() == nil {
			t.Fatalf("agent got %v once a slot freed, want a snapshot", r)
		}
	case <-time.After(waitFor):
		t.Fatal("agent not served after a hello slot freed")
	}
}
