package table

import (
	"fmt"
	"slices"
	"time"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// Cursor tracks what one agent holds and computes what to send it next.
// One stream goroutine owns it; it is not safe for concurrent use.
//
// At most one response is in flight: the next one is computed only after
// the agent acknowledges or rejects the previous one, so every delta
// applies to a version the agent confirmed holding, and changes arriving
// meanwhile coalesce into one response.
type Cursor struct {
	node       string
	deltas     bool
	compress   compression // see CompressSnapshots
	maxPending int

	world   *World
	base    base
	pending Pending // changes since base.world; meaningful when base.kind == baseTracked

	inflight *inflight
	nacked   *uint64 // version the agent rejected: never sent again
	// heldRevision is the latest world whose table for the node the agent
	// is known to hold (see HeldRevision).
	heldRevision uint64
	// nodeWorld and nodeInfo cache world.Node(node) for world nodeWorld
	// (see nodeIn).
	nodeWorld *World
	nodeInfo  *compute.Node
}

// inflight is what the cursor remembers of the response in flight: not
// its body, which the transport may still be writing and nothing else
// needs.
type inflight struct {
	version  uint64
	revision uint64 // of the world it was built from
	node     *compute.Node
	pending  Pending // what the response covered, restored on NACK
}

type baseKind int

const (
	baseNone    baseKind = iota // the agent holds nothing we can use
	baseKnown                   // the agent told us its entry hashes
	baseTracked                 // the agent holds what we sent it, plus pending
)

type base struct {
	kind    baseKind
	version uint64
	node    *compute.Node     // baseTracked: the node info the agent holds
	known   map[string]uint64 // baseKnown: the agent's entry hashes
	nodeSum uint64            // baseKnown: the agent's node hash
}

// Held is what an agent reports holding when it connects.
type Held struct {
	// Version is the table version, or "" for none.
	Version string
	// Entries maps keys to entry hashes. When it is nil, LoadEntries, if
	// set, supplies them: it is called only when Version is not the
	// current one, because decoding a hash per Service for every agent
	// that reconnects current is most of what a restart would cost.
	Entries     map[string]uint64
	LoadEntries func() (map[string]uint64, error)
	// NodeHash is the NodeInfo hash.
	NodeHash uint64
}

// Response is one encoded table response.
type Response struct {
	// Snapshot is true for a Snapshot, false for a Delta.
	Snapshot bool
	// Base and Version are the versions before (deltas) and after.
	Base, Version uint64
	// ResourceVersion is the world's when the response was built (see
	// World.ResourceVersion).
	ResourceVersion uint64
	// Body is the encoded Snapshot or Delta message, in pieces that may be
	// shared with other responses: never modify them.
	Body Body
	// Upserts and Removals count entries (a snapshot's entries are upserts).
	Upserts, Removals int
	// TriggerTime is the newest trigger time among the upserts.
	TriggerTime time.Time
	// LagReset is set on a snapshot sent because the agent fell more than
	// the pending limit behind.
	LagReset bool
}

// Body is an encoded message in pieces, which concatenate to the message.
type Body [][]byte

// Len is the message's size in bytes.
func (b Body) Len() int {
	n := 0
	for _, p := range b {
		n += len(p)
	}
	return n
}

// Bytes returns the message in one piece (a copy).
func (b Body) Bytes() []byte {
	out := make([]byte, 0, b.Len())
	for _, p := range b {
		out = append(out, p...)
	}
	return out
}

// NewCursor starts a cursor for node in world w, from what the agent
// holds. deltas says whether the agent applies Delta responses.
func NewCursor(node string, w *World, held Held, deltas bool, maxPending int) (*Cursor, error) {
	c := &Cursor{node: node, deltas: deltas, maxPending: maxPending, world: w}
	if held.Version == "" {
		return c, nil
	}
	v, err := compute.ParseVersion(held.Version)
	if err != nil {
		return nil, fmt.Errorf("held version: %w", err)
	}
	n := w.Node(node)
	if v == w.Version(n) {
		// The agent already holds this table, whichever replica sent it.
		c.base = base{kind: baseTracked, version: v, node: n}
		c.heldRevision = w.Revision
		return c, nil
	}
	known := held.Entries
	if known == nil && held.LoadEntries != nil {
		if known, err = held.LoadEntries(); err != nil {
			return nil, fmt.Errorf("held entries: %w", err)
		}
	}
	c.base = base{kind: baseKnown, version: v, known: known, nodeSum: held.NodeHash}
	return c, nil
}

// CompressSnapshots makes the cursor's snapshots carry the zone view's
// compressed runs (Snapshot.zstd_entries) in place of its plain entries,
// for an agent that announced Capabilities.zstd_entries. Versions and
// everything else stay as they are: they describe the content.
func (c *Cursor) CompressSnapshots() { c.compress = hashed }

// CompressSnapshotsUnhashed is CompressSnapshots with runs that leave out
// every entry's hash (Snapshot.zstd_entries_unhashed), for an agent that
// announced Capabilities.zstd_entries_unhashed and computes them itself.
func (c *Cursor) CompressSnapshotsUnhashed() { c.compress = unhashed }

// Update records a newer world and the changes since the previous one.
func (c *Cursor) Update(w *World, p Pending) {
	c.world = w
	c.pending.merge(p, c.maxPending)
}

// InFlight returns the version of the response awaiting acknowledgement,
// and whether there is one.
func (c *Cursor) InFlight() (uint64, bool) {
	if c.inflight == nil {
		return 0, false
	}
	return c.inflight.version, true
}

// Current reports whether the agent holds the table of the latest world
// (as far as acknowledged): nothing pending and nothing in flight.
func (c *Cursor) Current() bool {
	return c.inflight == nil && c.base.kind == baseTracked && c.pending.Len() == 0 && !c.pending.Overflow &&
		c.base.node.Equal(c.nodeIn())
}

// nodeIn is the node's info in the cursor's world, looked up once per
// world: a stream asks for it three times per delta (Next after the
// change, Next and Current after the ACK), and each lookup is a miss in
// the CPU's caches, with thousands of streams taking turns.
func (c *Cursor) nodeIn() *compute.Node {
	if c.nodeWorld != c.world {
		c.nodeWorld, c.nodeInfo = c.world, c.world.Node(c.node)
	}
	return c.nodeInfo
}

// AckedVersion is the version the agent holds, and whether it is known.
func (c *Cursor) AckedVersion() (uint64, bool) {
	return c.base.version, c.base.kind != baseNone
}

// HeldRevision is the Revision of the latest world whose table for the
// node the agent is known to hold: the world an acknowledged response was
// built from, or the cursor's world when Next found nothing to send. 0
// until it is known. The agent holds every change published up to it, as
// far as the change concerns its node.
func (c *Cursor) HeldRevision() uint64 { return c.heldRevision }

// Next computes the response that brings the agent to the latest world, or
// nil when there is nothing to send: the agent is current, a response is
// in flight, or the only possible response is a version the agent rejected.
func (c *Cursor) Next() *Response {
	if c.inflight != nil {
		return nil
	}
	node := c.nodeIn()
	var r *Response
	switch {
	case c.base.kind == baseNone:
		r = c.snapshot(node)
	case c.base.kind == baseTracked && c.pending.Overflow:
		r = c.snapshot(node)
		r.LagReset = true
	case c.base.kind == baseKnown:
		r = c.diff(node, func(k string) (uint64, bool) { h, ok := c.base.known[k]; return h, ok }, c.base.nodeSum, true)
		if r == nil || r.Version != c.world.Version(node) {
			// What the agent reported does not add up to its version
			// (a corrupt cache, or entries omitted): start afresh.
			r = c.snapshot(node)
		}
	case !c.base.node.Equal(node):
		// The node's zone may have moved it to other views of any Service.
		r = c.diff(node, c.trackedHash, c.base.node.Hash, true)
	default:
		r = c.diff(node, c.trackedHash, c.base.node.Hash, false)
	}
	if r == nil {
		// Nothing differs: the agent's base is the latest world.
		c.base = base{kind: baseTracked, version: c.base.version, node: node}
		c.pending = Pending{}
		c.heldRevision = c.world.Revision
		return nil
	}
	if !r.Snapshot && !c.deltas {
		r = c.snapshot(node)
	}
	if c.nacked != nil && *c.nacked == r.Version {
		return nil
	}
	c.inflight = &inflight{version: r.Version, revision: c.world.Revision, node: node, pending: c.pending}
	c.pending = Pending{}
	return r
}

// trackedHash is the hash of key's entry in the agent's base: the state
// before the first pending change, or the current state when unchanged.
func (c *Cursor) trackedHash(key string) (uint64, bool) {
	svc, changed := c.pending.Services[key]
	if !changed {
		svc = c.world.Service(key)
	}
	if svc == nil {
		return 0, false
	}
	return svc.EntryFor(c.base.node).Hash, true
}

// Ack records that the agent applied the response with version v. A stale
// or unknown version is an error; the cursor is unchanged.
func (c *Cursor) Ack(v uint64) error {
	if c.inflight == nil || c.inflight.version != v {
		return fmt.Errorf("ack for %s: not the response in flight", compute.FormatVersion(v))
	}
	c.base = base{kind: baseTracked, version: v, node: c.inflight.node}
	c.heldRevision = max(c.heldRevision, c.inflight.revision)
	c.inflight, c.nacked = nil, nil
	return nil
}

// Nack records that the agent rejected the response with version v and
// still holds its base. That version is not sent again.
func (c *Cursor) Nack(v uint64) error {
	if c.inflight == nil || c.inflight.version != v {
		return fmt.Errorf("nack for %s: not the response in flight", compute.FormatVersion(v))
	}
	restored := c.inflight.pending
	restored.merge(c.pending, c.maxPending)
	c.pending = restored
	c.nacked = &v
	c.inflight = nil
	return nil
}

// snapshot references the node's zone view and splices in the entries
// special to the node, so its body costs a few slice headers per special
// entry rather than a copy of the table. Compressed, it references the
// view's compressed runs, and only the runs that hold special entries go
// plain.
func (c *Cursor) snapshot(node *compute.Node) *Response {
	w := c.world
	zv := w.zoneView(node.Zone)
	keys := w.Keys()
	special := w.index().special[node.Name]
	r := &Response{Snapshot: true, Version: node.Hash + zv.sum, ResourceVersion: w.ResourceVersion(), Upserts: len(keys), TriggerTime: zv.trigger}
	own := make([]compute.Entry, len(special))
	for j, i := range special {
		own[j] = w.services[keys[i]].EntryFor(node)
		r.Version += own[j].Hash - zv.hashes[i]
		r.noteTrigger(w.services[keys[i]].TriggerTime)
	}
	head := appendString(nil, wire.SnapshotVersion, compute.FormatVersion(r.Version))
	head = appendMessage(head, wire.SnapshotNode, node.Bytes)
	var body Body
	if c.compress != uncompressed {
		runs := zv.runs(c.compress)
		body = make(Body, 0, 2+len(runs)+2*len(special))
		body = append(body, head)
		j := 0 // special[j:] are in this run or later ones
		for _, rn := range runs {
			k := j
			for k < len(special) && special[k] < rn.end {
				k++
			}
			if k == j {
				body = append(body, rn.field)
				continue
			}
			body = c.appendPlain(body, zv, rn.first, rn.end, special[j:k], own[j:k])
			j = k
		}
	} else {
		body = make(Body, 0, 2+2*len(special))
		body = append(body, head)
		body = c.appendPlain(body, zv, 0, len(keys), special, own)
	}
	if rv := appendUint(nil, wire.SnapshotResourceVersion, r.ResourceVersion); len(rv) > 0 {
		body = append(body, rv) // last, in field order, as proto.Marshal writes it
	}
	r.Body = body
	return r
}

// appendPlain appends the zone view's entries [lo, hi) to body, with the
// node's own entries in place of the view's at the indices special
// (ascending, within [lo, hi)).
func (c *Cursor) appendPlain(body Body, zv *zoneView, lo, hi int, special []int, own []compute.Entry) Body {
	w := c.world
	keys := w.Keys()
	from := zv.offsets[lo] // start of the zone view not yet referenced
	var ownBytes []byte
	for j, i := range special {
		if zv.offsets[i] > from {
			if len(ownBytes) > 0 {
				body, ownBytes = append(body, ownBytes), nil
			}
			body = append(body, zv.body[from:zv.offsets[i]])
		}
		// Consecutive special entries share one buffer.
		ownBytes = appendEntry(ownBytes, wire.SnapshotEntries, keys[i], own[j], w.services[keys[i]].TriggerTime)
		from = zv.offsets[i+1]
	}
	if len(ownBytes) > 0 {
		body = append(body, ownBytes)
	}
	if to := zv.offsets[hi]; from < to {
		body = append(body, zv.body[from:to])
	}
	return body
}

// diff builds a delta from the agent's base, where old gives the hash of
// each entry the agent holds. With full it compares every key; otherwise
// only the pending ones, which is enough when the node is unchanged.
func (c *Cursor) diff(node *compute.Node, old func(string) (uint64, bool), oldNode uint64, full bool) *Response {
	var keys []string
	if full {
		keys = slices.Clone(c.world.Keys())
		switch c.base.kind {
		case baseKnown:
			for k := range c.base.known {
				if c.world.Service(k) == nil {
					keys = append(keys, k)
				}
			}
		case baseTracked:
			for k := range c.pending.Services {
				if c.world.Service(k) == nil {
					keys = append(keys, k)
				}
			}
		}
	} else {
		// A change or two, usually: on the stack.
		var fewKeys [4]string
		keys = fewKeys[:0]
		for k := range c.pending.Services {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)

	r := &Response{Base: c.base.version, Version: c.base.version - oldNode + node.Hash, ResourceVersion: c.world.ResourceVersion()}
	var removals []byte
	// Each upsert encoded, in key order: the world's shared encoding for
	// the node's zone, or the node's own for an entry special to it.
	var few [4][]byte
	upserts, size := few[:0], 0
	for _, k := range keys {
		oldHash, had := old(k)
		svc := c.world.Service(k)
		switch {
		case svc == nil && had:
			r.Version -= oldHash
			removals = appendString(removals, wire.DeltaRemovals, k)
			r.Removals++
		case svc != nil:
			e := svc.EntryFor(node)
			if had && e.Hash == oldHash {
				continue
			}
			r.Version += e.Hash - oldHash // oldHash is 0 when !had
			var u []byte
			if svc.Special(node.Name) {
				u = appendEntry(nil, wire.DeltaUpserts, k, e, svc.TriggerTime)
			} else {
				u = c.world.deltaUpsert(k, svc, node.Zone)
			}
			upserts = append(upserts, u)
			size += len(u)
			r.Upserts++
			r.noteTrigger(svc.TriggerTime)
		}
	}
	nodeChanged := oldNode != node.Hash
	if r.Upserts == 0 && r.Removals == 0 && !nodeChanged {
		return nil
	}
	body := make([]byte, 0, size+len(removals)+len(node.Bytes)+64)
	body = appendVersion(body, wire.DeltaBaseVersion, r.Base)
	body = appendVersion(body, wire.DeltaVersion, r.Version)
	if nodeChanged {
		body = appendMessage(body, wire.DeltaNode, node.Bytes)
	}
	for _, u := range upserts {
		body = append(body, u...)
	}
	body = append(body, removals...)
	r.Body = Body{appendUint(body, wire.DeltaResourceVersion, r.ResourceVersion)}
	return r
}

func (r *Response) noteTrigger(t time.Time) {
	if t.After(r.TriggerTime) {
		r.TriggerTime = t
	}
}
