package table

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// naiveSnapshot encodes node's snapshot entry by entry, as if no view were
// shared: what a spliced snapshot must equal byte for byte.
func naiveSnapshot(w *World, node *compute.Node) (uint64, []byte) {
	version := node.Hash
	for _, k := range w.Keys() {
		version += w.Service(k).EntryFor(node).Hash
	}
	b := appendString(nil, wire.SnapshotVersion, compute.FormatVersion(version))
	b = appendMessage(b, wire.SnapshotNode, node.Bytes)
	for _, k := range w.Keys() {
		svc := w.Service(k)
		b = appendEntry(b, wire.SnapshotEntries, k, svc.EntryFor(node), svc.TriggerTime)
	}
	return version, b
}

// TestSnapshotSplicesZoneViews checks that every node's snapshot, built
// from its zone's shared view with its own entries spliced in, is exactly
// the table encoded entry by entry, for nodes that zone hints, node hints
// and Local policies single out, nodes in zones no hint names, nodes
// without a zone and nodes without a Node object.
func TestSnapshotSplicesZoneViews(t *testing.T) {
	rng := rand.New(rand.NewPCG(20261124, 1))
	names := []string{"n1", "n2", "n3", "n4", "n5", "n6"}
	zones := map[string]string{"n1": "a", "n2": "a", "n3": "b", "n4": "c", "n5": ""}
	// n6 has no Node object; "c" is named by no hint.
	var svcs []*compute.Service
	for i := range 60 {
		spec := svcSpec{
			name: fmt.Sprintf("svc%02d", i), clusterIP: fmt.Sprintf("10.96.0.%d", i+1),
			trigger: fmt.Sprintf("2026-11-24T10:%02d:00Z", i),
		}
		kind := i % 5
		if kind == 3 {
			spec.local = true
		}
		for j := range 1 + rng.IntN(3) {
			e := epSpec{ip: fmt.Sprintf("10.%d.%d.1", i, j), node: names[rng.IntN(len(names))]}
			switch kind {
			case 1:
				e.zone = []string{"a", "b"}[rng.IntN(2)]
			case 2:
				e.nodeHint = names[rng.IntN(len(names))]
				e.zone = []string{"a", "b"}[rng.IntN(2)]
			case 4:
				e.notReady = rng.IntN(3) == 0
			}
			spec.eps = append(spec.eps, e)
		}
		svcs = append(svcs, buildService(t, spec))
	}
	var ns []*compute.Node
	for _, n := range names[:5] {
		ns = append(ns, buildNode(t, n, zones[n]))
	}
	s := NewStore(testMaxPending)
	s.Publish(services(svcs...), nodes(ns...))
	w := s.Current()

	specials := 0
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			node := w.Node(name)
			specials += len(w.index().special[name])
			wantVersion, want := naiveSnapshot(w, node)
			c, err := NewCursor(name, w, Held{}, true, testMaxPending)
			if err != nil {
				t.Fatal(err)
			}
			r := c.Next()
			if r == nil || !r.Snapshot {
				t.Fatalf("want a snapshot, got %+v", r)
			}
			if r.Version != wantVersion || w.Version(node) != wantVersion {
				t.Errorf("version %016x, World.Version %016x, want %016x", r.Version, w.Version(node), wantVersion)
			}
			if got := r.Body.Bytes(); !bytes.Equal(got, want) {
				t.Errorf("spliced snapshot (%d bytes in %d pieces) differs from the entry-by-entry encoding (%d bytes)",
					len(got), len(r.Body), len(want))
			}
		})
	}
	if specials == 0 {
		t.Fatal("no node has entries of its own: the test splices nothing")
	}
	if len(w.index().zones) != 2 {
		t.Errorf("hinted zones %v, want a and b", w.index().zones)
	}
}
