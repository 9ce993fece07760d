package server

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/table/tabletest"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// inflatingCodec decodes responses as the agent's codec does: compressed
// entries inflated in place (nodeagent/client.Inflate, which the control
// plane may not import), then the generated types.
type inflatingCodec struct {
	encoding.CodecV2
	t testing.TB
}

func (c inflatingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var r pb.SyncResponse
	if err := proto.Unmarshal(data.Materialize(), &r); err != nil {
		return err
	}
	if s := r.GetSnapshot(); len(s.GetZstdEntries())+len(s.GetZstdEntriesUnhashed()) > 0 {
		b, err := proto.Marshal(s)
		if err != nil {
			return err
		}
		plain := &pb.Snapshot{}
		if err := proto.Unmarshal(tabletest.InflateSnapshot(c.t, b), plain); err != nil {
			return err
		}
		r.Kind = &pb.SyncResponse_Snapshot{Snapshot: plain}
	}
	proto.Merge(v.(proto.Message), &r)
	return nil
}

// rawResponses keeps each response's bytes as sent, to see what went on
// the wire.
type rawResponses struct {
	encoding.CodecV2
	last *[]byte
}

func (c rawResponses) Unmarshal(data mem.BufferSlice, v any) error {
	*c.last = data.Materialize()
	return c.CodecV2.Unmarshal(data, v)
}

// TestCompressionIsNegotiated checks that snapshots carry compressed
// entries only to an agent that announced Capabilities.zstd_entries, that
// they hold the same table as the plain ones, and that agents that did
// not announce it, and WatchTable (what grpcurl sees), get plain
// protobuf; deltas stay plain.
func TestCompressionIsNegotiated(t *testing.T) {
	store := table.NewStore(100)
	publish(t, store, manyServices(t, 200, 20, each))
	_, _, dial := newTestServer(t, store, Options{})
	pc := encoding.GetCodecV2("proto")

	var wire []byte
	zc := dial(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(inflatingCodec{pc, t})))
	za := connect(t, zc, &pb.Hello{NodeName: "node-1", Capabilities: &pb.Capabilities{Deltas: true, ZstdEntries: true}})
	rawc := dial(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawResponses{pc, &wire})))
	raw := connect(t, rawc, &pb.Hello{NodeName: "node-2", Capabilities: &pb.Capabilities{Deltas: true, ZstdEntries: true}})
	plainc := dial(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawResponses{pc, new([]byte)})))
	pa := connect(t, plainc, &pb.Hello{NodeName: "node-3", Capabilities: &pb.Capabilities{Deltas: true}})

	// On the wire, compressed: no plain entries, and far fewer bytes.
	rr := raw.recv()
	rw := rr.GetSnapshot()
	if len(rw.GetEntries()) != 0 || len(rw.GetZstdEntries()) == 0 {
		t.Fatalf("announcing agent's snapshot has %d plain entries and %d compressed runs; want only compressed runs", len(rw.GetEntries()), len(rw.GetZstdEntries()))
	}
	// Inflated, the same table as the plain agent's.
	zs, ps := za.recv(), pa.recv()
	if len(ps.GetSnapshot().GetZstdEntries()) != 0 || len(ps.GetSnapshot().GetEntries()) != 200 {
		t.Fatalf("agent without the capability got %d compressed runs and %d entries; want 200 plain entries", len(ps.GetSnapshot().GetZstdEntries()), len(ps.GetSnapshot().GetEntries()))
	}
	plainBytes, err := proto.Marshal(ps)
	if err != nil {
		t.Fatal(err)
	}
	if 3*len(wire) > len(plainBytes) {
		t.Errorf("compressed snapshot is %d bytes, plain %d: want under a third", len(wire), len(plainBytes))
	}
	ze, pe := zs.GetSnapshot().GetEntries(), ps.GetSnapshot().GetEntries()
	if len(ze) != len(pe) {
		t.Fatalf("inflated snapshot has %d entries, plain %d", len(ze), len(pe))
	}
	for i := range ze {
		if !proto.Equal(ze[i], pe[i]) {
			t.Fatalf("inflated entry %d is %v, plain %v", i, ze[i], pe[i])
		}
	}
	za.ack(zs) // checks that the inflated entries add up to the version
	// The raw agent holds what the plain agent does, but for its node.
	raw.entries = za.entries
	raw.nodeHash, raw.version = rw.GetNode().GetHash(), rw.GetVersion()
	raw.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: rw.GetVersion(), Nonce: rr.GetNonce()}}})

	// WatchTable, as grpcurl calls it, gets plain protobuf for the same
	// node whose compressed runs now exist.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := plainc.WatchTable(ctx, &pb.WatchTableRequest{NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil || len(first.GetSnapshot().GetEntries()) != 200 || len(first.GetSnapshot().GetZstdEntries()) != 0 {
		t.Fatalf("WatchTable's first message = %d entries, %d compressed runs, %v; want 200 plain entries", len(first.GetSnapshot().GetEntries()), len(first.GetSnapshot().GetZstdEntries()), err)
	}

	// A change reaches the compressing agent as a plain delta.
	publish(t, store, map[string]*compute.Service{"svc-007": service(t, "svc-007", 21, 7)})
	d := raw.recv().GetDelta()
	if len(d.GetUpserts()) != 1 || len(wire) < proto.Size(d) {
		t.Fatalf("change gave %v (%d bytes on the wire); want a plain delta of one upsert", d, len(wire))
	}
}

// TestUnhashedCompressionIsNegotiated checks that an agent announcing
// Capabilities.zstd_entries_unhashed gets runs without hashes that hold,
// hashed by the agent, the plain agent's table, smaller than the hashed
// runs that an agent announcing only zstd_entries (one that predates
// them) still gets.
func TestUnhashedCompressionIsNegotiated(t *testing.T) {
	store := table.NewStore(100)
	publish(t, store, manyServices(t, 200, 20, each))
	_, _, dial := newTestServer(t, store, Options{})
	pc := encoding.GetCodecV2("proto")

	var unhashedWire, hashedWire []byte
	both := &pb.Capabilities{Deltas: true, ZstdEntries: true, ZstdEntriesUnhashed: true}
	un := connect(t, dial(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawResponses{pc, &unhashedWire}))), &pb.Hello{NodeName: "node-1", Capabilities: both})
	old := connect(t, dial(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawResponses{pc, &hashedWire}))),
		&pb.Hello{NodeName: "node-2", Capabilities: &pb.Capabilities{Deltas: true, ZstdEntries: true}})
	za := connect(t, dial(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(inflatingCodec{pc, t}))), &pb.Hello{NodeName: "node-3", Capabilities: both})
	pa := connect(t, dial(grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawResponses{pc, new([]byte)}))), &pb.Hello{NodeName: "node-4"})

	us, hs := un.recv().GetSnapshot(), old.recv().GetSnapshot()
	if len(us.GetEntries())+len(us.GetZstdEntries()) != 0 || len(us.GetZstdEntriesUnhashed()) == 0 {
		t.Fatalf("agent announcing unhashed runs got %d plain entries, %d hashed and %d unhashed runs; want only unhashed runs",
			len(us.GetEntries()), len(us.GetZstdEntries()), len(us.GetZstdEntriesUnhashed()))
	}
	if len(hs.GetEntries())+len(hs.GetZstdEntriesUnhashed()) != 0 || len(hs.GetZstdEntries()) == 0 {
		t.Fatalf("agent announcing only zstd_entries got %d plain entries, %d hashed and %d unhashed runs; want only hashed runs",
			len(hs.GetEntries()), len(hs.GetZstdEntries()), len(hs.GetZstdEntriesUnhashed()))
	}
	if 10*len(unhashedWire) > 9*len(hashedWire) {
		t.Errorf("snapshot with unhashed runs is %d bytes, with hashed runs %d: want a tenth less at least", len(unhashedWire), len(hashedWire))
	}
	// Inflated and hashed, the plain agent's table; the ACK checks that
	// the computed hashes add up to the version.
	zs, ps := za.recv(), pa.recv()
	ze, pe := zs.GetSnapshot().GetEntries(), ps.GetSnapshot().GetEntries()
	if len(ze) != len(pe) || len(pe) != 200 {
		t.Fatalf("inflated snapshot has %d entries, plain %d; want 200", len(ze), len(pe))
	}
	for i := range ze {
		if !proto.Equal(ze[i], pe[i]) {
			t.Fatalf("inflated entry %d is %v, plain %v", i, ze[i], pe[i])
		}
	}
	za.ack(zs)
}
