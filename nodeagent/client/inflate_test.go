package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// testEntry is a valid entry with the given hash.
func testEntry(name string, hash uint64) *pb.ServiceEntry {
	return &pb.ServiceEntry{Key: "default/" + name, Hash: hash, Service: &pb.Service{
		Namespace: "default", Name: name, ClusterIps: []string{"10.96.0.10"},
		Ports: []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80}},
	}}
}

// encodedEntries is entries as Snapshot.entries fields, what a frame holds.
func encodedEntries(t testing.TB, entries ...*pb.ServiceEntry) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.Snapshot{Entries: entries})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// compress compresses b into one frame as the control plane does.
func compress(t testing.TB, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithSingleSegment(true))
	if err != nil {
		t.Fatal(err)
	}
	return enc.EncodeAll(b, nil)
}

var testNode = &pb.NodeInfo{Name: "node-1", Hash: 1}

// compressedResponse is a response whose snapshot's entries are in
// frames, one per group, with the version they should add up to.
func compressedResponse(t testing.TB, nonce string, version uint64, frames ...[]byte) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.SyncResponse{Nonce: nonce, Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: fmt.Sprintf("%016x", version), Node: testNode, ZstdEntries: frames, ResourceVersion: 9,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestInflate(t *testing.T) {
	a, b, c := testEntry("a", 10), testEntry("b", 20), testEntry("c", 30)
	msg := compressedResponse(t, "n1", 61,
		compress(t, encodedEntries(t, a, b)), compress(t, encodedEntries(t, c)))
	got, err := Inflate(msg, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var r pb.SyncResponse
	if err := proto.Unmarshal(got, &r); err != nil {
		t.Fatal(err)
	}
	want := &pb.SyncResponse{Nonce: "n1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: fmt.Sprintf("%016x", 61), Node: testNode, Entries: []*pb.ServiceEntry{a, b, c}, ResourceVersion: 9,
	}}}
	if !proto.Equal(&r, want) {
		t.Fatalf("inflated %v, want %v", &r, want)
	}

	// Nothing compressed: the message itself, not a copy.
	plain, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Inflate(plain, 1<<20); err != nil || &got[0] != &plain[0] {
		t.Errorf("Inflate of a plain response = a copy or %v; want the message itself", err)
	}
}

// hashedEntry is testEntry with the hash its content gives.
func hashedEntry(t testing.TB, name string) *pb.ServiceEntry {
	t.Helper()
	e := testEntry(name, 0)
	h, err := tablehash.Entry(e.GetKey(), e.GetService())
	if err != nil {
		t.Fatal(err)
	}
	e.Hash = h
	return e
}

// unhashedEntries is entries as Snapshot.entries fields without their
// hashes, what an unhashed frame holds.
func unhashedEntries(t testing.TB, entries ...*pb.ServiceEntry) []byte {
	t.Helper()
	stripped := make([]*pb.ServiceEntry, len(entries))
	for i, e := range entries {
		stripped[i] = proto.CloneOf(e)
		stripped[i].Hash = 0 // a zero fixed64 is not encoded
	}
	return encodedEntries(t, stripped...)
}

// unhashedResponse is compressedResponse with unhashed frames.
func unhashedResponse(t testing.TB, nonce string, version uint64, frames ...[]byte) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.SyncResponse{Nonce: nonce, Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: fmt.Sprintf("%016x", version), Node: testNode, ZstdEntriesUnhashed: frames, ResourceVersion: 9,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInflateUnhashed checks that runs without hashes inflate, beside
// plain entries and hashed runs, to exactly the bytes of the plain
// response, with every hash the one its entry's content gives.
func TestInflateUnhashed(t *testing.T) {
	a, b, c, d := hashedEntry(t, "a"), hashedEntry(t, "b"), hashedEntry(t, "c"), hashedEntry(t, "d")
	// A long entry, so that the hash takes its length past one byte.
	d.Service.ExternalIps = []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5", "192.0.2.6", "192.0.2.7"}
	h, err := tablehash.Entry(d.GetKey(), d.GetService())
	if err != nil {
		t.Fatal(err)
	}
	d.Hash = h
	if n := proto.Size(d); n < 128 || n-9 >= 128 {
		t.Fatalf("entry d is %d bytes with its hash: want its length to need one more byte with it", n)
	}
	// The control plane writes entries, then the runs, in key order;
	// proto.Marshal writes fields in number order: entries (3), hashed
	// runs (5), unhashed runs (6), and resource_version (4) between
	// them, where it would not be in the plain snapshot: left out.
	msg, err := proto.Marshal(&pb.SyncResponse{Nonce: "n1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: "00000000000000ff", Node: testNode,
		Entries:     []*pb.ServiceEntry{a},
		ZstdEntries: [][]byte{compress(t, encodedEntries(t, b))},
		// Two frames, the second larger: each gets the room it declares.
		ZstdEntriesUnhashed: [][]byte{compress(t, unhashedEntries(t, c)), compress(t, unhashedEntries(t, d))},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Inflate(msg, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	want, err := proto.Marshal(&pb.SyncResponse{Nonce: "n1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: "00000000000000ff", Node: testNode, Entries: []*pb.ServiceEntry{a, b, c, d},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		var r pb.SyncResponse
		_ = proto.Unmarshal(got, &r)
		t.Fatalf("inflated to %d bytes (%v), want the plain response's %d", len(got), &r, len(want))
	}
}

// TestHashesKnownOnlyWhenAllAreOwn checks when the Sync codec tells the
// agent that a snapshot's hashes need no recomputing: only when some came
// without hashes (computed from the bytes received) and every hash given,
// the node's, a plain entry's and a hashed run's, is its content's. A
// forged hash given beside runs without hashes must leave the agent to
// recompute them all, which refuses it by name.
func TestHashesKnownOnlyWhenAllAreOwn(t *testing.T) {
	node := &pb.NodeInfo{Name: "node-1"}
	h, err := tablehash.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	node.Hash = h
	forged := func(e *pb.ServiceEntry) *pb.ServiceEntry { e.Hash++; return e }
	snapshot := func(node *pb.NodeInfo, plain, hashedRun, unhashedRun *pb.ServiceEntry) *pb.Snapshot {
		s := &pb.Snapshot{Version: "00000000000000ff", Node: node, Entries: []*pb.ServiceEntry{plain}}
		if hashedRun != nil {
			s.ZstdEntries = [][]byte{compress(t, encodedEntries(t, hashedRun))}
		}
		if unhashedRun != nil {
			s.ZstdEntriesUnhashed = [][]byte{compress(t, unhashedEntries(t, unhashedRun, hashedEntry(t, "e")))}
		}
		return s
	}
	otherNode := proto.CloneOf(node)
	otherNode.Name = "node-2" // its hash is node-1's
	for _, tc := range []struct {
		name string
		snap *pb.Snapshot
		want bool
	}{
		{"own and right", snapshot(node, hashedEntry(t, "a"), hashedEntry(t, "b"), hashedEntry(t, "c")), true},
		{"a forged plain entry", snapshot(node, forged(hashedEntry(t, "a")), hashedEntry(t, "b"), hashedEntry(t, "c")), false},
		{"a forged entry of a hashed run", snapshot(node, hashedEntry(t, "a"), forged(hashedEntry(t, "b")), hashedEntry(t, "c")), false},
		{"a forged node hash", snapshot(otherNode, hashedEntry(t, "a"), hashedEntry(t, "b"), hashedEntry(t, "c")), false},
		{"no run without hashes", snapshot(node, hashedEntry(t, "a"), hashedEntry(t, "b"), nil), false},
		{"plain", snapshot(node, hashedEntry(t, "a"), nil, nil), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, err := proto.Marshal(&pb.SyncResponse{Nonce: "n1", Kind: &pb.SyncResponse_Snapshot{Snapshot: tc.snap}})
			if err != nil {
				t.Fatal(err)
			}
			var r response
			if err := syncCodec(1<<20).Unmarshal(asReceived(msg), &r); err != nil || r.err != nil {
				t.Fatalf("decoding: %v, %v", err, r.err)
			}
			if r.hashesKnown != tc.want {
				t.Errorf("hashes known = %v, want %v", r.hashesKnown, tc.want)
			}
			// Known or not, each hash the agent holds for an entry that came
			// without one is its content's.
			for _, e := range r.msg.GetSnapshot().GetEntries() {
				if e.GetKey() != "default/e" {
					continue
				}
				if want, _ := tablehash.Entry(e.GetKey(), e.GetService()); e.GetHash() != want {
					t.Errorf("entry %s: computed hash %016x, want %016x", e.GetKey(), e.GetHash(), want)
				}
			}
		})
	}
}

// TestInflateUnhashedRefusesOthers checks that an unhashed run holding
// anything but entries without hashes is refused: an entry that carries
// one, or names its key twice (decoding would keep the last, hashed would
// be the first), or a field other than an entry.
func TestInflateUnhashedRefusesOthers(t *testing.T) {
	withHash := encodedEntries(t, hashedEntry(t, "a"))
	twoKeys := unhashedEntries(t, testEntry("a", 0))
	twoKeys = append(twoKeys[:len(twoKeys):len(twoKeys)], 0x1a, 3, 0x0a, 1, 'x') // one more entry: key "x"
	// ...and a key inside one entry twice.
	dupKey, err := proto.Marshal(&pb.ServiceEntry{Key: "default/a"})
	if err != nil {
		t.Fatal(err)
	}
	dupKey = append(dupKey, 0x0a, 1, 'x')
	dupKeyField := append([]byte{0x1a, byte(len(dupKey))}, dupKey...)
	notEntry := append(unhashedEntries(t, testEntry("a", 0)), 0x08, 1) // Snapshot field 1 as a varint
	for _, tc := range []struct {
		name    string
		content []byte
		wantErr string
	}{
		{"an entry with its hash", withHash, "carries a hash"},
		{"a key twice", dupKeyField, "twice"},
		{"a field other than entries", notEntry, "not only entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Inflate(unhashedResponse(t, "n1", 1, compress(t, tc.content)), 1<<20)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Inflate = %d bytes, %v; want an error saying %q", len(got), err, tc.wantErr)
			}
		})
	}
	// Not an error: several entries, the last one a bare key.
	if _, err := Inflate(unhashedResponse(t, "n1", 1, compress(t, twoKeys)), 1<<20); err != nil {
		t.Errorf("Inflate of two entries: %v", err)
	}
}

// TestInflateRefusesBombs sends frames that inflate, or claim to, beyond
// the limit: each is refused, and what Inflate allocates stays within the
// limit whatever the frame holds.
func TestInflateRefusesBombs(t *testing.T) {
	const limit = 4 << 20
	zeros := make([]byte, 64<<20)

	// Streamed: no content size in the header.
	var streamed bytes.Buffer
	w, err := zstd.NewWriter(&streamed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(zeros); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Declares 1 KiB, holds 64 MiB: the content size (4 bytes, after the
	// magic number and the descriptor) rewritten.
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	lying := enc.EncodeAll(zeros, nil)
	if lying[4]>>6 != 2 {
		t.Fatalf("frame descriptor %#x: want a 4-byte content size", lying[4])
	}
	binary.LittleEndian.PutUint32(lying[5:9], 1<<10)
	// Declares 1 GiB (an 8-byte content size) and a 1 KiB window, and
	// holds one raw byte: a decoder that believes it allocates 1 GiB.
	huge := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xc0, 0x00}
	huge = binary.LittleEndian.AppendUint64(huge, 1<<30)
	huge = append(huge, 0x09, 0, 0, 'x')
	// Each within the limit, together beyond it.
	third := compress(t, zeros[:limit/3+1])
	// Within the limit, but empty entries (2 bytes each) that a hash
	// each (9 bytes) takes past it.
	empties := compress(t, bytes.Repeat([]byte{0x1a, 0}, limit/4))

	for _, tc := range []struct {
		name     string
		frames   [][]byte
		unhashed bool
	}{
		{"no content size", [][]byte{streamed.Bytes()}, false},
		{"content size understated", [][]byte{lying}, false},
		{"content size beyond the limit", [][]byte{huge}, false},
		{"frames beyond the limit together", [][]byte{third, third, third}, false},
		{"unhashed: no content size", [][]byte{streamed.Bytes()}, true},
		{"unhashed: content size understated", [][]byte{lying}, true},
		{"unhashed: content size beyond the limit", [][]byte{huge}, true},
		{"unhashed: beyond the limit with their hashes", [][]byte{empties}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := compressedResponse(t, "n1", 1, tc.frames...)
			if tc.unhashed {
				msg = unhashedResponse(t, "n1", 1, tc.frames...)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			got, err := Inflate(msg, limit)
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatalf("inflated %d bytes; want an error", len(got))
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > limit+1<<20 {
				t.Errorf("allocated %d bytes refusing it; want at most the %d-byte limit and a little", alloc, limit)
			}
		})
	}
}

// tableApplier applies snapshots as the agent does (proxytable), so that
// its validation, hashes included, sees what the client decoded.
type tableApplier struct {
	mu   sync.Mutex
	held *proxytable.Table
	n    int // tables applied
}

func (a *tableApplier) Held() *proxytable.Table {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

func (a *tableApplier) Apply(_ context.Context, r *pb.SyncResponse, _ bool) (string, error) {
	t, err := proxytable.FromSnapshot(r.GetSnapshot())
	if err != nil {
		return "", err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held, a.n = t, a.n+1
	return t.Version, nil
}

// TestCompressedSnapshotsInflatedAndChecked runs the client against a
// control plane sending compressed snapshots: a good one is applied and
// ACKed; one whose compressed entries do not add up to its version is
// NACKed by the hash check, on what was inflated; the same with runs
// without hashes, whose hashes the agent computes, so that an entry
// tampered with on the way adds up to another version; a bomb is NACKed
// as undecodable, nothing is applied, and the agent starts over.
func TestCompressedSnapshotsInflatedAndChecked(t *testing.T) {
	// A bomb: 64 MiB of zeros behind a 4 MiB limit. Compressed before
	// the agent connects, which would take it for silence.
	bomb := compress(t, make([]byte, 64<<20))
	l := bufconn.Listen(1 << 20)
	f := newFakeControlPlane()
	gs := grpc.NewServer(grpc.ForceServerCodecV2(rawServerCodec{encoding.GetCodecV2("proto")}))
	pb.RegisterTableServiceServer(gs, f)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(func() { close(f.done); gs.Stop() })
	dial := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) })
	a := &tableApplier{held: proxytable.Empty()}
	startOpts(t, a, slog.New(slog.DiscardHandler), dial, func(o *Options) {
		o.Capabilities = &pb.Capabilities{Deltas: true, ZstdEntries: true, ZstdEntriesUnhashed: true}
	}, "cp")

	s := accept(t, f)
	if h := recv(t, s).GetHello(); !h.GetCapabilities().GetZstdEntries() {
		t.Fatalf("hello %v: want the zstd_entries capability announced", h)
	}
	x, y := testEntry("x", 100), testEntry("y", 200)
	if err := s.SendMsg(rawBytes(compressedResponse(t, "n1", 301, compress(t, encodedEntries(t, x, y))))); err != nil {
		t.Fatal(err)
	}
	if ack := recv(t, s).GetAck(); ack.GetNonce() != "n1" || ack.GetVersion() != fmt.Sprintf("%016x", 301) {
		t.Fatalf("answer %v, want an ACK of n1 at version %016x", ack, 301)
	}
	if got := a.Held().Keys(); len(got) != 2 {
		t.Fatalf("holds %v, want default/x and default/y", got)
	}

	// The frame says y's hash is 250: the entries add up to 351, not to
	// the 301 the snapshot claims.
	y2 := testEntry("y", 250)
	if err := s.SendMsg(rawBytes(compressedResponse(t, "n2", 301, compress(t, encodedEntries(t, x, y2))))); err != nil {
		t.Fatal(err)
	}
	n := recv(t, s).GetNack()
	if n.GetNonce() != "n2" || !strings.Contains(n.GetError(), fmt.Sprintf("entries add up to version %016x", 351)) {
		t.Fatalf("answer %v, want a NACK of n2 saying the inflated entries add up to %016x", n, 351)
	}

	// Runs without hashes: the agent computes them from the entries, and
	// the snapshot is applied when they add up to its version.
	hx, hy := hashedEntry(t, "x"), hashedEntry(t, "y")
	v := testNode.GetHash() + hx.GetHash() + hy.GetHash()
	if err := s.SendMsg(rawBytes(unhashedResponse(t, "n4", v, compress(t, unhashedEntries(t, hx, hy))))); err != nil {
		t.Fatal(err)
	}
	if ack := recv(t, s).GetAck(); ack.GetNonce() != "n4" || ack.GetVersion() != fmt.Sprintf("%016x", v) {
		t.Fatalf("answer %v, want an ACK of n4 at version %016x", ack, v)
	}
	if got := a.Held().Entries["default/y"]; got.GetHash() != hy.GetHash() {
		t.Fatalf("holds y with hash %016x, want %016x, its content's", got.GetHash(), hy.GetHash())
	}
	// Tampered on the way: y's cluster IP changed in the run. Its hash,
	// computed from what arrived, no longer adds up to the version.
	bad := proto.CloneOf(hy)
	bad.Service.ClusterIps = []string{"10.96.0.66"}
	if err := s.SendMsg(rawBytes(unhashedResponse(t, "n5", v, compress(t, unhashedEntries(t, hx, bad))))); err != nil {
		t.Fatal(err)
	}
	if n := recv(t, s).GetNack(); n.GetNonce() != "n5" || !strings.Contains(n.GetError(), "entries add up to version") {
		t.Fatalf("answer %v, want a NACK of n5 saying the entries do not add up to the version", n)
	}
	if got := a.Held().Entries["default/y"]; !proto.Equal(got, hy) {
		t.Fatalf("holds y as %v after the tampered snapshot, want %v", got, hy)
	}

	// The bomb.
	if err := s.SendMsg(rawBytes(compressedResponse(t, "n3", 1, bomb))); err != nil {
		t.Fatal(err)
	}
	// The agent NACKs it, half-closes the stream and starts over.
	if n := recv(t, s).GetNack(); n.GetNonce() != "n3" || !strings.Contains(n.GetError(), "undecodable") {
		t.Fatalf("answer %v, want a NACK of n3 saying the response is undecodable", n)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the NACK the stream gave %v, want io.EOF (a half-close)", err)
	}
	f.end(t)
	if h := recv(t, accept(t, f)).GetHello(); h.GetVersion() != fmt.Sprintf("%016x", v) {
		t.Fatalf("new stream's first message %v, want a hello holding the last table applied", h)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n != 2 {
		t.Errorf("applied %d tables, want only the two good ones", a.n)
	}
}
