package server

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// ackBytes is an ACK as an agent sends one per table.
func ackBytes(t *testing.T) []byte {
	t.Helper()
	b, err := proto.Marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: "00000000deadbeef", Nonce: "1234"}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAckDecodesWithoutCopies: an ACK, the message every agent sends for
// every table, costs no allocation: the codec reads it from gRPC's
// buffer without protobuf (decodeAck), whose decoding of it costs five.
// Other requests are not split like a hello (which copied them).
func TestAckDecodesWithoutCopies(t *testing.T) {
	b := ackBytes(t)
	proto := testing.AllocsPerRun(200, func() {
		if err := proto.Unmarshal(b, &pb.SyncRequest{}); err != nil {
			t.Fatal(err)
		}
	})
	decode := testing.AllocsPerRun(200, func() {
		if _, _, err := decodeRequest(b); err != nil {
			t.Fatal(err)
		}
	})
	if decode > proto {
		t.Errorf("decodeRequest of an ACK: %v allocations, protobuf alone %v", decode, proto)
	}
	c := newCodec()
	data := mem.BufferSlice{mem.SliceBuffer(b)} // as gRPC hands it over
	m := &syncMessage{}
	codec := testing.AllocsPerRun(200, func() {
		*m = syncMessage{}
		if err := c.Unmarshal(data, m); err != nil || m.err != nil || !m.isAck || string(m.ack.nonceBytes()) != "1234" || m.ack.version != 0xdeadbeef {
			t.Fatalf("decoding an ACK: %v, %+v", err, m)
		}
	})
	if codec != 0 {
		t.Errorf("the codec's decoding of an ACK: %v allocations, want 0 (protobuf's: %v)", codec, proto)
	}
}

// TestDecodeAck: decodeAck reads an ACK as protobuf does, and leaves to
// protobuf every message it cannot read exactly so.
func TestDecodeAck(t *testing.T) {
	marshal := func(m *pb.SyncRequest) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ack := func(version, nonce string) []byte {
		return marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: version, Nonce: nonce}}})
	}
	// The same two fields in the other order, as another encoder may
	// write them; and an ACK field given twice, which protobuf merges.
	reversed := protowire.AppendTag(nil, 2, protowire.BytesType)
	inner := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte("7"))
	inner = protowire.AppendBytes(protowire.AppendTag(inner, 1, protowire.BytesType), []byte("00000000000000ff"))
	reversed = protowire.AppendBytes(reversed, inner)
	twice := append(ack("00000000000000aa", "1"), ack("00000000000000bb", "2")...)
	for _, tc := range []struct {
		name    string
		b       []byte
		fast    bool
		version uint64
		nonce   string
	}{
		{"an agent's ACK", ack("00000000deadbeef", "1234"), true, 0xdeadbeef, "1234"},
		{"upper-case hex", ack("00000000DEADBEEF", "1"), true, 0xdeadbeef, "1"},
		{"the largest nonce", ack("ffffffffffffffff", "18446744073709551615"), true, 1<<64 - 1, "18446744073709551615"},
		{"fields in the other order", reversed, true, 0xff, "7"},
		{"no nonce", ack("00000000deadbeef", ""), false, 0, ""},
		{"no version", ack("", "1"), false, 0, ""},
		{"a short version", ack("deadbeef", "1"), false, 0, ""},
		{"a version not hex", ack("00000000deadbeeg", "1"), false, 0, ""},
		{"a nonce not digits", ack("00000000deadbeef", "x1"), false, 0, ""},
		{"a nonce too long", ack("00000000deadbeef", "123456789012345678901"), false, 0, ""},
		{"an ACK given twice", twice, false, 0, ""},
		{"with a drift report", marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: "00000000deadbeef", Nonce: "1"}}, Drift: &pb.DriftReport{}}), false, 0, ""},
		{"a keepalive", marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}}), false, 0, ""},
		{"a NACK", marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Nack{Nack: &pb.Nack{Version: "00000000deadbeef", Nonce: "1"}}}), false, 0, ""},
		{"truncated", ack("00000000deadbeef", "1234")[:10], false, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a ackFields
			fast := decodeAck(tc.b, &a)
			if fast != tc.fast {
				t.Fatalf("decodeAck = %v, want %v", fast, tc.fast)
			}
			if !fast {
				return
			}
			if a.version != tc.version || string(a.nonceBytes()) != tc.nonce {
				t.Errorf("decoded version %016x nonce %q, want %016x %q", a.version, a.nonceBytes(), tc.version, tc.nonce)
			}
			// What protobuf makes of the same bytes.
			var m pb.SyncRequest
			if err := proto.Unmarshal(tc.b, &m); err != nil {
				t.Fatal(err)
			}
			v, err := compute.ParseVersion(m.GetAck().GetVersion())
			if err != nil || v != a.version || m.GetAck().GetNonce() != string(a.nonceBytes()) {
				t.Errorf("protobuf reads version %q (%v) nonce %q; decodeAck %016x %q", m.GetAck().GetVersion(), err, m.GetAck().GetNonce(), a.version, a.nonceBytes())
			}
		})
	}
}

// TestSyncMessageDecodeErrors: the codec never fails a Sync message
// (grpc-go would end the stream with Internal); it hands the error to the
// stream, and a hello keeps its entry hashes apart.
func TestSyncMessageDecodeErrors(t *testing.T) {
	c := newCodec()
	var bad syncMessage
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0xff, 0xff, 0xff})}, &bad); err != nil || bad.err == nil {
		t.Errorf("garbage: codec error %v, message error %v; want none and one", err, bad.err)
	}
	hello, err := proto.Marshal(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: "node-1", EntryHashes: map[string]uint64{"a": 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	// In two buffers, as a larger message arrives.
	var m syncMessage
	split := mem.BufferSlice{mem.SliceBuffer(hello[:3]), mem.SliceBuffer(hello[3:])}
	if err := c.Unmarshal(split, &m); err != nil || m.err != nil {
		t.Fatalf("hello: %v, %v", err, m.err)
	}
	if m.req.GetHello().GetNodeName() != "node-1" || len(m.entries) == 0 || m.req.GetHello().GetEntryHashes() != nil {
		t.Errorf("hello decoded as %v with %d bytes of entries; want its name, and its hashes apart", m.req, len(m.entries))
	}
}
