package server

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// FuzzDecodeRequest feeds arbitrary bytes to the server's decode of what an
// agent sends (a hello with its entry hashes split off, an ACK, a NACK, a
// keepalive). Nothing may panic, and the split decode must mean what
// proto.Unmarshal reads: the same message, entry hashes included once
// lazyEntries decodes them. The one difference allowed is the point of the
// split: undecodable entry hashes are found only when they are needed, by
// lazyEntries.
func FuzzDecodeRequest(f *testing.F) {
	for _, m := range []*pb.SyncRequest{
		{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{
			NodeName: "node-1", Version: "0000000000000003", NodeHash: 1,
			EntryHashes:  map[string]uint64{"default/a": 2, "default/b": 3},
			Capabilities: &pb.Capabilities{Deltas: true, Dataplane: "nftables"},
		}}},
		{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: "0000000000000003", Nonce: "1"}}},
		{Kind: &pb.SyncRequest_Nack{Nack: &pb.Nack{Nonce: "2", Error: "no", EntryErrors: []*pb.EntryError{{Key: "default/a", Error: "bad"}}}}},
		{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, entries, err := decodeRequest(raw)
		want := &pb.SyncRequest{}
		wantErr := proto.Unmarshal(raw, want)
		if err != nil {
			return // refused: the stream ends with InvalidArgument
		}
		var hashesErr error
		if h := got.GetHello(); h != nil {
			h.EntryHashes, hashesErr = lazyEntries(entries)()
		}
		switch {
		case wantErr != nil && hashesErr == nil:
			t.Fatalf("decodeRequest accepted what proto refuses (%v): %v", wantErr, got)
		case wantErr == nil && hashesErr != nil:
			t.Fatalf("entry hashes proto reads did not decode: %v", hashesErr)
		case wantErr != nil:
			return
		}
		// Fields of the wrong wire type are unknown to proto either way;
		// where they land among unknown fields means nothing.
		discardUnknown(got.ProtoReflect())
		discardUnknown(want.ProtoReflect())
		if !proto.Equal(got, want) {
			t.Fatalf("decodeRequest read %v, proto reads %v", got, want)
		}
	})
}

// discardUnknown drops the unknown fields of m and of every message in it.
func discardUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				discardUnknown(mv.Message())
				return true
			})
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				discardUnknown(v.List().Get(i).Message())
			}
		case !fd.IsMap() && !fd.IsList() && fd.Message() != nil:
			discardUnknown(v.Message())
		}
		return true
	})
}
