package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// cluster publishes services a and b and returns the store.
func cluster(t testing.TB) *table.Store {
	t.Helper()
	store := table.NewStore(100)
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 1), "b": service(t, "b", 3, 1)})
	return store
}

func wantVersion(t *testing.T, store *table.Store, node string) string {
	t.Helper()
	w := store.Current()
	return compute.FormatVersion(w.Version(w.Node(node)))
}

func TestHelloGetsSnapshot(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	r := a.recv()
	snap := r.GetSnapshot()
	if snap == nil {
		t.Fatalf("want a snapshot, got %v", r)
	}
	if got := len(snap.GetEntries()); got != 2 {
		t.Errorf("snapshot has %d entries, want 2", got)
	}
	if snap.GetNode().GetName() != "node-1" {
		t.Errorf("snapshot node = %q, want node-1", snap.GetNode().GetName())
	}
	if want := wantVersion(t, store, "node-1"); snap.GetVersion() != want {
		t.Errorf("snapshot version = %s, want %s", snap.GetVersion(), want)
	}
	a.ack(r)
	eventually(t, "ListNodes to show the ACK", func() bool {
		st := nodeStatus(t, client, "node-1")
		return st.GetConnected() && st.GetAckedVersion() == snap.GetVersion() && st.GetSentNonce() == r.GetNonce()
	})
}

func TestChangeGivesDelta(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	first := a.recv()
	a.ack(first)

	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	r := a.recv()
	d := r.GetDelta()
	if d == nil {
		t.Fatalf("want a delta, got %v", r)
	}
	if d.GetBaseVersion() != first.GetSnapshot().GetVersion() {
		t.Errorf("delta base = %s, want the acked %s", d.GetBaseVersion(), first.GetSnapshot().GetVersion())
	}
	if up, rm := keys(d); !slices.Equal(up, []string{"default/a"}) || len(rm) != 0 {
		t.Errorf("delta upserts %v removals %v, want just default/a", up, rm)
	}
	a.ack(r)
	if want := wantVersion(t, store, "node-1"); a.version != want {
		t.Errorf("agent holds %s, want %s", a.version, want)
	}
}

func TestReconnectWhenCurrentGetsNothing(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.ack(a.recv())
	a.close()

	// The same agent reconnects, as to a restarted or another replica.
	b := connect(t, client, a.hello())
	b.entries, b.version, b.nodeHash = a.entries, a.version, a.nodeHash
	// The first response it gets must be the delta for a later change:
	// had the hello been answered with a table, this would be it instead.
	publish(t, store, map[string]*compute.Service{"b": service(t, "b", 3, 2)})
	r := b.recv()
	if d := r.GetDelta(); d == nil || d.GetBaseVersion() != a.version || len(d.GetUpserts()) != 1 {
		t.Fatalf("first response after a current reconnect = %v; want only the later one-entry delta from %s", r, a.version)
	}
	eventually(t, "ListNodes to show the held version as acked", func() bool {
		return nodeStatus(t, client, "node-1").GetSentNonce() == r.GetNonce()
	})
}

func TestReconnectWithOlderTableGetsDifference(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.ack(a.recv())
	a.close()

	// While the agent is away: a changes, b goes, c arrives.
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 3), "b": nil, "c": service(t, "c", 1, 1)})

	// A fresh server, as after a control plane restart: it never saw a.
	client2, _, _ := newTestServer(t, store, Options{})
	b := connect(t, client2, a.hello())
	b.entries, b.version, b.nodeHash = a.entries, a.version, a.nodeHash
	r := b.recv()
	d := r.GetDelta()
	if d == nil {
		t.Fatalf("want a delta, got %v", r)
	}
	up, rm := keys(d)
	if !slices.Equal(up, []string{"default/a", "default/c"}) || !slices.Equal(rm, []string{"default/b"}) {
		t.Errorf("delta upserts %v removals %v, want [default/a default/c] and [default/b]", up, rm)
	}
	b.ack(r)
	if want := wantVersion(t, store, "node-1"); b.version != want {
		t.Errorf("agent holds %s, want %s", b.version, want)
	}
}

func TestNackedVersionIsNotResent(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.ack(a.recv())
	held := a.version

	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	rejected := a.recv()
	a.nack(rejected, "kernel said no")
	eventually(t, "ListNodes to show the NACK", func() bool {
		st := nodeStatus(t, client, "node-1")
		return st.GetNackedVersion() == rejected.GetDelta().GetVersion() && st.GetNackError() != ""
	})

	// The next response must cover a new change, from the version the
	// agent still holds, and must not be the rejected one.
	publish(t, store, map[string]*compute.Service{"b": service(t, "b", 3, 2)})
	r := a.recv()
	d := r.GetDelta()
	if d == nil || d.GetBaseVersion() != held || d.GetVersion() == rejected.GetDelta().GetVersion() {
		t.Fatalf("after a NACK got %v; want a delta from %s to a new version", r, held)
	}
	if up, _ := keys(d); !slices.Equal(up, []string{"default/a", "default/b"}) {
		t.Errorf("delta upserts %v, want both the rejected change and the new one", up)
	}
	a.ack(r)
}

func TestStalledAgentDoesNotDelayOthers(t *testing.T) {
	store := table.NewStore(100)
	publish(t, store, manyServices(t, 400, 20, first))
	client, _, dial := newTestServer(t, store, Options{
		WriteTimeout: 300 * time.Millisecond, KeepaliveInterval: 50 * time.Millisecond,
	})

	// The stalled agent says hello and never reads. A fixed window (which
	// turns off BDP window growth) keeps most of its snapshot unwritten,
	// so the next write to it, a keepalive, cannot complete.
	stalledClient := dial(grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	stalled := connect(t, stalledClient, &pb.Hello{NodeName: "stalled"})
	fast := connect(t, client, &pb.Hello{NodeName: "fast"})
	fast.ack(fast.recv())
	for gen := 2; gen < 5; gen++ {
		publish(t, store, map[string]*compute.Service{"svc-000": service(t, "svc-000", 20, gen)})
		r := fast.recv()
		if r.GetDelta() == nil {
			t.Fatalf("fast agent got %v, want a delta", r)
		}
		fast.ack(r)
	}
	eventually(t, "the stalled agent to be cut off by the write deadline", func() bool {
		return !nodeStatus(t, client, "stalled").GetConnected()
	})
	stalled.close()
}

// rawCodec sends bytes as they are, to put garbage on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }

var _ encoding.CodecV2 = rawCodec{}

func TestMalformedMessagesCloseOnlyThatStream(t *testing.T) {
	store := cluster(t)
	client, conn, _ := newTestServer(t, store, Options{})
	good := connect(t, client, &pb.Hello{NodeName: "good"})
	good.ack(good.recv())

	cases := []struct {
		name  string
		first func(t *testing.T) error
	}{
		{"garbage bytes", func(t *testing.T) error {
			t.Helper()
			desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
			s, err := conn.NewStream(context.Background(), desc, pb.TableService_Sync_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SendMsg([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}); err != nil {
				t.Fatal(err)
			}
			return s.RecvMsg(new([]byte))
		}},
		{"ack before hello", func(t *testing.T) error {
			t.Helper()
			s, _ := client.Sync(context.Background())
			_ = s.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: "0000000000000000", Nonce: "1"}}})
			_, err := s.Recv()
			return err
		}},
		{"bad node name", func(t *testing.T) error {
			t.Helper()
			s, _ := client.Sync(context.Background())
			_ = s.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: "Not A Node!"}}})
			_, err := s.Recv()
			return err
		}},
		{"bad held version", func(t *testing.T) error {
			t.Helper()
			s, _ := client.Sync(context.Background())
			_ = s.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: "n", Version: "xyz"}}})
			_, err := s.Recv()
			return err
		}},
		{"ack with a wrong nonce", func(t *testing.T) error {
			t.Helper()
			a := connect(t, client, &pb.Hello{NodeName: "wrong-nonce"})
			r := a.recv()
			a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: r.GetSnapshot().GetVersion(), Nonce: "999"}}})
			return a.recvErr()
		}},
		{"ack with the right nonce and a wrong version", func(t *testing.T) error {
			t.Helper()
			a := connect(t, client, &pb.Hello{NodeName: "wrong-version"})
			r := a.recv()
			a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: "0123456789abcdef", Nonce: r.GetNonce()}}})
			return a.recvErr()
		}},
		{"empty request", func(t *testing.T) error {
			t.Helper()
			a := connect(t, client, &pb.Hello{NodeName: "empty"})
			a.ack(a.recv())
			a.send(&pb.SyncRequest{})
			return a.recvErr()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.first(t); status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v, want InvalidArgument", err)
			}
		})
	}

	// The good agent's stream is untouched.
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 9)})
	if r := good.recv(); r.GetDelta() == nil {
		t.Fatalf("good agent got %v, want a delta", r)
	}
}

func TestSilentAgentTimesOut(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{KeepaliveInterval: 20 * time.Millisecond, KeepaliveTimeout: 100 * time.Millisecond})
	a := connect(t, client, &pb.Hello{NodeName: "silent"})
	// It never answers anything, keepalives included.
	if err := a.recvErr(); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("silent agent's stream ended with %v, want DeadlineExceeded", err)
	}
}

func TestNewerStreamReplacesOlder(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	old := connect(t, client, &pb.Hello{NodeName: "node-1"})
	old.ack(old.recv())
	fresh := connect(t, client, old.hello())
	if err := old.recvErr(); status.Code(err) != codes.Aborted {
		t.Errorf("replaced stream ended with %v, want Aborted", err)
	}
	fresh.entries, fresh.version, fresh.nodeHash = old.entries, old.version, old.nodeHash
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 5)})
	fresh.ack(fresh.recv())
	if st := nodeStatus(t, client, "node-1"); !st.GetConnected() {
		t.Errorf("node-1 not connected after the newer stream took over: %v", st)
	}
}

func TestNothingServedBeforeSync(t *testing.T) {
	store := table.NewStore(100)
	client, _, _ := newTestServer(t, store, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := client.ListNodes(ctx, &pb.ListNodesRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("ListNodes before the first world: %v, want DeadlineExceeded", err)
	}
	a := connect(t, client, &pb.Hello{NodeName: "early"})
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 1, 1)})
	if r := a.recv(); len(r.GetSnapshot().GetEntries()) != 1 {
		t.Fatalf("after sync got %v, want a one-entry snapshot", r)
	}
}

func TestWatchTable(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := client.WatchTable(ctx, &pb.WatchTableRequest{NodeName: "node-7"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil || len(first.GetSnapshot().GetEntries()) != 2 {
		t.Fatalf("first watch message = %v, %v; want a two-entry snapshot", first, err)
	}
	publish(t, store, map[string]*compute.Service{"b": nil})
	next, err := w.Recv()
	if err != nil || !slices.Equal(next.GetDelta().GetRemovals(), []string{"default/b"}) {
		t.Fatalf("second watch message = %v, %v; want a delta removing default/b", next, err)
	}
	if next.GetDelta().GetBaseVersion() != first.GetSnapshot().GetVersion() {
		t.Errorf("watch delta base %s, want %s", next.GetDelta().GetBaseVersion(), first.GetSnapshot().GetVersion())
	}
	if st := nodeStatus(t, client, "node-7"); st.GetConnected() {
		t.Errorf("a watch must not show as a connected agent: %v", st)
	}
}

// TestShutdownEndsStreams checks that Shutdown ends agents' and watchers'
// streams with Unavailable, so agents move to another replica at once and
// GracefulStop does not wait for streams that would never end.
func TestShutdownEndsStreams(t *testing.T) {
	store := cluster(t)
	srv := New(store, Options{}, slog.New(slog.DiscardHandler))
	client, _, _, gs := serve(t, srv)
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.ack(a.recv())
	watch, err := client.WatchTable(t.Context(), &pb.WatchTableRequest{NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("first watch message: %v", err)
	}

	srv.Shutdown()
	if err := a.recvErr(); status.Code(err) != codes.Unavailable {
		t.Errorf("agent's stream ended with %v, want Unavailable", err)
	}
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("watch stream ended with %v, want Unavailable", err)
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop still waiting for streams after Shutdown")
	}
}

// TestNackWithoutVersion checks that a NACK naming only the nonce (what an
// agent sends for a response it could not decode) rejects the response in
// flight, with the agent's reason shown by ListNodes.
func TestNackWithoutVersion(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	r := a.recv()
	a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Nack{Nack: &pb.Nack{Nonce: r.GetNonce(), Error: "undecodable response"}}})
	eventually(t, "ListNodes to show the NACK", func() bool {
		st := nodeStatus(t, client, "node-1")
		return st.GetNackedVersion() == r.GetSnapshot().GetVersion() && st.GetNackError() == "undecodable response"
	})
}

// TestStaleReplicaRefusesTablesItCannotPlace checks that a replica whose
// watches are stale serves an agent holding exactly its table or none, and
// refuses one holding another table (it may be newer, from a replica that
// still watches): serving it would roll the agent back.
func TestStaleReplicaRefusesTablesItCannotPlace(t *testing.T) {
	store := cluster(t)
	var stale atomic.Bool
	client, _, _ := newTestServer(t, store, Options{Stale: func() error {
		if stale.Load() {
			return errors.New("[endpointslices] watch failing for 50s")
		}
		return nil
	}})
	// A current agent, whose table this replica made.
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.ack(a.recv())
	current := a.hello()
	a.close()

	stale.Store(true)
	for _, tc := range []struct {
		name  string
		hello *pb.Hello
		serve bool
	}{
		{"holding nothing: served", &pb.Hello{NodeName: "node-2"}, true},
		{"holding this replica's table: served", current, true},
		{"holding a table this replica cannot place: refused", &pb.Hello{NodeName: "node-1", Version: "00000000000000ff", NodeHash: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := connect(t, client, proto.CloneOf(tc.hello))
			defer b.close()
			// Headers come once the hello is accepted; a refusal
			// comes instead of them, and Recv returns it.
			md, _ := b.stream.Header()
			if served := md != nil; served != tc.serve {
				_, err := b.stream.Recv()
				t.Fatalf("served %v (%v), want %v", served, err, tc.serve)
			}
			if !tc.serve {
				if _, err := b.stream.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "watch failing") {
					t.Fatalf("stream ended with %v, want Unavailable saying why", err)
				}
			}
		})
	}
}

// TestReplicaBehindRefusesNewerTables checks the order of worlds across
// replicas: a replica that has not observed the cluster as far as the
// table an agent holds refuses it, unless the agent holds exactly its
// table; once it has observed that far it serves it, from its own world.
func TestReplicaBehindRefusesNewerTables(t *testing.T) {
	a1, b1 := service(t, "a", 2, 1), service(t, "b", 3, 1)
	a2 := service(t, "a", 4, 1) // a change replica A has seen and B not yet
	replicaA, replicaB := table.NewStore(100), table.NewStore(100)
	replicaA.Apply(table.Update{ResourceVersion: 200, Services: map[string]*compute.Service{"a": a2, "b": b1}})
	replicaB.Apply(table.Update{ResourceVersion: 100, Services: map[string]*compute.Service{"a": a1, "b": b1}})
	clientA, _, _ := newTestServer(t, replicaA, Options{})
	clientB, _, _ := newTestServer(t, replicaB, Options{})

	// The agent takes its table from A, then comes to B.
	fromA := connect(t, clientA, &pb.Hello{NodeName: "node-1"})
	fromA.ack(fromA.recv())
	fromA.close()
	if fromA.rv != 200 {
		t.Fatalf("agent holds resource version %d after A's snapshot, want 200", fromA.rv)
	}
	held := fromA.hello()

	refused := connect(t, clientB, proto.CloneOf(held))
	if err := refused.recvErr(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "resourceVersion 100") {
		t.Fatalf("B behind the agent's table: stream ended with %v, want Unavailable naming B's resource version", err)
	}

	// An agent holding B's own table is served whatever it claims:
	// nothing is rolled back when nothing is sent.
	own := connect(t, clientB, &pb.Hello{NodeName: "node-2"})
	own.ack(own.recv())
	own.close()
	ownHello := own.hello()
	ownHello.ResourceVersion = 500
	current := connect(t, clientB, ownHello)
	if md, err := current.stream.Header(); err != nil || md == nil {
		t.Fatalf("agent holding B's own table: not served (%v)", err)
	}
	current.close()

	// B observes the cluster further, with A's change: the agent is now
	// served, and is current without being sent anything.
	replicaB.Apply(table.Update{ResourceVersion: 210, Services: map[string]*compute.Service{"a": a2}})
	served := connect(t, clientB, proto.CloneOf(held))
	if md, err := served.stream.Header(); err != nil || md == nil {
		t.Fatalf("B through 210: agent holding 200 not served (%v)", err)
	}
	served.close()
}

// TestAckTimeoutWithKeepalives: an agent that answers keepalives but never
// answers its table is cut at the ACK timeout, whether that comes before
// the first keepalive or after several, and gets its keepalives meanwhile
// (one timer serves both).
func TestAckTimeoutWithKeepalives(t *testing.T) {
	for _, tc := range []struct {
		name           string
		opts           Options
		wantKeepalives int
	}{
		{"ack timeout before the first keepalive", Options{KeepaliveInterval: time.Hour, AckTimeout: 100 * time.Millisecond}, 0},
		{"keepalives until the ack timeout", Options{KeepaliveInterval: 20 * time.Millisecond, AckTimeout: 300 * time.Millisecond}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := cluster(t)
			client, _, _ := newTestServer(t, store, tc.opts)
			a := connect(t, client, &pb.Hello{NodeName: "node-1"})
			if r := a.recv(); r.GetSnapshot() == nil {
				t.Fatalf("first response %v, want a snapshot", r)
			}
			// Answer keepalives, never the table, until the stream ends.
			keepalives := 0
			errc := make(chan error, 1)
			go func() {
				for {
					m, err := a.stream.Recv()
					if err != nil {
						errc <- err
						return
					}
					if m.GetKeepalive() != nil {
						keepalives++
						// A Send racing the stream's end reports io.EOF;
						// the next Recv then reports the status.
						_ = a.stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}})
					}
				}
			}()
			select {
			case err := <-errc:
				if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "neither acknowledged") {
					t.Errorf("stream ended with %v, want DeadlineExceeded for the ACK", err)
				}
			case <-time.After(waitFor):
				t.Fatalf("stream still open after %s", waitFor)
			}
			if keepalives < tc.wantKeepalives {
				t.Errorf("%d keepalives before the ACK timeout, want at least %d", keepalives, tc.wantKeepalives)
			}
		})
	}
}
