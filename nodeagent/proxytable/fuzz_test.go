package proxytable

import (
	"maps"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// fuzzBase is the table deltas apply to in FuzzResponse: two Services.
func fuzzBase(tb testing.TB) *Table {
	tb.Helper()
	a, b := entry("a", 1), entry("b", 2)
	base, err := FromSnapshot(&pb.Snapshot{Version: sum(a, b), Node: node, Entries: []*pb.ServiceEntry{a, b}})
	if err != nil {
		tb.Fatal(err)
	}
	return base
}

// FuzzResponse feeds arbitrary bytes to what the agent does with a table
// response from the control plane: decode, then validate a snapshot or
// apply a delta to the table held. Nothing may panic; a table accepted
// validates again and adds up to its version; the table held is never
// changed by a delta, accepted or not.
func FuzzResponse(f *testing.F) {
	base := fuzzBase(f)
	c := entry("c", 3)
	for _, resp := range []*pb.SyncResponse{
		{Nonce: "1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: base.Version, Node: node, Entries: []*pb.ServiceEntry{entry("a", 1), entry("b", 2)}}}},
		{Nonce: "2", Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{BaseVersion: base.Version, Version: sum(entry("a", 1), c), Upserts: []*pb.ServiceEntry{c}, Removals: []string{"default/b"}}}},
		{Nonce: "3", Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{BaseVersion: base.Version, Version: base.Version, Removals: []string{"default/z"}}}},
		{Nonce: "4", Kind: &pb.SyncResponse_Keepalive{Keepalive: &pb.Keepalive{}}},
	} {
		b, err := proto.Marshal(resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		resp := &pb.SyncResponse{}
		if err := proto.Unmarshal(data, resp); err != nil {
			return // the stream's decode error: the agent reconnects
		}
		var got *Table
		var err error
		switch {
		case resp.GetSnapshot() != nil:
			got, err = FromSnapshot(resp.GetSnapshot())
		case resp.GetDelta() != nil:
			held := fuzzBase(t)
			before := maps.Clone(held.Entries)
			got, _, err = held.Apply(resp.GetDelta())
			if held.Version != base.Version || !maps.Equal(held.Entries, before) {
				t.Fatalf("a delta changed the table held (accepted: %v)", err == nil)
			}
		default:
			return
		}
		if err != nil {
			if EntryErrors(err) == nil && err.Error() == "" {
				t.Fatalf("a rejection without a reason: %#v", err)
			}
			return
		}
		again, err := FromEntries(got.Version, got.Node, mapsValues(got.Entries))
		if err != nil {
			t.Fatalf("an accepted table does not validate again: %v", err)
		}
		if again.Version != got.Version || len(again.Entries) != len(got.Entries) {
			t.Fatalf("an accepted table rebuilt as %s with %d entries, was %s with %d", again.Version, len(again.Entries), got.Version, len(got.Entries))
		}
	})
}

func mapsValues(m map[string]*pb.ServiceEntry) []*pb.ServiceEntry {
	out := make([]*pb.ServiceEntry, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	return out
}
