package hashtable

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func entries(n int, edit map[int]uint64) []*pb.ServiceEntry {
	out := make([]*pb.ServiceEntry, n)
	for i := range out {
		h := uint64(1000 + i)
		if v, ok := edit[i]; ok {
			h = v
		}
		out[i] = &pb.ServiceEntry{Key: fmt.Sprintf("ns/svc-%d", i), Hash: h}
	}
	return out
}

func content(t *Table) map[string]uint64 {
	m := map[string]uint64{}
	t.Range(func(k string, h uint64) bool { m[k] = h; return true })
	return m
}

func TestSnapshotShares(t *testing.T) {
	in := NewInterner()
	a := in.Snapshot(entries(1000, nil))
	b := in.Snapshot(entries(1000, nil))
	if a != b {
		t.Fatal("equal snapshots gave two tables")
	}
	c := in.Snapshot(entries(1000, map[int]uint64{7: 1}))
	if c == a {
		t.Fatal("different snapshots gave one table")
	}
	shared := 0
	for i := range a.buckets {
		if a.buckets[i] == c.buckets[i] {
			shared++
		}
	}
	if shared < nBuckets-1 {
		t.Errorf("tables one entry apart share %d of %d buckets", shared, nBuckets)
	}
	if h, ok := c.Get("ns/svc-7"); !ok || h != 1 || c.Len() != 1000 {
		t.Errorf("Get = %d, %v; Len = %d", h, ok, c.Len())
	}
}

func TestApply(t *testing.T) {
	in := NewInterner()
	base := in.Snapshot(entries(100, nil))
	up := []*pb.ServiceEntry{{Key: "ns/svc-3", Hash: 5}, {Key: "ns/new", Hash: 9}}
	next, err := in.Apply(base, up, []string{"ns/svc-4"})
	if err != nil {
		t.Fatal(err)
	}
	want := content(base)
	want["ns/svc-3"], want["ns/new"] = 5, 9
	delete(want, "ns/svc-4")
	if got := content(next); !maps.Equal(got, want) {
		t.Errorf("content differs")
	}
	var sum uint64
	for _, h := range want {
		sum += h
	}
	if next.Sum() != sum || next.Len() != len(want) {
		t.Errorf("sum %d len %d, want %d %d", next.Sum(), next.Len(), sum, len(want))
	}
	if base.Len() != 100 {
		t.Error("Apply changed its base")
	}
	again, err := in.Apply(base, slices.Clone(up), []string{"ns/svc-4"})
	if err != nil || again != next {
		t.Errorf("the same delta on the same base was not found interned: %v", err)
	}
	if _, err := in.Apply(base, nil, []string{"ns/none"}); !errors.Is(err, ErrUnknownRemoval) {
		t.Errorf("error %v, want ErrUnknownRemoval", err)
	}
	// A delta back to base's content finds base.
	back, err := in.Apply(next, []*pb.ServiceEntry{{Key: "ns/svc-3", Hash: 1003}, {Key: "ns/svc-4", Hash: 1004}}, []string{"ns/new"})
	if err != nil || back != base {
		t.Errorf("delta back to the base's content gave another table (%v)", err)
	}
}

func TestHelloParts(t *testing.T) {
	in := NewInterner()
	tab := in.Snapshot(entries(500, nil))
	var wire []byte
	for _, p := range tab.HelloParts() {
		wire = append(wire, p...)
	}
	var h pb.Hello
	if err := proto.Unmarshal(wire, &h); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(h.GetEntryHashes(), content(tab)) {
		t.Error("encoded entry hashes differ from the table")
	}
}
