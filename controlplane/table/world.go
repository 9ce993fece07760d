package table

import (
	"slices"
	"sync"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// World is one revision of the cluster model. It is immutable once
// published and safe for concurrent use.
type World struct {
	// Revision counts publications on this replica; it only orders worlds
	// locally. Versions sent to agents are content hashes, not revisions.
	Revision uint64

	services map[string]*compute.Service
	nodes    map[string]*compute.Node

	keysOnce sync.Once
	keys     []string // sorted service keys, built on first use
}

// Service returns the Service under key, or nil.
func (w *World) Service(key string) *compute.Service { return w.services[key] }

// Node returns what is known of the node called name; a node without a
// Node object gets a bare NodeInfo.
func (w *World) Node(name string) *compute.Node {
	if n, ok := w.nodes[name]; ok {
		return n
	}
	return compute.BuildNode(name, nil)
}

// Known reports whether a Node object exists for name.
func (w *World) Known(name string) bool { _, ok := w.nodes[name]; return ok }

// Len is the number of Services.
func (w *World) Len() int { return len(w.services) }

// Keys returns the Service keys, sorted. The slice is shared: do not modify.
func (w *World) Keys() []string {
	w.keysOnce.Do(func() {
		w.keys = make([]string, 0, len(w.services))
		for k := range w.services {
			w.keys = append(w.keys, k)
		}
		slices.Sort(w.keys)
	})
	return w.keys
}

// NodeNames returns the names of known nodes, sorted.
func (w *World) NodeNames() []string {
	names := make([]string, 0, len(w.nodes))
	for n := range w.nodes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Version computes the version of node's table in this world. It walks
// every Service; cursors avoid it by updating versions incrementally.
func (w *World) Version(node *compute.Node) uint64 {
	sum := node.Hash
	for _, s := range w.services {
		sum += s.EntryFor(node).Hash
	}
	return sum
}
