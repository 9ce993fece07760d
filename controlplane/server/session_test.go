package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestAckAnsweredWhereReceived: the ACK of a response, the message every
// agent sends for every change, is handled on the goroutine that read it,
// and the response it makes due (the world moved on while the previous
// one was in flight) is sent from there too, rather than handed to the
// stream's goroutine through a channel: one goroutine wake-up and switch
// less per response.
//
// The stream is a fake driven in order: the hello; the snapshot, during
// whose send a change is published; the ACK, read only once the stream's
// goroutine has taken the change and parked in its select; then the end.
func TestAckAnsweredWhereReceived(t *testing.T) {
	store := cluster(t)
	srv := New(store, Options{}, slog.New(slog.DiscardHandler))
	fs := newFakeSyncStream(t)
	fs.onSnapshot = func() {
		publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2), "b": service(t, "b", 3, 1)})
	}
	done := make(chan error, 1)
	go func() { done <- srv.Sync(fs) }()

	fs.recv <- helloBytes(t, "node-1")
	snap := fs.next(t)
	if snap.resp.GetSnapshot() == nil {
		t.Fatalf("first response %v, want a snapshot", snap.resp)
	}
	// The change was published before the stream's goroutine went back to
	// its select, so once it is parked there it has taken it.
	waitParked(t, snap.goroutine)
	ack, err := proto.Marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: snap.resp.GetSnapshot().GetVersion(), Nonce: snap.resp.GetNonce()}}})
	if err != nil {
		t.Fatal(err)
	}
	fs.recv <- ack
	delta := fs.next(t)
	if delta.resp.GetDelta() == nil {
		t.Fatalf("second response %v, want a delta", delta.resp)
	}
	if delta.goroutine != delta.receivedOn {
		t.Errorf("the delta the ACK made due was sent on goroutine %d, the ACK received on %d (the stream's goroutine is %d): want the ACK's",
			delta.goroutine, delta.receivedOn, snap.goroutine)
	}
	close(fs.recv) // the agent closes its side
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Sync after the agent closed its side: %v, want nil", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Sync still running after the agent closed its side")
	}
}

// fakeSyncStream is a Sync stream that the test drives: RecvMsg returns
// the messages sent on recv, decoded by the server's codec (io.EOF once
// recv is closed), and SendMsg hands each table response to sent, with
// the goroutines it was sent and last received on.
type fakeSyncStream struct {
	grpc.ServerStream // unused methods: nil
	t                 *testing.T
	ctx               context.Context
	codec             codec
	recv              chan []byte
	sent              chan sentResponse
	onSnapshot        func() // called within the first table's SendMsg

	mu         sync.Mutex
	receivedOn int64 // the goroutine of the last RecvMsg
	tables     int
}

type sentResponse struct {
	resp                  *pb.SyncResponse
	goroutine, receivedOn int64
}

func newFakeSyncStream(t *testing.T) *fakeSyncStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &fakeSyncStream{t: t, ctx: ctx, codec: newCodec(), recv: make(chan []byte), sent: make(chan sentResponse, 4)}
}

func (f *fakeSyncStream) Context() context.Context       { return f.ctx }
func (f *fakeSyncStream) SendHeader(_ metadata.MD) error { return nil }
func (f *fakeSyncStream) SetTrailer(_ metadata.MD)       {}
func (f *fakeSyncStream) Send(*pb.SyncResponse) error    { return errors.New("unused") }
func (f *fakeSyncStream) Recv() (*pb.SyncRequest, error) {
	return nil, errors.New("unused")
}

func (f *fakeSyncStream) RecvMsg(m any) error {
	var b []byte
	var ok bool
	select {
	case b, ok = <-f.recv:
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
	if !ok {
		return io.EOF
	}
	f.mu.Lock()
	f.receivedOn = goroutineID()
	f.mu.Unlock()
	return f.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m)
}

func (f *fakeSyncStream) SendMsg(m any) error {
	fr, ok := m.(*frame)
	if !ok {
		return nil // a keepalive
	}
	data, err := f.codec.Marshal(fr)
	if err != nil {
		return err
	}
	resp := &pb.SyncResponse{}
	if err := proto.Unmarshal(data.Materialize(), resp); err != nil {
		return err
	}
	f.mu.Lock()
	f.tables++
	first := f.tables == 1
	s := sentResponse{resp: resp, goroutine: goroutineID(), receivedOn: f.receivedOn}
	f.mu.Unlock()
	if first && f.onSnapshot != nil {
		f.onSnapshot()
	}
	f.sent <- s
	return nil
}

// next returns the next table response sent.
func (f *fakeSyncStream) next(t *testing.T) sentResponse {
	t.Helper()
	select {
	case s := <-f.sent:
		return s
	case <-time.After(waitFor):
		t.Fatalf("no response within %s", waitFor)
		return sentResponse{}
	}
}

func helloBytes(t *testing.T, node string) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{
		NodeName: node, Capabilities: &pb.Capabilities{Deltas: true, Dataplane: "test"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// goroutineID is the calling goroutine's number, from its stack's header
// ("goroutine 42 [running]:").
func goroutineID() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseInt(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// waitParked waits until goroutine id is parked in a select.
func waitParked(t *testing.T, id int64) {
	t.Helper()
	header := []byte("goroutine " + strconv.FormatInt(id, 10) + " [select")
	buf := make([]byte, 1<<20)
	eventually(t, "the stream's goroutine to park in its select", func() bool {
		return bytes.Contains(buf[:runtime.Stack(buf, true)], header)
	})
}

// TestListNodesWhileKeepaliveWaits: a stream whose keepalive waits behind
// a large table its agent does not read releases its lock while it waits:
// ListNodes, which reads every node's status, and the other agents carry
// on, however long the write timeout.
func TestListNodesWhileKeepaliveWaits(t *testing.T) {
	store := table.NewStore(100)
	publish(t, store, manyServices(t, 400, 20, first))
	client, _, dial := newTestServer(t, store, Options{WriteTimeout: time.Hour, KeepaliveInterval: 20 * time.Millisecond})

	// As in TestStalledAgentDoesNotDelayOthers: a fixed window keeps most
	// of the snapshot unwritten, so the next keepalive cannot be.
	stalledClient := dial(grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	stalled := connect(t, stalledClient, &pb.Hello{NodeName: "stalled"})
	defer stalled.close()
	buf := make([]byte, 1<<20)
	eventually(t, "a keepalive to wait in the sender", func() bool {
		return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("server.(*sender).send("))
	})

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	resp, err := client.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		t.Fatalf("ListNodes while a keepalive waits: %v", err)
	}
	found := false
	for _, n := range resp.GetNodes() {
		found = found || n.GetNodeName() == "stalled" && n.GetConnected() && n.GetSentVersion() != ""
	}
	if !found {
		t.Errorf("ListNodes does not show the stalled agent connected and sent a table: %v", resp.GetNodes())
	}
	fast := connect(t, client, &pb.Hello{NodeName: "fast"})
	fast.ack(fast.recv())
	publish(t, store, map[string]*compute.Service{"svc-000": service(t, "svc-000", 20, 2)})
	if r := fast.recv(); r.GetDelta() == nil {
		t.Fatalf("fast agent got %v, want a delta", r)
	}
}

// TestKeepalivesAligned checks that streams started at different times
// send their keepalives at the same instants, sixteen an interval, and
// never sooner than the interval after the last: each lone wake-up of a
// stream costs the control plane more than the keepalive itself.
func TestKeepalivesAligned(t *testing.T) {
	const interval = 16 * time.Second
	tick := interval / 16
	// Just past a tick, so that both starts fall within the same one.
	start := alignUp(time.Now(), interval).Add(time.Nanosecond)
	a := newDeadlines(start, interval)
	defer a.stop()
	b := newDeadlines(start.Add(tick/3), interval)
	defer b.stop()
	if !a.next.Equal(b.next) {
		t.Errorf("streams started %v apart keep alive at %v and %v, want the same instant", tick/3, a.next.Sub(start), b.next.Sub(start))
	}
	for _, d := range []*deadlines{a, b} {
		if off := d.next.Sub(keepaliveEpoch) % tick; off != 0 {
			t.Errorf("next keepalive %v past a tick of the epoch", off)
		}
	}
	// Each keepalive late by a different part of a tick, as a busy
	// process fires them.
	for i, late := range []time.Duration{0, tick / 2, 3 * tick} {
		now := a.next.Add(late)
		last := now
		if !a.keepaliveDue(now) {
			t.Fatalf("keepalive %d not due at %v", i, now.Sub(start))
		}
		if gap := a.next.Sub(last); gap < interval || gap >= interval+tick {
			t.Errorf("keepalive %d: next one %v after it, want [%v, %v)", i, gap, interval, interval+tick)
		}
		if off := a.next.Sub(keepaliveEpoch) % tick; off != 0 {
			t.Errorf("keepalive %d: next one %v past a tick of the epoch", i, off)
		}
	}
}

// TestAgentAckingUnreadTableHoldsBackNoOne is the attack of an agent (its
// credentials are enough) that acknowledges a large table without reading
// it, having learned its version from ListNodes and guessed its nonce,
// the first: the response the ACK makes due (the world moved on) cannot
// be written, and gRPC blocks its SendMsg on the spent write quota. The
// stream's lock is held there; the node status's must not be, or
// ListNodes, and every other agent's attach behind the registry's lock,
// would wait on it for as long as the agent likes.
func TestAgentAckingUnreadTableHoldsBackNoOne(t *testing.T) {
	store := table.NewStore(100)
	publish(t, store, manyServices(t, 400, 20, first))
	client, _, dial := newTestServer(t, store, Options{WriteTimeout: time.Hour, KeepaliveInterval: time.Hour})

	stalledClient := dial(grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	stalled := connect(t, stalledClient, &pb.Hello{NodeName: "stalled"})
	defer stalled.close()
	var sent string
	eventually(t, "the snapshot sent", func() bool {
		resp, err := client.ListNodes(context.Background(), &pb.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range resp.GetNodes() {
			if n.GetNodeName() == "stalled" {
				sent = n.GetSentVersion()
			}
		}
		return sent != ""
	})
	publish(t, store, map[string]*compute.Service{"svc-000": service(t, "svc-000", 20, 2)})
	stalled.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: sent, Nonce: "1"}}})
	buf := make([]byte, 1<<20)
	eventually(t, "the next response's SendMsg to block", func() bool {
		return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("(*writeQuota).get("))
	})

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := client.ListNodes(ctx, &pb.ListNodesRequest{}); err != nil {
		t.Fatalf("ListNodes while a stream's write blocks: %v", err)
	}
	fast := connect(t, client, &pb.Hello{NodeName: "fast"})
	fast.ack(fast.recv())
	publish(t, store, map[string]*compute.Service{"svc-001": service(t, "svc-001", 20, 2)})
	if r := fast.recv(); r.GetDelta() == nil {
		t.Fatalf("fast agent got %v, want a delta", r)
	}
}
