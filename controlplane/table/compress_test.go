package table

import (
	"bytes"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// inflateSnapshot returns the encoded Snapshot b with its compressed
// entries inflated in place, as the agent does (nodeagent/client.Inflate,
// which the control plane may not import).
func inflateSnapshot(t testing.TB, b []byte) []byte {
	t.Helper()
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	var out []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("snapshot: %v", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			t.Fatalf("snapshot: %v", protowire.ParseError(m))
		}
		if num == wire.SnapshotZstdEntries {
			frame, _ := protowire.ConsumeBytes(b[n:])
			if out, err = dec.DecodeAll(frame, out); err != nil {
				t.Fatalf("inflating: %v", err)
			}
		} else {
			out = append(out, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return out
}

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
	if n := len(w.zoneView("").runs()); n < 3 {
		t.Fatalf("the view has %d runs; the test wants several", n)
	}
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
		compressed.CompressSnapshots()
		rp, rc := plain.Next(), compressed.Next()
		if rc.Version != rp.Version || rc.Upserts != rp.Upserts || !rc.TriggerTime.Equal(rp.TriggerTime) || rc.ResourceVersion != rp.ResourceVersion {
			t.Fatalf("%s: compressed response %+v, plain %+v: want the same version, counts and times", n.Name, rc, rp)
		}
		special := len(w.index().special[n.Name])
		if special == 0 && rc.Body.Len()*3 > rp.Body.Len() {
			t.Errorf("%s: compressed snapshot is %d bytes, plain %d: want under a third", n.Name, rc.Body.Len(), rp.Body.Len())
		}
		got := inflateSnapshot(t, rc.Body.Bytes())
		if want := rp.Body.Bytes(); !bytes.Equal(got, want) {
			t.Fatalf("%s: inflated snapshot differs from the plain one (%d bytes, want %d)", n.Name, len(got), len(want))
		}
		if special > 0 {
			withSpecial++
		}
		for _, p := range rc.Body {
			if len(p) > 0 && protowire.Number(p[0]>>3) == wire.SnapshotZstdEntries {
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
