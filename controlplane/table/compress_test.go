package table

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/proxyplane/proxyplane/controlplane/table/tabletest"
	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// TestCompressedSnapshotInflatesToPlain checks that a compressed snapshot,
// inflated as the agent inflates it, is byte for byte the plain snapshot
// of the same node, for nodes with and without entries special to them
// over a view of several runs; that it is much smaller; and that nodes of
// one zone share the runs' bytes rather than each getting a copy.
func TestCompressedSnapshotInflatesToPlain(t *testing.T) {
	// About 330 KB a table: several runs. Among 1,000 nodes most have
	// no entry special to them, some have one or two.
	c := newScaleCluster(1000, 2000)
	store := NewStore(100)
	store.Publish(c.buildAll(t), c.nodeMap)
	w := store.Current()
	if n := len(w.zoneView("").runs(hashed)); n < 3 {
		t.Fatalf("the view has %d runs; the test wants several", n)
	}
	for _, tc := range []struct {
		name string
		kind compression
		num  protowire.Number
	}{
		{"hashed", hashed, wire.SnapshotZstdEntries},
		{"unhashed", unhashed, wire.SnapshotZstdEntriesUnhashed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withSpecial := 0
			shared := map[*byte]int{} // first byte of each run referenced -> nodes
			for _, n := range c.nodes[:200] {
				plain, err := NewCursor(n.Name, w, Held{}, true, 100)
				if err != nil {
					t.Fatal(err)
				}
				compressed, err := NewCursor(n.Name, w, Held{}, true, 100)
				if err != nil {
					t.Fatal(err)
				}
				if tc.kind == unhashed {
					compressed.CompressSnapshotsUnhashed()
				} else {
					compressed.CompressSnapshots()
				}
				rp, rc := plain.Next(), compressed.Next()
				if rc.Version != rp.Version || rc.Upserts != rp.Upserts || !rc.TriggerTime.Equal(rp.TriggerTime) || rc.ResourceVersion != rp.ResourceVersion {
					t.Fatalf("%s: compressed response %+v, plain %+v: want the same version, counts and times", n.Name, rc, rp)
				}
				special := len(w.index().special[n.Name])
				if special == 0 && rc.Body.Len()*3 > rp.Body.Len() {
					t.Errorf("%s: compressed snapshot is %d bytes, plain %d: want under a third", n.Name, rc.Body.Len(), rp.Body.Len())
				}
				got := tabletest.InflateSnapshot(t, rc.Body.Bytes())
				if want := rp.Body.Bytes(); !bytes.Equal(got, want) {
					t.Fatalf("%s: inflated snapshot differs from the plain one (%d bytes, want %d)", n.Name, len(got), len(want))
				}
				if special > 0 {
					withSpecial++
				}
				for _, p := range rc.Body {
					if len(p) > 0 && protowire.Number(p[0]>>3) == tc.num {
						shared[&p[0]]++
					}
				}
			}
			if withSpecial == 0 {
				t.Error("no node has entries special to it; the test wants some")
			}
			most := 0
			for _, n := range shared {
				most = max(most, n)
			}
			if most < 2 {
				t.Errorf("no run is referenced by more than %d snapshots: the runs are not shared", most)
			}
		})
	}
}

// TestUnhashedRunsAreSmaller checks that leaving the hashes out of the
// compressed runs saves what they cost: a third of the view at least (8
// bytes of entropy per entry, about 40% of a compressed hashed view).
func TestUnhashedRunsAreSmaller(t *testing.T) {
	c := newScaleCluster(100, 2000)
	store := NewStore(100)
	store.Publish(c.buildAll(t), c.nodeMap)
	zv := store.Current().zoneView("")
	size := func(k compression) (n int) {
		for _, r := range zv.runs(k) {
			n += len(r.field)
		}
		return n
	}
	h, u := size(hashed), size(unhashed)
	if 3*u > 2*h {
		t.Errorf("the view's unhashed runs are %d bytes, hashed %d: want a third less at least", u, h)
	}
	if len(zv.runs(hashed)) != len(zv.runs(unhashed)) {
		t.Errorf("%d hashed runs, %d unhashed: want the same cut", len(zv.runs(hashed)), len(zv.runs(unhashed)))
	}
}

// TestDeltasStayPlain checks that a compressing cursor sends deltas as
// they are.
func TestDeltasStayPlain(t *testing.T) {
	store := NewStore(100)
	a, b := simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")
	store.Publish(services(a, b), nil)
	sub := store.Subscribe()
	w, _ := sub.Take()
	cur, err := NewCursor("node-1", w, Held{}, true, 100)
	if err != nil {
		t.Fatal(err)
	}
	cur.CompressSnapshots()
	r := cur.Next()
	if err := cur.Ack(r.Version); err != nil {
		t.Fatal(err)
	}
	store.Publish(services(simpleService(t, "a", "10.0.0.3")), nil)
	cur.Update(sub.Take())
	d := decodeDelta(t, cur.Next())
	if len(d.GetUpserts()) != 1 {
		t.Fatalf("delta upserts %d entries, want 1 plain entry", len(d.GetUpserts()))
	}
}

// BenchmarkCompressView measures compress.go's choices on a zone view of
// the mixed 10,000-Service world, for runs without hashes (what nodeagent
// gets): zstd's level and the run size. ns/op is one compression of the
// view (once per view per world); view-B is its compressed runs; node-B
// the average snapshot body of the world's nodes, whose runs holding
// entries special to them go plain (every node taken to be of the view's
// zone), at 1,000 and 5,000 nodes. docs/benchmarks.md records it.
func BenchmarkCompressView(b *testing.B) {
	for _, nodes := range []int{1000, 5000} {
		c := newScaleCluster(nodes, 10000)
		store := NewStore(100)
		store.Publish(c.buildAll(b), c.nodeMap)
		w := store.Current()
		zv := w.zoneView("zone-a")
		for _, lvl := range []zstd.EncoderLevel{zstd.SpeedFastest, zstd.SpeedDefault, zstd.SpeedBestCompression} {
			enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(lvl), zstd.WithSingleSegment(true))
			if err != nil {
				b.Fatal(err)
			}
			for _, size := range []int{16 << 10, 32 << 10, 64 << 10} {
				b.Run(fmt.Sprintf("nodes=%d/level=%s/run=%dKiB", nodes, lvl, size>>10), func(b *testing.B) {
					var runs []run
					for b.Loop() {
						runs = zv.cut(unhashed, enc, size)
					}
					view, extra := 0, 0
					for _, r := range runs {
						view += len(r.field)
					}
					for _, n := range c.nodes {
						special := w.index().special[n.Name]
						j := 0
						for _, r := range runs {
							k := j
							for k < len(special) && special[k] < r.end {
								k++
							}
							if k > j {
								extra += zv.offsets[r.end] - zv.offsets[r.first] - len(r.field)
							}
							j = k
						}
					}
					b.ReportMetric(float64(view), "view-B")
					b.ReportMetric(float64(view+extra/len(c.nodes)), "node-B")
				})
			}
		}
	}
}
