package table

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// peer is one connected agent: its subscription, its cursor, and what the
// agent holds. It plays the stream goroutine's part.
type peer struct {
	t     *testing.T
	node  string
	sub   *Subscription
	cur   *Cursor
	agent agent
	held  *Response // sent and not yet answered, for tests that answer later
}

// inFlight reports whether r is the response c awaits an answer for.
func inFlight(c *Cursor, r *Response) bool {
	v, ok := c.InFlight()
	return ok && v == r.Version
}

// noneInFlight reports whether c awaits no answer.
func noneInFlight(c *Cursor) bool {
	_, ok := c.InFlight()
	return !ok
}

// connect subscribes an agent of node holding held (and a as its table).
func connect(t *testing.T, s *Store, node string, held Held, deltas bool, maxPending int) *peer {
	t.Helper()
	sub := s.Subscribe()
	w, pend := sub.Take()
	c, err := NewCursor(node, w, held, deltas, maxPending)
	if err != nil {
		t.Fatalf("new cursor: %v", err)
	}
	c.Update(w, pend)
	return &peer{t: t, node: node, sub: sub, cur: c}
}

// reconnect connects a new agent of node that holds what a holds.
func reconnect(t *testing.T, s *Store, node string, a agent, deltas bool, maxPending int) *peer {
	t.Helper()
	p := connect(t, s, node, a.held(), deltas, maxPending)
	p.agent = a
	p.agent.entries = maps.Clone(a.entries)
	return p
}

// next takes what the store recorded, if woken, and asks for the next
// response.
func (p *peer) next() *Response {
	select {
	case <-p.sub.Wake():
		w, pend := p.sub.Take()
		p.cur.Update(w, pend)
	default:
	}
	return p.cur.Next()
}

// ack applies r to the agent and acknowledges it.
func (p *peer) ack(r *Response) {
	p.t.Helper()
	p.agent.apply(p.t, r)
	if err := p.cur.Ack(r.Version); err != nil {
		p.t.Fatalf("ack: %v", err)
	}
}

// sync sends and acknowledges until nothing is left, and returns what was
// sent.
func (p *peer) sync() []*Response {
	p.t.Helper()
	var sent []*Response
	for r := p.next(); r != nil; r = p.next() {
		if len(sent) == 5 {
			p.t.Fatalf("agent of %s does not converge: %d responses", p.node, len(sent))
		}
		p.ack(r)
		sent = append(sent, r)
	}
	return sent
}

// expectNothing checks that the agent of p is sent nothing and is current.
func (p *peer) expectNothing() {
	p.t.Helper()
	if r := p.next(); r != nil {
		p.t.Fatalf("agent of %s: got a response (snapshot %v, %d upserts, %d removals), want none",
			p.node, r.Snapshot, r.Upserts, r.Removals)
	}
}

func TestCursorFreshAgentGetsSnapshot(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(
		simpleService(t, "u", "10.0.0.1"),
		zonedService(t, "z", []string{"10.0.1.1"}, []string{"10.0.1.2"}),
		buildService(t, svcSpec{name: "l", clusterIP: "10.96.0.5", local: true, eps: []epSpec{{ip: "10.0.2.1", node: "n1"}}}),
	), nodes(buildNode(t, "n1", "a"), buildNode(t, "n3", "b")))
	for _, tc := range []struct{ name, node string }{
		{name: "zone a", node: "n1"},
		{name: "zone b", node: "n3"},
		{name: "without a Node object", node: "ghost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := connect(t, s, tc.node, Held{}, true, testMaxPending)
			if _, ok := p.cur.AckedVersion(); ok {
				t.Error("fresh cursor reports an acknowledged version")
			}
			if p.cur.Current() {
				t.Error("fresh cursor is current")
			}
			r := p.next()
			snap := decodeSnapshot(t, r)
			w := s.Current()
			node := w.Node(tc.node)
			if want := w.Version(node); r.Version != want {
				t.Errorf("version %016x, want World.Version %016x", r.Version, want)
			}
			if snap.GetNode().GetHash() != node.Hash || snap.GetNode().GetName() != tc.node {
				t.Errorf("node %v, want %s with hash %016x", snap.GetNode(), tc.node, node.Hash)
			}
			if !slices.Equal(entryKeys(snap.GetEntries()), w.Keys()) {
				t.Errorf("entries %v, want %v", entryKeys(snap.GetEntries()), w.Keys())
			}
			for _, e := range snap.GetEntries() {
				checkEntry(t, e, w.Service(e.GetKey()), node)
			}
			if !inFlight(p.cur, r) {
				t.Error("InFlight is not the response sent")
			}
			p.ack(r)
			if v, ok := p.cur.AckedVersion(); !ok || v != r.Version {
				t.Errorf("acked version %016x (%v), want %016x", v, ok, r.Version)
			}
			if !p.cur.Current() || !noneInFlight(p.cur) {
				t.Error("not current after the ack")
			}
			p.expectNothing()
		})
	}
}

func TestCursorDeltaAfterAck(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")), nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()
	old := p.agent.version

	s.Publish(services(simpleService(t, "a", "10.0.0.1", "10.0.0.3")), nil)
	r := p.next()
	d := decodeDelta(t, r)
	w := s.Current()
	if r.Base != old {
		t.Errorf("base %016x, want the acked version %016x", r.Base, old)
	}
	if want := w.Version(w.Node("n1")); r.Version != want {
		t.Errorf("version %016x, want World.Version %016x", r.Version, want)
	}
	if r.Upserts != 1 || r.Removals != 0 || len(d.GetUpserts()) != 1 || d.GetUpserts()[0].GetKey() != key("a") {
		t.Fatalf("upserts %v, removals %v; want exactly %s", entryKeys(d.GetUpserts()), d.GetRemovals(), key("a"))
	}
	checkEntry(t, d.GetUpserts()[0], w.Service(key("a")), w.Node("n1"))
	if d.Node != nil {
		t.Errorf("node %v, want unset", d.GetNode())
	}
	p.ack(r)
	checkAgentCurrent(t, &p.agent, w, "n1")
	if !p.cur.Current() {
		t.Error("not current after the ack")
	}
	p.expectNothing()
}

// TestCursorUnchangedViewSendsNothing checks that an agent whose table a
// change leaves alone receives nothing, while agents whose table it
// changes receive it.
func TestCursorUnchangedViewSendsNothing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		before    func(t *testing.T) *compute.Service
		after     func(t *testing.T) *compute.Service
		unchanged string // node whose table stays the same
		changed   string // node whose table changes
	}{{
		name: "zone hinted endpoints of another zone",
		before: func(t *testing.T) *compute.Service {
			t.Helper()
			return zonedService(t, "z", []string{"10.0.0.1"}, []string{"10.0.1.1"})
		},
		after: func(t *testing.T) *compute.Service {
			t.Helper()
			return zonedService(t, "z", []string{"10.0.0.1"}, []string{"10.0.1.1", "10.0.1.2"})
		},
		unchanged: "n1",
		changed:   "n3",
	}, {
		name: "local endpoints of another node",
		before: func(t *testing.T) *compute.Service {
			t.Helper()
			return buildService(t, svcSpec{name: "l", local: true, eps: []epSpec{{ip: "10.0.0.1", node: "n1"}, {ip: "10.0.1.1", node: "n3"}}})
		},
		after: func(t *testing.T) *compute.Service {
			t.Helper()
			return buildService(t, svcSpec{name: "l", local: true, eps: []epSpec{{ip: "10.0.0.1", node: "n1"}, {ip: "10.0.1.9", node: "n3"}}})
		},
		unchanged: "n1",
		changed:   "n3",
	}, {
		name: "an unready endpoint",
		before: func(t *testing.T) *compute.Service {
			t.Helper()
			return simpleService(t, "u", "10.0.0.1")
		},
		after: func(t *testing.T) *compute.Service {
			t.Helper()
			return buildService(t, svcSpec{name: "u", eps: []epSpec{{ip: "10.0.0.1"}, {ip: "10.0.0.2", notReady: true}}})
		},
		unchanged: "n1",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(testMaxPending)
			other := simpleService(t, "other", "10.0.9.9")
			s.Publish(services(tc.before(t), other), nodes(buildNode(t, "n1", "a"), buildNode(t, "n3", "b")))
			quiet := connect(t, s, tc.unchanged, Held{}, true, testMaxPending)
			quiet.sync()
			var loud *peer
			if tc.changed != "" {
				loud = connect(t, s, tc.changed, Held{}, true, testMaxPending)
				loud.sync()
			}
			acked, _ := quiet.cur.AckedVersion()

			svc := tc.after(t)
			if gs, _ := s.Publish(services(svc), nil); gs != 1 {
				t.Fatalf("publish changed %d services, want 1", gs)
			}
			w := s.Current()
			quiet.expectNothing()
			if !quiet.cur.Current() {
				t.Error("unchanged agent not current")
			}
			if v, _ := quiet.cur.AckedVersion(); v != acked || v != w.Version(w.Node(tc.unchanged)) {
				t.Errorf("acked version %016x, want unchanged %016x", v, acked)
			}
			if loud != nil {
				r := loud.next()
				d := decodeDelta(t, r)
				if !slices.Equal(entryKeys(d.GetUpserts()), []string{svc.Key}) {
					t.Errorf("changed agent: upserts %v, want [%s]", entryKeys(d.GetUpserts()), svc.Key)
				}
				loud.ack(r)
				checkAgentCurrent(t, &loud.agent, w, tc.changed)
			}

			// The quiet cursor dropped the change from its base: the next
			// change is a one-entry delta that adds up.
			s.Publish(services(simpleService(t, "other", "10.0.9.8")), nil)
			r := quiet.next()
			d := decodeDelta(t, r)
			if r.Base != acked || !slices.Equal(entryKeys(d.GetUpserts()), []string{key("other")}) {
				t.Errorf("next delta: base %016x, upserts %v; want base %016x, [%s]", r.Base, entryKeys(d.GetUpserts()), acked, key("other"))
			}
			quiet.ack(r)
			checkAgentCurrent(t, &quiet.agent, s.Current(), tc.unchanged)
		})
	}
}

func TestCursorRemoval(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")), nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()
	old := p.agent.version

	s.Publish(removed(key("a")), nil)
	r := p.next()
	d := decodeDelta(t, r)
	if r.Base != old || r.Upserts != 0 || !slices.Equal(d.GetRemovals(), []string{key("a")}) {
		t.Errorf("base %016x, upserts %v, removals %v; want base %016x, only removal %s",
			r.Base, entryKeys(d.GetUpserts()), d.GetRemovals(), old, key("a"))
	}
	w := s.Current()
	if want := w.Version(w.Node("n1")); r.Version != want {
		t.Errorf("version %016x, want World.Version %016x", r.Version, want)
	}
	p.ack(r)
	checkAgentCurrent(t, &p.agent, w, "n1")

	// Added and removed while in flight: never sent at all.
	s.Publish(services(simpleService(t, "b", "10.0.0.9")), nil)
	r = p.next()
	s.Publish(services(simpleService(t, "tmp", "10.0.0.7")), nil)
	s.Publish(removed(key("tmp")), nil)
	if p.next() != nil {
		t.Fatal("response while one is in flight")
	}
	p.ack(r)
	p.expectNothing()
	checkAgentCurrent(t, &p.agent, s.Current(), "n1")
}

func TestCursorOneInFlight(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2"), simpleService(t, "c", "10.0.0.3")),
		nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()

	s.Publish(services(simpleService(t, "a", "10.0.0.11")), nil)
	r1 := p.next()
	decodeDelta(t, r1)
	s.Publish(services(simpleService(t, "b", "10.0.0.12")), nil)
	if p.next() != nil {
		t.Fatal("second response while one is in flight")
	}
	s.Publish(services(simpleService(t, "a", "10.0.0.21"), simpleService(t, "b", "10.0.0.22")), nil)
	s.Publish(removed(key("c")), nil)
	if p.next() != nil {
		t.Fatal("second response while one is in flight")
	}
	if !inFlight(p.cur, r1) {
		t.Fatal("InFlight is not the first response")
	}
	p.ack(r1)
	if p.cur.Current() {
		t.Error("current while changes are pending")
	}

	r2 := p.next()
	d := decodeDelta(t, r2)
	if r2.Base != r1.Version {
		t.Errorf("base %016x, want the acked version %016x", r2.Base, r1.Version)
	}
	if !slices.Equal(entryKeys(d.GetUpserts()), []string{key("a"), key("b")}) || !slices.Equal(d.GetRemovals(), []string{key("c")}) {
		t.Errorf("upserts %v, removals %v; want [a b] and [c] in one delta", entryKeys(d.GetUpserts()), d.GetRemovals())
	}
	p.ack(r2)
	checkAgentCurrent(t, &p.agent, s.Current(), "n1")
	p.expectNothing()
}

func TestCursorNack(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")), nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()
	base := p.agent.version

	s.Publish(services(simpleService(t, "a", "10.0.0.11")), nil)
	r1 := p.next()
	decodeDelta(t, r1)
	if err := p.cur.Nack(r1.Version); err != nil {
		t.Fatalf("nack: %v", err)
	}
	if !noneInFlight(p.cur) {
		t.Error("a response is in flight after the NACK")
	}
	if v, ok := p.cur.AckedVersion(); !ok || v != base {
		t.Errorf("acked version %016x (%v), want the base %016x", v, ok, base)
	}
	for range 2 {
		if r := p.next(); r != nil {
			t.Fatalf("after the NACK: got version %016x again", r.Version)
		}
	}
	if p.cur.Current() {
		t.Error("current after a NACK")
	}

	// A change to another Service: the delta still starts from the held
	// base and carries the rejected change too.
	s.Publish(services(simpleService(t, "b", "10.0.0.12")), nil)
	r2 := p.next()
	d := decodeDelta(t, r2)
	if r2.Version == r1.Version {
		t.Fatal("the NACKed version was sent again")
	}
	if r2.Base != base {
		t.Errorf("base %016x, want the held base %016x", r2.Base, base)
	}
	if !slices.Equal(entryKeys(d.GetUpserts()), []string{key("a"), key("b")}) {
		t.Errorf("upserts %v, want [a b]", entryKeys(d.GetUpserts()))
	}
	w := s.Current()
	if want := w.Version(w.Node("n1")); r2.Version != want {
		t.Errorf("version %016x, want World.Version %016x", r2.Version, want)
	}
	p.ack(r2)
	checkAgentCurrent(t, &p.agent, w, "n1")
	p.expectNothing()
}

// TestCursorNackMemory checks how long a NACKed version stays unsent:
// until the agent acknowledges another version.
func TestCursorNackMemory(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")), nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()

	s.Publish(services(simpleService(t, "a", "10.0.0.11")), nil)
	r1 := p.next()
	if err := p.cur.Nack(r1.Version); err != nil {
		t.Fatalf("nack: %v", err)
	}
	// b changes and changes back before the cursor looks: the table is
	// the rejected one again, which is not sent.
	s.Publish(services(simpleService(t, "b", "10.0.0.12")), nil)
	s.Publish(services(simpleService(t, "b", "10.0.0.2")), nil)
	if r := p.next(); r != nil {
		t.Fatalf("the NACKed version %016x was sent again (got %016x)", r1.Version, r.Version)
	}

	// Once the agent acknowledges a newer table, the rejected version is
	// an ordinary one: returning to it is a change like any other.
	s.Publish(services(simpleService(t, "b", "10.0.0.12")), nil)
	r2 := p.next()
	if r2 == nil || r2.Version == r1.Version {
		t.Fatal("no new response after a later change")
	}
	p.ack(r2)
	s.Publish(services(simpleService(t, "b", "10.0.0.2")), nil)
	r3 := p.next()
	if r3 == nil {
		t.Fatalf("after an ACK of %016x, a change back to the once-NACKed table %016x is not sent", r2.Version, r1.Version)
	}
	if r3.Version != r1.Version || r3.Base != r2.Version {
		t.Errorf("base %016x version %016x, want %016x to %016x", r3.Base, r3.Version, r2.Version, r1.Version)
	}
	p.ack(r3)
	checkAgentCurrent(t, &p.agent, s.Current(), "n1")
}

func TestCursorNackWithChangesInFlight(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")), nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()
	base := p.agent.version

	s.Publish(services(simpleService(t, "a", "10.0.0.11")), nil)
	r1 := p.next()
	// While r1 is in flight, b changes and a changes again.
	s.Publish(services(simpleService(t, "a", "10.0.0.21"), simpleService(t, "b", "10.0.0.22")), nil)
	if p.next() != nil {
		t.Fatal("response while one is in flight")
	}
	if err := p.cur.Nack(r1.Version); err != nil {
		t.Fatalf("nack: %v", err)
	}
	r2 := p.next()
	d := decodeDelta(t, r2)
	if r2.Base != base || !slices.Equal(entryKeys(d.GetUpserts()), []string{key("a"), key("b")}) {
		t.Errorf("base %016x, upserts %v; want base %016x with [a b]", r2.Base, entryKeys(d.GetUpserts()), base)
	}
	p.ack(r2)
	checkAgentCurrent(t, &p.agent, s.Current(), "n1")
}

func TestCursorNackSnapshot(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1")), nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	r1 := p.next()
	decodeSnapshot(t, r1)
	if err := p.cur.Nack(r1.Version); err != nil {
		t.Fatalf("nack: %v", err)
	}
	if p.next() != nil {
		t.Fatal("the NACKed snapshot was sent again")
	}
	if _, ok := p.cur.AckedVersion(); ok {
		t.Error("an acknowledged version after a NACKed first snapshot")
	}
	s.Publish(services(simpleService(t, "b", "10.0.0.2")), nil)
	r2 := p.next()
	decodeSnapshot(t, r2)
	p.ack(r2)
	checkAgentCurrent(t, &p.agent, s.Current(), "n1")
}

func TestCursorAckNackWrongVersion(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight bool
		nack     bool
		version  func(r *Response) uint64
	}{
		{name: "ack of another version", inFlight: true, version: func(r *Response) uint64 { return r.Version + 1 }},
		{name: "ack of the base", inFlight: true, version: func(r *Response) uint64 { return r.Base }},
		{name: "nack of another version", inFlight: true, nack: true, version: func(r *Response) uint64 { return r.Version + 1 }},
		{name: "ack with nothing in flight", version: func(r *Response) uint64 { return r.Version }},
		{name: "nack with nothing in flight", nack: true, version: func(r *Response) uint64 { return r.Version }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(testMaxPending)
			s.Publish(services(simpleService(t, "a", "10.0.0.1")), nodes(buildNode(t, "n1", "a")))
			p := connect(t, s, "n1", Held{}, true, testMaxPending)
			p.sync()
			acked, _ := p.cur.AckedVersion()
			s.Publish(services(simpleService(t, "a", "10.0.0.2")), nil)
			r := p.next()
			if !tc.inFlight {
				p.ack(r)
				acked = r.Version
			}
			var err error
			if tc.nack {
				err = p.cur.Nack(tc.version(r))
			} else {
				err = p.cur.Ack(tc.version(r))
			}
			if err == nil {
				t.Fatal("no error")
			}
			if v, _ := p.cur.AckedVersion(); v != acked {
				t.Errorf("acked version %016x, want unchanged %016x", v, acked)
			}
			if !tc.inFlight {
				if !noneInFlight(p.cur) || !p.cur.Current() {
					t.Error("cursor changed")
				}
				p.expectNothing()
				return
			}
			if !inFlight(p.cur, r) {
				t.Fatal("the response in flight changed")
			}
			if p.next() != nil {
				t.Fatal("a response while one is in flight")
			}
			p.ack(r)
			checkAgentCurrent(t, &p.agent, s.Current(), "n1")
		})
	}
}

func TestCursorReconnect(t *testing.T) {
	n1 := buildNode(t, "n1", "a")
	// The agent holds the table of n1 in the first world; the world then
	// moves on: z's view and b change, c goes, d comes, u stays.
	first := []*compute.Service{
		zonedService(t, "z", []string{"10.0.0.1"}, []string{"10.0.1.1"}),
		simpleService(t, "b", "10.0.0.2"),
		simpleService(t, "c", "10.0.0.3"),
		simpleService(t, "u", "10.0.0.4"),
	}
	second := services(
		zonedService(t, "z", []string{"10.0.0.1", "10.0.0.9"}, []string{"10.0.1.1"}),
		simpleService(t, "b", "10.0.0.22"),
		simpleService(t, "d", "10.0.0.5"),
	)
	second[key("c")] = nil

	type want int
	const (
		wantNothing want = iota
		wantDelta
		wantSnapshot
	)
	for _, tc := range []struct {
		name    string
		moved   bool          // publish the second world first
		newNode *compute.Node // also move the node
		held    func(a agent) Held
		deltas  bool
		want    want
		upserts []string
		removes []string
		node    bool // the delta carries NodeInfo
	}{{
		name: "current version and hashes",
		held: func(a agent) Held { return a.held() }, deltas: true, want: wantNothing,
	}, {
		name: "current version without hashes",
		held: func(a agent) Held { return Held{Version: compute.FormatVersion(a.version)} }, deltas: true, want: wantNothing,
	}, {
		name: "current version, no deltas",
		held: func(a agent) Held { return a.held() }, want: wantNothing,
	}, {
		name: "older version with its hashes", moved: true,
		held: func(a agent) Held { return a.held() }, deltas: true, want: wantDelta,
		upserts: []string{key("b"), key("d"), key("z")}, removes: []string{key("c")},
	}, {
		name: "older version, node moved", moved: true, newNode: buildNode(t, "n1", "b"),
		held: func(a agent) Held { return a.held() }, deltas: true, want: wantDelta,
		upserts: []string{key("b"), key("d"), key("z")}, removes: []string{key("c")}, node: true,
	}, {
		name: "only the node moved", newNode: buildNode(t, "n1", "b"),
		held: func(a agent) Held { return a.held() }, deltas: true, want: wantDelta,
		upserts: []string{key("z")}, node: true,
	}, {
		name: "older version, no deltas", moved: true,
		held: func(a agent) Held { return a.held() }, want: wantSnapshot,
	}, {
		name: "hashes missing an entry", moved: true,
		held: func(a agent) Held {
			h := a.held()
			delete(h.Entries, key("u"))
			return h
		},
		deltas: true, want: wantSnapshot,
	}, {
		name: "wrong entry hash", moved: true,
		held: func(a agent) Held {
			h := a.held()
			h.Entries[key("u")]++
			return h
		},
		deltas: true, want: wantSnapshot,
	}, {
		name: "wrong node hash", moved: true,
		held: func(a agent) Held {
			h := a.held()
			h.NodeHash++
			return h
		},
		deltas: true, want: wantSnapshot,
	}, {
		name: "version without hashes", moved: true,
		held: func(a agent) Held { return Held{Version: compute.FormatVersion(a.version)} }, deltas: true, want: wantSnapshot,
	}, {
		// Every entry is current but the version does not add up.
		name: "current hashes, wrong version",
		held: func(a agent) Held {
			h := a.held()
			h.Version = compute.FormatVersion(a.version + 1)
			return h
		},
		deltas: true, want: wantSnapshot,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(testMaxPending)
			s.Publish(services(first...), nodes(n1))
			old := connect(t, s, "n1", Held{}, true, testMaxPending)
			old.sync()
			heldVersion := old.agent.version

			if tc.moved {
				s.Publish(second, nil)
			}
			if tc.newNode != nil {
				s.Publish(nil, nodes(tc.newNode))
			}
			w := s.Current()
			node := w.Node("n1")

			held := tc.held(old.agent)
			p := connect(t, s, "n1", held, tc.deltas, testMaxPending)
			p.agent = old.agent
			if v, ok := p.cur.AckedVersion(); !ok || v != parseVersion(t, held.Version) {
				t.Errorf("acked version %016x (%v), want the held %s", v, ok, held.Version)
			}
			r := p.next()
			switch tc.want {
			case wantNothing:
				if r != nil {
					t.Fatalf("got a response (snapshot %v), want none", r.Snapshot)
				}
				if !p.cur.Current() {
					t.Error("not current")
				}
				return
			case wantSnapshot:
				snap := decodeSnapshot(t, r)
				if !slices.Equal(entryKeys(snap.GetEntries()), w.Keys()) {
					t.Errorf("snapshot entries %v, want %v", entryKeys(snap.GetEntries()), w.Keys())
				}
			case wantDelta:
				d := decodeDelta(t, r)
				if r.Base != heldVersion {
					t.Errorf("base %016x, want the held version %016x", r.Base, heldVersion)
				}
				if !slices.Equal(entryKeys(d.GetUpserts()), tc.upserts) || !slices.Equal(d.GetRemovals(), tc.removes) {
					t.Errorf("upserts %v, removals %v; want %v and %v", entryKeys(d.GetUpserts()), d.GetRemovals(), tc.upserts, tc.removes)
				}
				for _, e := range d.GetUpserts() {
					checkEntry(t, e, w.Service(e.GetKey()), node)
				}
				if (d.Node != nil) != tc.node || (tc.node && d.GetNode().GetHash() != node.Hash) {
					t.Errorf("node %v, want it set: %v", d.GetNode(), tc.node)
				}
			}
			if want := w.Version(node); r.Version != want {
				t.Errorf("version %016x, want World.Version %016x", r.Version, want)
			}
			p.ack(r)
			checkAgentCurrent(t, &p.agent, w, "n1")
			p.expectNothing()

			// Tracking continues from the new base.
			s.Publish(services(simpleService(t, "u", "10.0.0.44")), nil)
			r = p.next()
			if tc.deltas {
				d := decodeDelta(t, r)
				if !slices.Equal(entryKeys(d.GetUpserts()), []string{key("u")}) {
					t.Errorf("next delta upserts %v, want [u]", entryKeys(d.GetUpserts()))
				}
			}
			p.ack(r)
			checkAgentCurrent(t, &p.agent, s.Current(), "n1")
		})
	}
}

func TestNewCursorMalformedVersion(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(nil, nil)
	for _, tc := range []struct{ name, version string }{
		{name: "too short", version: "abc"},
		{name: "too long", version: "00000000000000000"},
		{name: "not hex", version: "zzzzzzzzzzzzzzzz"},
		{name: "signed", version: "-000000000000001"},
		{name: "spaces", version: " 000000000000001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewCursor("n1", s.Current(), Held{Version: tc.version}, true, testMaxPending)
			if err == nil {
				t.Fatalf("no error; cursor %+v", c)
			}
			if c != nil {
				t.Error("a cursor with the error")
			}
		})
	}
}

func TestCursorDeltasUnsupported(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.0.0.1"), simpleService(t, "b", "10.0.0.2")), nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, false, testMaxPending)
	p.sync()

	for i, change := range []map[string]*compute.Service{
		services(simpleService(t, "a", "10.0.0.3")),
		removed(key("b")),
		services(simpleService(t, "c", "10.0.0.4")),
	} {
		s.Publish(change, nil)
		r := p.next()
		snap := decodeSnapshot(t, r)
		w := s.Current()
		if !slices.Equal(entryKeys(snap.GetEntries()), w.Keys()) {
			t.Errorf("change %d: snapshot entries %v, want %v", i, entryKeys(snap.GetEntries()), w.Keys())
		}
		if want := w.Version(w.Node("n1")); r.Version != want {
			t.Errorf("change %d: version %016x, want World.Version %016x", i, r.Version, want)
		}
		p.ack(r)
		checkAgentCurrent(t, &p.agent, w, "n1")
	}

	// Still nothing when the table does not change.
	s.Publish(services(buildService(t, svcSpec{name: "a", eps: []epSpec{{ip: "10.0.0.3"}, {ip: "10.0.0.5", notReady: true}}})), nil)
	p.expectNothing()
}

func TestCursorOverflow(t *testing.T) {
	for _, tc := range []struct {
		name        string
		storeLimit  int
		cursorLimit int
		inFlight    bool // changes arrive while a response is in flight
		poll        bool // the cursor takes each change as it comes
	}{
		{name: "store overflow", storeLimit: 2, cursorLimit: testMaxPending},
		{name: "store overflow while in flight", storeLimit: 2, cursorLimit: testMaxPending, inFlight: true},
		{name: "cursor overflow while in flight", storeLimit: testMaxPending, cursorLimit: 2, inFlight: true, poll: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(tc.storeLimit)
			var svcs []*compute.Service
			for i := range 5 {
				svcs = append(svcs, simpleService(t, fmt.Sprintf("s%d", i), fmt.Sprintf("10.0.0.%d", i+1)))
			}
			s.Publish(services(svcs...), nodes(buildNode(t, "n1", "a")))
			p := connect(t, s, "n1", Held{}, true, tc.cursorLimit)
			p.sync()

			var inflight *Response
			if tc.inFlight {
				s.Publish(services(simpleService(t, "s0", "10.0.1.0")), nil)
				inflight = p.next()
				decodeDelta(t, inflight)
			}
			// Three changes, one publish at a time, so that only the
			// cursor's merge sees all three when the store's limit is high.
			for i := 1; i <= 3; i++ {
				s.Publish(services(simpleService(t, fmt.Sprintf("s%d", i), fmt.Sprintf("10.0.1.%d", i))), nil)
				if tc.poll {
					if p.next() != nil {
						t.Fatal("response while one is in flight")
					}
				}
			}
			if inflight != nil {
				p.ack(inflight)
			}
			r := p.next()
			decodeSnapshot(t, r)
			p.ack(r)
			checkAgentCurrent(t, &p.agent, s.Current(), "n1")

			// After the reset, deltas resume.
			s.Publish(services(simpleService(t, "s4", "10.0.2.4")), nil)
			r = p.next()
			d := decodeDelta(t, r)
			if !slices.Equal(entryKeys(d.GetUpserts()), []string{key("s4")}) {
				t.Errorf("upserts %v, want [s4]", entryKeys(d.GetUpserts()))
			}
			p.ack(r)
			checkAgentCurrent(t, &p.agent, s.Current(), "n1")
		})
	}
}

func TestCursorNodeZoneChange(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(
		zonedService(t, "z1", []string{"10.0.0.1"}, []string{"10.0.1.1"}),
		zonedService(t, "z2", []string{"10.0.0.2"}, []string{"10.0.1.2"}),
		zonedService(t, "za", []string{"10.0.0.3"}, nil), // hinted for zone a only
		simpleService(t, "u", "10.0.2.1"),
		buildService(t, svcSpec{name: "l", local: true, eps: []epSpec{{ip: "10.0.3.1", node: "n1"}}}),
	), nodes(buildNode(t, "n1", "a"), buildNode(t, "n2", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()
	other := connect(t, s, "n2", Held{}, true, testMaxPending)
	other.sync()
	old := p.agent.version

	for _, tc := range []struct {
		name    string
		zone    string
		upserts []string
	}{
		// z1 and z2 switch to zone b's endpoints; za falls back to all of
		// its endpoints, which are the same: unchanged.
		{name: "a to b", zone: "b", upserts: []string{key("z1"), key("z2")}},
		{name: "b to unlabelled", zone: "", upserts: []string{key("z1"), key("z2")}},
		{name: "unlabelled to a", zone: "a", upserts: []string{key("z1"), key("z2")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := buildNode(t, "n1", tc.zone)
			s.Publish(nil, nodes(n))
			r := p.next()
			d := decodeDelta(t, r)
			w := s.Current()
			if r.Base != old {
				t.Errorf("base %016x, want %016x", r.Base, old)
			}
			if want := w.Version(n); r.Version != want {
				t.Errorf("version %016x, want World.Version %016x", r.Version, want)
			}
			if d.Node == nil || d.GetNode().GetZone() != tc.zone || d.GetNode().GetHash() != n.Hash {
				t.Errorf("node %v, want zone %q hash %016x", d.GetNode(), tc.zone, n.Hash)
			}
			if !slices.Equal(entryKeys(d.GetUpserts()), tc.upserts) || r.Removals != 0 {
				t.Errorf("upserts %v, removals %v; want %v and none", entryKeys(d.GetUpserts()), d.GetRemovals(), tc.upserts)
			}
			for _, e := range d.GetUpserts() {
				checkEntry(t, e, w.Service(e.GetKey()), n)
			}
			p.ack(r)
			checkAgentCurrent(t, &p.agent, w, "n1")
			old = r.Version
			other.expectNothing()
		})
	}

	// A node change that moves no view (new pod CIDRs, same zone): a
	// delta with the node alone.
	n := compute.BuildNode("n1", &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{corev1.LabelTopologyZone: "a"}},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.244.9.0/24"}},
	})
	s.Publish(nil, nodes(n))
	r := p.next()
	d := decodeDelta(t, r)
	if d.Node == nil || !slices.Equal(d.GetNode().GetPodCidrs(), []string{"10.244.9.0/24"}) || d.GetNode().GetHash() != n.Hash ||
		r.Upserts != 0 || r.Removals != 0 {
		t.Errorf("pod CIDR change: node %v, %d upserts, %d removals; want the new node alone", d.GetNode(), r.Upserts, r.Removals)
	}
	if want := s.Current().Version(n); r.Version != want {
		t.Errorf("version %016x, want World.Version %016x", r.Version, want)
	}
	p.ack(r)
	checkAgentCurrent(t, &p.agent, s.Current(), "n1")
}

// TestCursorNodeChangeInFlight checks that a node change that arrives
// while a response is in flight reaches the agent after the ACK, though
// no Service changed.
func TestCursorNodeChangeInFlight(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(zonedService(t, "z", []string{"10.0.0.1"}, []string{"10.0.1.1"}), simpleService(t, "u", "10.0.2.1")),
		nodes(buildNode(t, "n1", "a")))
	p := connect(t, s, "n1", Held{}, true, testMaxPending)
	p.sync()

	s.Publish(services(simpleService(t, "u", "10.0.2.2")), nil)
	r1 := p.next()
	s.Publish(nil, nodes(buildNode(t, "n1", "b")))
	if p.next() != nil {
		t.Fatal("response while one is in flight")
	}
	p.ack(r1)
	r2 := p.next()
	d := decodeDelta(t, r2)
	if d.Node == nil || d.GetNode().GetZone() != "b" || !slices.Equal(entryKeys(d.GetUpserts()), []string{key("z")}) {
		t.Errorf("node %v, upserts %v; want zone b and [z]", d.GetNode(), entryKeys(d.GetUpserts()))
	}
	p.ack(r2)
	checkAgentCurrent(t, &p.agent, s.Current(), "n1")
}

// TestCursorConverges drives agents of three nodes through a seeded random
// sequence of changes, with responses held in flight, NACKs and
// reconnections, and checks after every step that each agent with nothing
// outstanding holds exactly its node's table.
func TestCursorConverges(t *testing.T) {
	const (
		numServices = 20
		steps       = 300
		storeLimit  = 6
		cursorLimit = 8
	)
	rng := rand.New(rand.NewPCG(20250301, 7))
	zones := map[string]string{"n1": "a", "n2": "a", "n3": "b"}
	names := slices.Sorted(maps.Keys(zones))

	// randomService builds a random state of service i: every fourth is
	// plain, zone hinted, local-policy or a mix of hints and unready
	// endpoints.
	randomService := func(i int) *compute.Service {
		spec := svcSpec{name: fmt.Sprintf("svc%02d", i), clusterIP: fmt.Sprintf("10.96.0.%d", i+1)}
		for j := range rng.IntN(4) {
			e := epSpec{ip: fmt.Sprintf("10.%d.%d.%d", i, j, rng.IntN(3)+1)}
			switch i % 4 {
			case 1:
				e.zone = []string{"a", "b"}[rng.IntN(2)]
			case 2:
				spec.local = true
				e.node = names[rng.IntN(len(names))]
			case 3:
				if rng.IntN(2) == 0 {
					e.zone = []string{"a", "b", "c"}[rng.IntN(3)]
				}
				e.notReady = rng.IntN(4) == 0
				e.node = names[rng.IntN(len(names))]
			}
			spec.eps = append(spec.eps, e)
		}
		if rng.IntN(3) == 0 {
			spec.trigger = fmt.Sprintf("2025-03-01T10:%02d:%02d.%03dZ", rng.IntN(60), rng.IntN(60), rng.IntN(1000))
		}
		return buildService(t, spec)
	}

	s := NewStore(storeLimit)
	initial := map[string]*compute.Service{}
	for i := range numServices / 2 {
		svc := randomService(i)
		initial[svc.Key] = svc
	}
	var ns []*compute.Node
	for _, n := range names {
		ns = append(ns, buildNode(t, n, zones[n]))
	}
	s.Publish(initial, nodes(ns...))

	peers := map[string]*peer{}
	behind := map[string]bool{} // the agent NACKed and holds an older table
	for _, n := range names {
		peers[n] = connect(t, s, n, Held{}, true, cursorLimit)
	}
	var stats struct{ snapshots, deltas, nacks, held, reconnects, nodeMoves, bulk int }

	// drive runs one agent's stream until it has nothing more to do.
	drive := func(p *peer, mayHold bool) {
		t.Helper()
		if p.held != nil {
			p.ack(p.held)
			p.held = nil
		}
		for range 5 {
			r := p.next()
			if r == nil {
				return
			}
			if r.Snapshot {
				stats.snapshots++
			} else {
				stats.deltas++
			}
			switch x := rng.IntN(20); {
			case mayHold && x == 0:
				stats.held++
				p.held = r
				return // acked at the next step, after more changes
			case mayHold && x == 1:
				stats.nacks++
				if err := p.cur.Nack(r.Version); err != nil {
					t.Fatalf("nack: %v", err)
				}
				behind[p.node] = true
			default:
				p.ack(r)
				behind[p.node] = false
			}
		}
		t.Fatalf("agent of %s does not converge", p.node)
	}

	check := func(step int) {
		t.Helper()
		w := s.Current()
		for _, n := range names {
			p := peers[n]
			if !noneInFlight(p.cur) {
				continue
			}
			if behind[n] {
				if v, ok := p.cur.AckedVersion(); p.agent.has && (!ok || v != p.agent.version) {
					t.Fatalf("step %d: agent of %s holds %016x, cursor has it at %016x", step, n, p.agent.version, v)
				}
				continue
			}
			checkAgentCurrent(t, &p.agent, w, n)
			if !p.cur.Current() {
				t.Fatalf("step %d: cursor of %s not current", step, n)
			}
		}
	}

	for step := range steps {
		changes := map[string]*compute.Service{}
		var nodeChanges map[string]*compute.Node
		switch op := rng.IntN(100); {
		case op < 4:
			stats.nodeMoves++
			n := names[rng.IntN(len(names))]
			zones[n] = []string{"a", "b", ""}[rng.IntN(3)]
			nodeChanges = nodes(buildNode(t, n, zones[n]))
		case op < 10:
			stats.bulk++
			for range storeLimit + 2 {
				i := rng.IntN(numServices)
				changes[key(fmt.Sprintf("svc%02d", i))] = randomService(i)
			}
		default:
			for range rng.IntN(3) + 1 {
				i := rng.IntN(numServices)
				k := key(fmt.Sprintf("svc%02d", i))
				if s.Current().Service(k) != nil && rng.IntN(4) == 0 {
					changes[k] = nil
				} else {
					changes[k] = randomService(i)
				}
			}
		}
		s.Publish(changes, nodeChanges)

		for _, n := range names {
			if rng.IntN(25) == 0 {
				stats.reconnects++
				old := peers[n]
				deltas := rng.IntN(4) != 0
				p := reconnect(t, s, n, old.agent, deltas, cursorLimit)
				peers[n] = p
				behind[n] = false
				if r := p.cur.Next(); r != nil {
					if deltas && p.agent.has && r.Snapshot {
						t.Fatalf("step %d: agent of %s reconnected with a consistent table and got a snapshot", step, n)
					}
					p.ack(r)
				}
			}
			drive(peers[n], true)
		}
		check(step)
	}

	// Finish: acknowledge what is in flight, then make one change that
	// moves every table so that agents behind a NACK catch up.
	for _, n := range names {
		drive(peers[n], false)
	}
	s.Publish(services(simpleService(t, "final", "10.255.0.1")), nil)
	for _, n := range names {
		drive(peers[n], false)
		behind[n] = false
	}
	check(steps)

	t.Logf("stats: %+v", stats)
	if stats.snapshots == 0 || stats.deltas == 0 || stats.nacks == 0 || stats.held == 0 || stats.reconnects == 0 || stats.nodeMoves == 0 || stats.bulk == 0 {
		t.Errorf("the sequence does not exercise every path: %+v", stats)
	}
}
