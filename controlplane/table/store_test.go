package table

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// woken reports whether sub's wake channel is closed: a newer world than
// the one last taken exists.
func woken(sub *Subscription) bool {
	select {
	case <-sub.Wake():
		return true
	default:
		return false
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// checkPending checks that p records exactly want (key to old state).
func checkPending(t *testing.T, p Pending, want map[string]*compute.Service) {
	t.Helper()
	if p.Overflow {
		t.Fatalf("pending overflowed, want %d services", len(want))
	}
	if p.Len() != len(want) {
		t.Fatalf("pending %v, want keys %v", slices.Sorted(maps.Keys(p.Services)), slices.Sorted(maps.Keys(want)))
	}
	for k, old := range want {
		got, ok := p.Services[k]
		if !ok {
			t.Errorf("pending lacks %s", k)
		} else if got != old {
			t.Errorf("pending %s: got state %p, want %p", k, got, old)
		}
	}
}

func TestStoreFirstPublish(t *testing.T) {
	s := NewStore(testMaxPending)
	if isClosed(s.Ready()) {
		t.Fatal("Ready closed before the first publish")
	}
	if s.Current() != nil {
		t.Fatal("Current before the first publish is not nil")
	}
	a, b := simpleService(t, "b", "10.0.0.1"), simpleService(t, "a", "10.0.0.2")
	n1 := buildNode(t, "n1", "a")
	if gs, gn := s.Publish(services(a, b), nodes(n1)); gs != 2 || gn != 1 {
		t.Errorf("Publish changed %d services and %d nodes, want 2 and 1", gs, gn)
	}
	if !isClosed(s.Ready()) {
		t.Fatal("Ready not closed after the first publish")
	}
	w := s.Current()
	if w == nil || w.Revision != 1 {
		t.Fatalf("world %+v, want revision 1", w)
	}
	if w.Service(a.Key) != a || w.Service(b.Key) != b || w.Service(key("nope")) != nil {
		t.Error("world does not hold the published services")
	}
	if w.Len() != 2 || !slices.Equal(w.Keys(), []string{key("a"), key("b")}) {
		t.Errorf("world len %d keys %v, want 2 sorted keys", w.Len(), w.Keys())
	}
	if !w.Known("n1") || w.Node("n1") != n1 || w.Known("n2") {
		t.Error("world does not hold exactly node n1")
	}
	if got := w.Node("n2"); got.Name != "n2" || got.Zone != "" || !got.Equal(compute.BuildNode("n2", nil)) {
		t.Errorf("unknown node n2: got %+v, want a bare NodeInfo", got)
	}
	if !slices.Equal(w.NodeNames(), []string{"n1"}) {
		t.Errorf("node names %v, want [n1]", w.NodeNames())
	}

	// A second publish of the same content makes no world.
	if gs, gn := s.Publish(services(simpleService(t, "a", "10.0.0.2")), nodes(buildNode(t, "n1", "a"))); gs != 0 || gn != 0 {
		t.Errorf("equal publish changed %d services and %d nodes, want none", gs, gn)
	}
	if s.Current() != w {
		t.Error("an equal publish replaced the world")
	}
}

func TestStoreFirstPublishEmpty(t *testing.T) {
	s := NewStore(testMaxPending)
	if gs, gn := s.Publish(nil, nil); gs != 0 || gn != 0 {
		t.Errorf("Publish changed %d services and %d nodes, want none", gs, gn)
	}
	if !isClosed(s.Ready()) {
		t.Fatal("Ready not closed after an empty first publish")
	}
	if w := s.Current(); w == nil || w.Revision != 1 || w.Len() != 0 {
		t.Fatalf("world %+v, want an empty revision 1", w)
	}
	s.Publish(nil, nil)
	if w := s.Current(); w.Revision != 1 {
		t.Errorf("revision %d after an empty second publish, want 1", w.Revision)
	}
}

func TestStoreEqualPublishWakesNobody(t *testing.T) {
	for _, tc := range []struct {
		name     string
		services func(t *testing.T) map[string]*compute.Service
		nodes    func(t *testing.T) map[string]*compute.Node
	}{
		{
			name: "rebuilt equal service",
			services: func(t *testing.T) map[string]*compute.Service {
				t.Helper()
				return services(simpleService(t, "a", "10.0.0.1"))
			},
		},
		{
			// The trigger time is not part of any view.
			name: "only the trigger time differs",
			services: func(t *testing.T) map[string]*compute.Service {
				t.Helper()
				return services(buildService(t, svcSpec{name: "a", trigger: "2025-03-01T10:00:00Z", eps: []epSpec{{ip: "10.0.0.1"}}}))
			},
		},
		{
			name:     "removal of an unknown service",
			services: func(*testing.T) map[string]*compute.Service { return removed(key("nope")) },
		},
		{
			name: "rebuilt equal node",
			nodes: func(t *testing.T) map[string]*compute.Node {
				t.Helper()
				return nodes(buildNode(t, "n1", "a"))
			},
		},
		{
			name:  "removal of an unknown node",
			nodes: func(*testing.T) map[string]*compute.Node { return map[string]*compute.Node{"n9": nil} },
		},
		{name: "nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(testMaxPending)
			s.Publish(services(simpleService(t, "a", "10.0.0.1")), nodes(buildNode(t, "n1", "a")))
			w := s.Current()
			subs := []*Subscription{s.Subscribe(), s.Subscribe()}
			var svcs map[string]*compute.Service
			var ns map[string]*compute.Node
			if tc.services != nil {
				svcs = tc.services(t)
			}
			if tc.nodes != nil {
				ns = tc.nodes(t)
			}
			if gs, gn := s.Publish(svcs, ns); gs != 0 || gn != 0 {
				t.Errorf("Publish changed %d services and %d nodes, want none", gs, gn)
			}
			if s.Current() != w || w.Revision != 1 {
				t.Error("an equal publish made a new world")
			}
			for i, sub := range subs {
				if woken(sub) {
					t.Errorf("subscription %d woken", i)
				}
				gw, p := sub.Take()
				if gw != w || p.Len() != 0 || p.Overflow {
					t.Errorf("Take: world revision %d, pending %+v; want the first world and nothing", gw.Revision, p)
				}
			}
		})
	}
}

func TestStoreChangeWakesEverySubscription(t *testing.T) {
	s := NewStore(testMaxPending)
	a1, b := simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")
	s.Publish(services(a1, b), nodes(buildNode(t, "n1", "a"), buildNode(t, "n2", "b")))
	subs := []*Subscription{s.Subscribe(), s.Subscribe(), s.Subscribe()}
	for i, sub := range subs {
		if w, p := sub.Take(); w != s.Current() || p.Len() != 0 || p.Overflow {
			t.Fatalf("first Take of subscription %d: want the current world with nothing pending", i)
		}
	}

	a2, c := simpleService(t, "a", "10.0.0.9"), simpleService(t, "c", "10.0.0.3")
	if gs, gn := s.Publish(services(a2, b, c), nil); gs != 2 || gn != 0 {
		t.Errorf("Publish changed %d services and %d nodes, want 2 and 0", gs, gn)
	}
	w := s.Current()
	if w.Revision != 2 || w.Service(key("a")) != a2 || w.Service(key("c")) != c || w.Service(key("b")) != b {
		t.Fatalf("world revision %d does not hold the change", w.Revision)
	}
	for i, sub := range subs {
		if !woken(sub) {
			t.Errorf("subscription %d not woken", i)
		}
		gw, p := sub.Take()
		if gw != w {
			t.Errorf("Take of subscription %d: world revision %d, want %d", i, gw.Revision, w.Revision)
		}
		checkPending(t, p, map[string]*compute.Service{key("a"): a1, key("c"): nil})
		if woken(sub) {
			t.Errorf("subscription %d still woken after Take", i)
		}
		if _, p := sub.Take(); p.Len() != 0 || p.Overflow {
			t.Errorf("second Take of subscription %d: pending %+v, want nothing", i, p)
		}
	}
}

// TestStoreNodeChange checks that a Node change makes a new world that
// wakes every subscription (one close wakes them all; each cursor then
// compares its own node) with no Service pending.
func TestStoreNodeChange(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1")), nodes(buildNode(t, "n1", "a"), buildNode(t, "n2", "a")))
	subs := []*Subscription{s.Subscribe(), s.Subscribe()}

	n1 := buildNode(t, "n1", "b")
	if gs, gn := s.Publish(nil, nodes(n1)); gs != 0 || gn != 1 {
		t.Errorf("Publish changed %d services and %d nodes, want 0 and 1", gs, gn)
	}
	for i, sub := range subs {
		if !woken(sub) {
			t.Fatalf("subscription %d not woken", i)
		}
		w, p := sub.Take()
		if w != s.Current() || w.Revision != 2 || w.Node("n1") != n1 {
			t.Errorf("Take %d: world revision %d, want the new world with the new node", i, w.Revision)
		}
		if p.Len() != 0 || p.Overflow {
			t.Errorf("Take %d: pending %+v, want no services", i, p)
		}
	}

	// Removing the node is a change too: it reverts to a bare NodeInfo.
	if _, gn := s.Publish(nil, map[string]*compute.Node{"n1": nil}); gn != 1 {
		t.Errorf("node removal changed %d nodes, want 1", gn)
	}
	if !woken(subs[0]) {
		t.Error("node removal woke nobody")
	}
	if w := s.Current(); w.Known("n1") || !w.Node("n1").Equal(compute.BuildNode("n1", nil)) {
		t.Error("removed node still known")
	}
}

func TestStoreCoalescesKeepingTheOldestState(t *testing.T) {
	s := NewStore(testMaxPending)
	a1 := simpleService(t, "a", "10.0.0.1")
	s.Publish(services(a1), nil)
	sub := s.Subscribe()

	s.Publish(services(simpleService(t, "a", "10.0.0.2"), simpleService(t, "b", "10.0.0.5")), nil)
	s.Publish(services(simpleService(t, "a", "10.0.0.3"), simpleService(t, "b", "10.0.0.6")), nil)
	s.Publish(removed(key("a")), nil)
	if !woken(sub) {
		t.Fatal("not woken")
	}
	w, p := sub.Take()
	if w != s.Current() || w.Revision != 4 {
		t.Errorf("Take: world revision %d, want the latest (4)", w.Revision)
	}
	// a keeps its state before the first change; b, new since then, nil.
	checkPending(t, p, map[string]*compute.Service{key("a"): a1, key("b"): nil})
}

func TestStoreOverflow(t *testing.T) {
	const limit = 2
	for _, tc := range []struct {
		name     string
		batches  [][]string // services changed by each publish
		overflow bool
	}{
		{name: "at the limit", batches: [][]string{{"a", "b"}}},
		{name: "at the limit across publishes", batches: [][]string{{"a"}, {"b"}, {"a", "b"}}},
		{name: "past the limit in one publish", batches: [][]string{{"a", "b", "c"}}, overflow: true},
		{name: "past the limit across publishes", batches: [][]string{{"a", "b"}, {"c"}}, overflow: true},
		{name: "overflow is sticky", batches: [][]string{{"a", "b", "c"}, {"a"}}, overflow: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(limit)
			s.Publish(nil, nil)
			sub := s.Subscribe()
			for i, batch := range tc.batches {
				var svcs []*compute.Service
				for _, name := range batch {
					svcs = append(svcs, simpleService(t, name, "10.0.0.1", "10.0.1."+string(rune('0'+i))))
				}
				s.Publish(services(svcs...), nil)
			}
			if !woken(sub) {
				t.Fatal("not woken")
			}
			_, p := sub.Take()
			if p.Overflow != tc.overflow {
				t.Fatalf("overflow %v, want %v", p.Overflow, tc.overflow)
			}
			if tc.overflow && p.Services != nil {
				t.Errorf("overflowed pending keeps %d services, want none", p.Len())
			}
			if !tc.overflow && p.Len() == 0 {
				t.Error("pending records nothing")
			}

			// Take resets: the next change records normally.
			old := s.Current().Service(key("a"))
			s.Publish(services(simpleService(t, "a", "10.9.9.9")), nil)
			if !woken(sub) {
				t.Fatal("not woken after Take")
			}
			_, p = sub.Take()
			checkPending(t, p, map[string]*compute.Service{key("a"): old})
		})
	}
}

func TestStoreRemoval(t *testing.T) {
	s := NewStore(testMaxPending)
	a, b := simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")
	s.Publish(services(a, b), nil)
	before := s.Current()
	sub := s.Subscribe()

	if gs, _ := s.Publish(removed(key("a")), nil); gs != 1 {
		t.Errorf("removal changed %d services, want 1", gs)
	}
	w := s.Current()
	if w.Service(key("a")) != nil || w.Len() != 1 || !slices.Equal(w.Keys(), []string{key("b")}) {
		t.Errorf("world after removal: len %d keys %v, want only %s", w.Len(), w.Keys(), key("b"))
	}
	if before.Service(key("a")) != a || before.Len() != 2 || !slices.Equal(before.Keys(), []string{key("a"), key("b")}) {
		t.Error("removal modified the previous world")
	}
	if !woken(sub) {
		t.Fatal("not woken by a removal")
	}
	_, p := sub.Take()
	checkPending(t, p, map[string]*compute.Service{key("a"): a})
}

// TestStoreConcurrentSubscribers runs a publisher and one stream goroutine
// per agent at once (for the race detector) and checks that every agent
// ends with its node's table of the last world.
func TestStoreConcurrentSubscribers(t *testing.T) {
	const changes = 200
	s := NewStore(4)
	s.Publish(services(simpleService(t, "a", "10.0.0.1")),
		nodes(buildNode(t, "n1", "a"), buildNode(t, "n2", "b"), buildNode(t, "n3", "a")))

	// Build every state up front: t.Fatal belongs to the test goroutine.
	var states []map[string]*compute.Service
	for i := range changes {
		name := fmt.Sprintf("s%d", i%7)
		switch {
		case i%11 == 10:
			states = append(states, removed(key(name)))
		case i%3 == 0:
			states = append(states, services(zonedService(t, name, []string{fmt.Sprintf("10.1.0.%d", i)}, []string{"10.2.0.1"})))
		default:
			states = append(states, services(simpleService(t, name, fmt.Sprintf("10.0.%d.%d", i%7, i))))
		}
	}

	type result struct {
		node  string
		agent agent
		err   error
	}
	names := []string{"n1", "n2", "n3"}
	done := make(chan struct{})
	results := make(chan result, len(names))
	for _, name := range names {
		sub := s.Subscribe()
		go func() {
			res := result{node: name}
			defer func() { results <- res }()
			w, p := sub.Take()
			c, err := NewCursor(name, w, Held{}, true, 4)
			if err != nil {
				res.err = err
				return
			}
			c.Update(w, p)
			a := &res.agent
			step := func() error {
				for r := c.Next(); r != nil; r = c.Next() {
					if err := a.applyErr(r); err != nil {
						return err
					}
					if err := c.Ack(r.Version); err != nil {
						return err
					}
				}
				return nil
			}
			for {
				select {
				case <-sub.Wake():
				case <-done:
					// The last publish happened before done closed.
					w, p := sub.Take()
					c.Update(w, p)
					res.err = step()
					return
				}
				w, p := sub.Take()
				c.Update(w, p)
				if res.err = step(); res.err != nil {
					return
				}
			}
		}()
	}
	for _, st := range states {
		s.Publish(st, nil)
	}
	close(done)
	for range names {
		res := <-results
		if res.err != nil {
			t.Fatalf("agent of %s: %v", res.node, res.err)
		}
		checkAgentCurrent(t, &res.agent, s.Current(), res.node)
	}
}

// A world's resource version rises with publishes that observed the
// cluster further, changed or not, and never moves once a newer world
// exists: a response built from an older world claims no more than it
// holds.
func TestStoreResourceVersion(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Apply(Update{ResourceVersion: 10, Services: services(simpleService(t, "a", "10.0.0.1"))})
	w1 := s.Current()
	if got := w1.ResourceVersion(); got != 10 {
		t.Fatalf("first world: resource version %d, want 10", got)
	}
	s.Apply(Update{ResourceVersion: 15}) // nothing changed, observed further
	if s.Current() != w1 || w1.ResourceVersion() != 15 {
		t.Fatalf("after an empty update through 15: same world %v, resource version %d", s.Current() == w1, w1.ResourceVersion())
	}
	s.Apply(Update{ResourceVersion: 12}) // never falls
	if got := w1.ResourceVersion(); got != 15 {
		t.Fatalf("after an update through 12: resource version %d, want 15", got)
	}
	s.Publish(services(simpleService(t, "b", "10.0.0.2")), nil) // observed nothing new
	w2 := s.Current()
	if w2 == w1 || w2.ResourceVersion() != 15 {
		t.Fatalf("a publish without a resource version: new world %v, resource version %d, want 15", w2 != w1, w2.ResourceVersion())
	}
	s.Apply(Update{ResourceVersion: 30})
	if w1.ResourceVersion() != 15 || w2.ResourceVersion() != 30 {
		t.Fatalf("after an update through 30: old world %d (want 15), latest %d (want 30)", w1.ResourceVersion(), w2.ResourceVersion())
	}
}

// Snapshots and deltas carry the resource version of the world they were
// built from (decodeSnapshot and decodeDelta check the encoding).
func TestCursorSendsResourceVersion(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Apply(Update{ResourceVersion: 7, Services: services(simpleService(t, "a", "10.0.0.1")), Nodes: nodes(buildNode(t, "n1", "a"))})
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	snap := p.next()
	if got := decodeSnapshot(t, snap).GetResourceVersion(); got != 7 {
		t.Fatalf("snapshot resource_version %d, want 7", got)
	}
	p.ack(snap)
	s.Apply(Update{ResourceVersion: 9, Services: services(simpleService(t, "b", "10.0.0.2"))})
	if got := decodeDelta(t, p.next()).GetResourceVersion(); got != 9 {
		t.Fatalf("delta resource_version %d, want 9", got)
	}
}
