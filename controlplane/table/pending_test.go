package table

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// TestOneWorldsChangesAreBorrowed: taking one world, the common case for
// every stream, copies nothing: neither Take nor the cursor's merge
// allocates a map of the changes. Two worlds taken at once still hold
// both worlds' changes, without writing into either world's own.
func TestOneWorldsChangesAreBorrowed(t *testing.T) {
	store := NewStore(100)
	a, b := simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")
	store.Publish(services(a, b), nodes(buildNode(t, "node-1", "z1")))
	sub := store.Subscribe()
	sub.Take()
	store.Publish(services(simpleService(t, "a", "10.0.0.9")), nil)

	at := *sub // to take the same world again and again
	allocs := testing.AllocsPerRun(100, func() {
		s := at
		_, p := s.Take()
		var cur Pending // a cursor's pending after an ACK
		cur.merge(p, 100)
		if cur.Len() != 1 || cur.Services[key("a")] != a {
			t.Fatalf("pending %v, want a's state before the change", cur.Services)
		}
	})
	if allocs != 0 {
		t.Errorf("taking one world and merging its changes: %v allocations, want none", allocs)
	}

	// A second world before the next Take: both changes, the older
	// state kept, and the first world's own record untouched.
	store.Publish(services(simpleService(t, "b", "10.0.0.8")), nil)
	_, p := sub.Take()
	if p.Len() != 2 || p.Services[key("a")] != a || p.Services[key("b")] != b {
		t.Errorf("two worlds taken at once: %v, want a and b as they were", p.Services)
	}
	if first := at.at.changed; len(first) != 1 {
		t.Errorf("the first world's changes were written to: %v", first)
	}
	// Merging into a pending that borrows leaves the lender alone too.
	s := at
	_, one := s.Take()
	var cur Pending
	cur.merge(one, 100)
	cur.merge(p, 100)
	if cur.Len() != 2 || len(at.at.changed) != 1 {
		t.Errorf("merged %v; the world's changes now %v", cur.Services, at.at.changed)
	}
}

// TestAppendVersion: a version appended in place reads as FormatVersion's,
// and costs no allocation beyond the buffer's.
func TestAppendVersion(t *testing.T) {
	for _, v := range []uint64{0, 1, 0xdeadbeef, 1 << 63, ^uint64(0)} {
		got := appendVersion(nil, wire.DeltaVersion, v)
		if want := appendString(nil, wire.DeltaVersion, compute.FormatVersion(v)); !bytes.Equal(got, want) {
			t.Errorf("version %x: %q, want %q", v, got, want)
		}
	}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = appendVersion(buf[:0], wire.DeltaVersion, 0xfeed) }); n != 0 {
		t.Errorf("appendVersion: %v allocations, want none", n)
	}
}

// TestDeltaAllocations bounds what a delta costs a stream in allocations:
// taking the world, the cursor's merge, the delta's encoding (its keys,
// entries and body, the two versions written in place) and the ACK.
func TestDeltaAllocations(t *testing.T) {
	const runs = 50
	store := NewStore(100)
	store.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")), nodes(buildNode(t, "node-1", "z1")))
	sub := store.Subscribe()
	w, _ := sub.Take()
	c, err := NewCursor("node-1", w, Held{}, true, 100)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Next() // the snapshot
	if err := c.Ack(r.Version); err != nil {
		t.Fatal(err)
	}
	// One world per run (and AllocsPerRun's warm-up), taken in turn.
	type taken struct {
		w *World
		p Pending
	}
	var worlds []taken
	for i := range runs + 1 {
		store.Publish(services(simpleService(t, "a", fmt.Sprintf("10.0.1.%d", i+1))), nil)
		w, p := sub.Take()
		worlds = append(worlds, taken{w, p})
		// Another agent of the zone took the world first: the Service's
		// upsert is encoded once per world, not once per agent.
		w.deltaUpsert(key("a"), w.Service(key("a")), "z1")
	}
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		c.Update(worlds[i].w, worlds[i].p)
		i++
		r := c.Next()
		if r == nil || r.Snapshot || r.Upserts != 1 {
			t.Fatalf("response %+v, want a delta of one upsert", r)
		}
		if err := c.Ack(r.Version); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > maxDeltaAllocs {
		t.Errorf("a delta of one Service: %v allocations, want at most %d", allocs, maxDeltaAllocs)
	}
}

// maxDeltaAllocs bounds a delta of one Service: with the world's changes
// borrowed, the versions written in place, the upserts encoded once per
// world and view and a few keys sorted on the stack, it takes 4
// allocations (copying the changes and encoding per agent took 15).
const maxDeltaAllocs = 4

// TestDeltaUpsertsSharedPerZone: a delta's upserts, encoded once per
// world and view and shared by the agents of the zones that see it, are
// each agent's own view: per zone for hinted Services, the node's own
// for a Service special to it (a node hint, an internalTrafficPolicy
// Local endpoint on it), in key order with their trigger times. Only the
// shared ones are kept by the world, once per view.
func TestDeltaUpsertsSharedPerZone(t *testing.T) {
	s := NewStore(testMaxPending)
	build := func(ip string) map[string]*compute.Service {
		return services(
			zonedService(t, "a-zoned", []string{ip}, []string{"10.0.1.1"}),
			buildService(t, svcSpec{name: "b-hinted", trigger: "2026-11-27T10:00:00Z", eps: []epSpec{
				{ip: ip, nodeHint: "n5"}, {ip: "10.0.2.1", nodeHint: "n1"},
			}}),
			buildService(t, svcSpec{name: "c-local", local: true, eps: []epSpec{{ip: ip, node: "n3"}}}),
			simpleService(t, "d-plain", ip),
		)
	}
	s.Publish(build("10.0.0.1"), nodes(buildNode(t, "n1", "a"), buildNode(t, "n2", "a"),
		buildNode(t, "n3", "b"), buildNode(t, "n4", "c"), buildNode(t, "n5", "a")))
	var peers []*peer
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		p := connect(t, s, n, Held{}, true, testMaxPending)
		p.sync()
		peers = append(peers, p)
	}
	old := s.Current()
	s.Publish(build("10.0.0.9"), nil)
	w := s.Current()
	all := []string{key("a-zoned"), key("b-hinted"), key("c-local"), key("d-plain")}
	shared, own := map[upsertKey][]byte{}, 0
	for _, p := range peers {
		n := w.Node(p.node)
		var keys []string // those whose entry changed for n
		for _, k := range all {
			if w.Service(k).EntryFor(n).Hash != old.Service(k).EntryFor(n).Hash {
				keys = append(keys, k)
			}
		}
		r := p.next()
		d := decodeDelta(t, r)
		if got := entryKeys(d.GetUpserts()); !slices.Equal(got, keys) {
			t.Fatalf("%s: upserts %v, want %v", p.node, got, keys)
		}
		for i, k := range keys {
			checkEntry(t, d.GetUpserts()[i], w.Service(k), n)
			if w.Service(k).Special(n.Name) {
				own++
			} else {
				shared[upsertKey{k, w.Service(k).EntryFor(n).Shared}] = nil
			}
		}
		p.ack(r)
		checkAgentCurrent(t, &p.agent, w, p.node)
	}
	if own == 0 || len(shared) == 0 {
		t.Fatalf("%d upserts special to their node, %d shared: the test must have both", own, len(shared))
	}
	// The world keeps each shared upsert once per view (zone c's nodes
	// see what unhinted nodes do), and none special to a node.
	if got, want := upsertKeys(w.upserts), upsertKeys(shared); !slices.Equal(got, want) {
		t.Errorf("the world keeps upserts %v, want %v", got, want)
	}
	if len(shared) >= 3*len(all) {
		t.Errorf("%d views shared: the test must have zones that see the same entry", len(shared))
	}
}

func upsertKeys(m map[upsertKey][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, fmt.Sprintf("%s %p", k.key, k.part))
	}
	slices.Sort(out)
	return out
}
