package table

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// World is one revision of the cluster model. It is immutable once
// published and safe for concurrent use; what it derives on demand (the
// sorted keys, the zone views) is built once and shared by every stream.
type World struct {
	// Revision counts publications on this replica; it only orders worlds
	// locally. Versions sent to agents are content hashes, not revisions.
	Revision uint64
	// Published is when the store published the world: for a change that
	// carries no trigger time, when the control plane saw it.
	Published time.Time
	// rv is ResourceVersion: it only rises, and only while the world is
	// its store's latest (Store.PublishThrough, under the store's lock).
	rv atomic.Uint64

	services map[string]*compute.Service
	nodes    map[string]*compute.Node // each carries cidrs and cp
	cidrs    *compute.ServiceCIDRs
	cp       *compute.ControlPlaneAddresses

	indexOnce sync.Once
	idx       *worldIndex // built on first use; see index

	viewsMu sync.Mutex // guards views
	views   map[string]*zoneView

	upsertsMu sync.Mutex // guards upserts
	upserts   map[upsertKey][]byte
}

// upsertKey names a Service's entry as the nodes of one or more zones
// see it: by its shared part, which zones a Service's hints do not name
// have in common.
type upsertKey struct {
	key  string
	part *compute.Part
}

// worldIndex is what a world's tables share: the sorted keys, which keys
// each node sees differently from its zone, and which zones any hint names.
type worldIndex struct {
	keys    []string
	special map[string][]int // node name -> indices into keys, ascending
	zones   map[string]bool  // zones named by some Service's hints
}

// zoneView is the table that every node of one zone sees, except for the
// entries special to a node: each entry encoded once as Snapshot.entries,
// in key order. Snapshots of the zone's nodes reference body instead of
// copying it, so a cold start of thousands of agents costs a few views,
// not a table per agent.
type zoneView struct {
	once    sync.Once
	body    []byte
	offsets []int    // entry i is body[offsets[i]:offsets[i+1]]
	hashes  []uint64 // entry i's hash
	sum     uint64   // sum of hashes
	trigger time.Time

	runsOnce   [2]sync.Once
	compressed [2][]run // hashed and unhashed; see runs
}

// ResourceVersion is the cluster's resourceVersion through which this
// world reflects every change to the watched objects: a lower bound, 0
// when unknown. Worlds of different replicas of one cluster compare by
// it. It rises while the world is its store's latest and stays put once
// a newer one is published, so a table built from the world may carry
// the value read when it is built.
func (w *World) ResourceVersion() uint64 { return w.rv.Load() }

// Service returns the Service under key, or nil.
func (w *World) Service(key string) *compute.Service { return w.services[key] }

// Node returns what is known of the node called name, with the cluster's
// service CIDRs and the control plane addresses; a node without a Node
// object gets a bare NodeInfo.
func (w *World) Node(name string) *compute.Node {
	if n, ok := w.nodes[name]; ok {
		return n
	}
	return compute.BuildNode(name, nil).WithCluster(w.cidrs, w.cp)
}

// ServiceCIDRs returns the cluster's service CIDRs.
func (w *World) ServiceCIDRs() *compute.ServiceCIDRs { return w.cidrs }

// ControlPlaneAddresses returns the control plane's replica addresses.
func (w *World) ControlPlaneAddresses() *compute.ControlPlaneAddresses { return w.cp }

// Known reports whether a Node object exists for name.
func (w *World) Known(name string) bool { _, ok := w.nodes[name]; return ok }

// Len is the number of Services.
func (w *World) Len() int { return len(w.services) }

// Keys returns the Service keys, sorted. The slice is shared: do not modify.
func (w *World) Keys() []string { return w.index().keys }

// NodeNames returns the names of known nodes, sorted.
func (w *World) NodeNames() []string {
	names := make([]string, 0, len(w.nodes))
	for n := range w.nodes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Version computes the version of node's table in this world from the
// zone's shared sum and the node's special entries.
func (w *World) Version(node *compute.Node) uint64 {
	idx := w.index()
	zv := w.zoneView(node.Zone)
	sum := node.Hash + zv.sum
	for _, i := range idx.special[node.Name] {
		sum += w.services[idx.keys[i]].EntryFor(node).Hash - zv.hashes[i]
	}
	return sum
}

// index builds the world's index on first use. It walks every Service
// once per world, and only when a snapshot or a version is needed.
func (w *World) index() *worldIndex {
	w.indexOnce.Do(func() {
		idx := &worldIndex{keys: make([]string, 0, len(w.services)), special: map[string][]int{}, zones: map[string]bool{}}
		for k := range w.services {
			idx.keys = append(idx.keys, k)
		}
		slices.Sort(idx.keys)
		for i, k := range idx.keys {
			svc := w.services[k]
			if svc.Uniform() {
				continue
			}
			for _, n := range svc.SpecialNodes() {
				idx.special[n] = append(idx.special[n], i)
			}
			for _, z := range svc.HintedZones() {
				idx.zones[z] = true
			}
		}
		w.idx = idx
	})
	return w.idx
}

// zoneView returns the view of a node in zone, building it on first use.
// Zones that no hint names share the view of "".
func (w *World) zoneView(zone string) *zoneView {
	if !w.index().zones[zone] {
		zone = ""
	}
	w.viewsMu.Lock()
	zv := w.views[zone]
	if zv == nil {
		if w.views == nil {
			w.views = map[string]*zoneView{}
		}
		zv = &zoneView{}
		w.views[zone] = zv
	}
	w.viewsMu.Unlock()
	zv.once.Do(func() { zv.build(w, zone) })
	return zv
}

func (zv *zoneView) build(w *World, zone string) {
	keys := w.index().keys
	entries := make([]compute.Entry, len(keys))
	size := 0
	for i, k := range keys {
		entries[i] = w.services[k].ZoneEntry(zone)
		size += entries[i].Size() + len(k) + entryOverhead
	}
	zv.body = make([]byte, 0, size)
	zv.offsets = make([]int, len(keys)+1)
	zv.hashes = make([]uint64, len(keys))
	for i, k := range keys {
		svc := w.services[k]
		zv.offsets[i] = len(zv.body)
		zv.body = appendEntry(zv.body, wire.SnapshotEntries, k, entries[i], svc.TriggerTime)
		zv.hashes[i] = entries[i].Hash
		zv.sum += entries[i].Hash
		if svc.TriggerTime.After(zv.trigger) {
			zv.trigger = svc.TriggerTime
		}
	}
	zv.offsets[len(keys)] = len(zv.body)
}

// deltaUpsert returns the Service svc under key as Delta.upserts encodes
// it for the nodes of zone to which it is not special (whose entry is
// svc.ZoneEntry(zone)): encoded once per world and view and shared by
// every stream's delta, as a snapshot's entries are shared through the
// zone views, rather than once per agent. Callers copy it; never modify
// it. A world keeps those of the Services its deltas changed, or, for
// an agent back with an older table, of every Service that differs: at
// most a zone view's worth per view.
func (w *World) deltaUpsert(key string, svc *compute.Service, zone string) []byte {
	e := svc.ZoneEntry(zone)
	k := upsertKey{key, e.Shared}
	w.upsertsMu.Lock()
	defer w.upsertsMu.Unlock()
	if b, ok := w.upserts[k]; ok {
		return b
	}
	if w.upserts == nil {
		w.upserts = map[upsertKey][]byte{}
	}
	b := appendEntry(nil, wire.DeltaUpserts, key, e, svc.TriggerTime)
	w.upserts[k] = b
	return b
}
