package client

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// bench10k is a response of 10,000 Services (NodePort, 3 endpoints each,
// about 1.5 MB), plain and compressed as the control plane compresses a
// zone view: runs of 32 KiB, zstd's fastest level, single segments, with
// the entries' hashes (zstd_entries) and without (zstd_entries_unhashed).
func bench10k(b *testing.B) (plain, compressed, unhashed []byte) {
	b.Helper()
	node := &pb.NodeInfo{Name: "node-1"}
	h, err := tablehash.Node(node)
	if err != nil {
		b.Fatal(err)
	}
	node.Hash = h
	snap := &pb.Snapshot{Node: node, ResourceVersion: 12345}
	sum := node.GetHash()
	var entries, bare []byte
	var runs, bareRuns [][]byte
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithSingleSegment(true))
	if err != nil {
		b.Fatal(err)
	}
	for i := range 10000 {
		name := fmt.Sprintf("svc-%05d", i)
		s := &pb.Service{
			Namespace: "default", Name: name, ClusterIps: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			Ports: []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, NodePort: int32(30000 + i%2768), HasEndpoints: true}},
		}
		pe := &pb.PortEndpoints{PortName: "http"}
		for j := range 3 {
			pe.Endpoints = append(pe.Endpoints, &pb.Endpoint{
				Ip: fmt.Sprintf("10.%d.%d.%d", 128+(i*7+j)%64, (i*13+j)%256, (i*31+j)%250+1), Port: 8080, Ready: true, Serving: true,
			})
		}
		s.ClusterEndpoints = []*pb.PortEndpoints{pe}
		e := &pb.ServiceEntry{Key: "default/" + name, Service: s}
		bb, err := proto.Marshal(&pb.Snapshot{Entries: []*pb.ServiceEntry{e}})
		if err != nil {
			b.Fatal(err)
		}
		if e.Hash, err = tablehash.Entry(e.Key, s); err != nil {
			b.Fatal(err)
		}
		snap.Entries = append(snap.Entries, e)
		sum += e.Hash
		eb, err := proto.Marshal(&pb.Snapshot{Entries: []*pb.ServiceEntry{e}})
		if err != nil {
			b.Fatal(err)
		}
		if len(entries) > 0 && len(entries)+len(eb) > 32<<10 {
			runs = append(runs, enc.EncodeAll(entries, nil))
			bareRuns = append(bareRuns, enc.EncodeAll(bare, nil))
			entries, bare = entries[:0], bare[:0]
		}
		entries = append(entries, eb...)
		bare = append(bare, bb...)
	}
	runs = append(runs, enc.EncodeAll(entries, nil))
	bareRuns = append(bareRuns, enc.EncodeAll(bare, nil))
	snap.Version = fmt.Sprintf("%016x", sum)
	plain, err = proto.Marshal(&pb.SyncResponse{Nonce: "1", Kind: &pb.SyncResponse_Snapshot{Snapshot: snap}})
	if err != nil {
		b.Fatal(err)
	}
	response := func(head *pb.Snapshot) []byte {
		hb, err := proto.Marshal(head)
		if err != nil {
			b.Fatal(err)
		}
		msg := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "1")
		msg = protowire.AppendTag(msg, 2, protowire.BytesType)
		return protowire.AppendBytes(msg, hb)
	}
	compressed = response(&pb.Snapshot{Version: snap.Version, Node: snap.Node, ResourceVersion: snap.ResourceVersion, ZstdEntries: runs})
	unhashed = response(&pb.Snapshot{Version: snap.Version, Node: snap.Node, ResourceVersion: snap.ResourceVersion, ZstdEntriesUnhashed: bareRuns})
	return plain, compressed, unhashed
}

// asReceived cuts b into 16 KiB buffers, as grpc-go hands a message read
// from HTTP/2 data frames to the codec.
func asReceived(b []byte) mem.BufferSlice {
	var out mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), 16<<10)
		out = append(out, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return out
}

// BenchmarkDecode10k is the agent's decode of a 10,000-Service snapshot
// by the Sync codec, plain and compressed (inflated first, then decoded;
// without hashes, the hashes computed while inflating).
// heap-B/op is what one decode allocates with the collector off, an upper
// bound on what it adds to the peak; wire-B is the message as received,
// which grpc-go holds while the codec runs. docs/benchmarks.md records
// it.
func BenchmarkDecode10k(b *testing.B) {
	plain, compressed, unhashed := bench10k(b)
	codec := syncCodec(64 << 20)
	for _, tc := range []struct {
		name string
		msg  []byte
	}{{"plain", plain}, {"zstd", compressed}, {"zstd-unhashed", unhashed}} {
		b.Run(tc.name, func(b *testing.B) {
			data := asReceived(tc.msg)
			// One decode with the collector off: what it allocates.
			old := debug.SetGCPercent(-1)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var r response
			if err := codec.Unmarshal(data, &r); err != nil || r.err != nil || len(r.msg.GetSnapshot().GetEntries()) != 10000 {
				b.Fatalf("decode: %v, %v", err, r.err)
			}
			runtime.ReadMemStats(&after)
			debug.SetGCPercent(old)
			for b.Loop() {
				var r response
				if err := codec.Unmarshal(data, &r); err != nil || r.err != nil {
					b.Fatal(err, r.err)
				}
			}
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc), "heap-B/op")
			b.ReportMetric(float64(len(tc.msg)), "wire-B")
		})
	}
	// Inflating alone: what the zstd cases add.
	b.Run("inflate", func(b *testing.B) {
		for b.Loop() {
			if _, err := Inflate(compressed, 64<<20); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("inflate-unhashed", func(b *testing.B) {
		for b.Loop() {
			if _, err := Inflate(unhashed, 64<<20); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReceive10k is what the agent does with a 10,000-Service
// snapshot from the bytes received to a table it may program: the Sync
// codec's decode, the table's validation (proxytable.FromSnapshot) and
// the agent's policy with its hash checks, which recompute by re-encoding
// every hash the control plane gave and none the client computed or
// checked from the bytes (response.hashesKnown).
func BenchmarkReceive10k(b *testing.B) {
	plain, compressed, unhashed := bench10k(b)
	codec := syncCodec(64 << 20)
	policy := &proxytable.Policy{}
	for _, tc := range []struct {
		name    string
		msg     []byte
		known   bool
		recheck bool // recompute the known hashes all the same
	}{
		{"plain", plain, false, false},
		{"zstd", compressed, false, false},
		{"zstd-unhashed", unhashed, true, false},
		{"zstd-unhashed-rechecked", unhashed, true, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			data := asReceived(tc.msg)
			for b.Loop() {
				var r response
				if err := codec.Unmarshal(data, &r); err != nil || r.err != nil {
					b.Fatal(err, r.err)
				}
				if r.hashesKnown != tc.known {
					b.Fatalf("hashes known = %v, want %v", r.hashesKnown, tc.known)
				}
				t, err := proxytable.FromSnapshot(r.msg.GetSnapshot())
				if err != nil {
					b.Fatal(err)
				}
				if r.hashesKnown && !tc.recheck {
					err = policy.CheckVerified(t)
				} else {
					err = policy.Check(t, nil)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
