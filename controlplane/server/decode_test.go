package server

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

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
// every table, costs no allocation beyond what protobuf's decoding of it
// needs: it is not split like a hello (which copied it), and the codec
// decodes it from gRPC's buffer rather than from a copy.
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
		if err := c.Unmarshal(data, m); err != nil || m.err != nil || m.req.GetAck().GetNonce() != "1234" {
			t.Fatalf("decoding an ACK: %v, %v, %v", err, m.err, m.req)
		}
	})
	if codec > proto {
		t.Errorf("the codec's decoding of an ACK: %v allocations, protobuf alone %v", codec, proto)
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
