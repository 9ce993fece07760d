package client

import (
	"hash/fnv"
	"slices"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// dialOrder returns the control plane addresses to try, in turn, the
// preferred one first: the learned addresses (the replicas the control
// plane last reported, LearnedAddresses), then the configured seed, each
// list in the node's rendezvous order; each address once. Learned
// addresses come first because they are the replicas as of the last
// table, while the seed may name machines replaced since (Cluster API,
// kOps, managed node pools). The seed stays in the list so that an agent
// whose learned addresses went stale (a cache from long ago) still
// reaches the control plane.
//
// It is the one place where the order is chosen.
func dialOrder(nodeName string, seed, learned []string) []string {
	out := make([]string, 0, len(seed)+len(learned))
	for _, list := range [][]string{learned, seed} {
		for _, a := range rendezvous(nodeName, list) {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// rendezvous orders addrs for nodeName by highest random weight
// (rendezvous hashing): each node and address pair gets a pseudo-random
// weight, and a node tries the addresses by falling weight. A node always
// starts at the same replica, so it returns to the one that knows it, and
// nodes spread evenly over the replicas. Unlike a rotation of one list,
// the order after the first choice is the node's own: when a replica
// goes, its nodes spread evenly over all the others instead of all moving
// to the next address in the list, and a replica added takes an even
// share from every other, moving no node between two old ones.
func rendezvous(nodeName string, addrs []string) []string {
	type weighted struct {
		addr   string
		weight uint64
	}
	ws := make([]weighted, len(addrs))
	for i, a := range addrs {
		h := fnv.New64a()
		_, _ = h.Write([]byte(nodeName))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(a))
		ws[i] = weighted{a, mix64(h.Sum64())}
	}
	slices.SortStableFunc(ws, func(x, y weighted) int {
		switch {
		case x.weight > y.weight:
			return -1
		case x.weight < y.weight:
			return 1
		}
		return strings.Compare(x.addr, y.addr)
	})
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.addr
	}
	return out
}

// mix64 is splitmix64's finalizer. FNV alone changes little in its high
// bits for names that differ in their last characters (node-1, node-2),
// which would make every node rank the addresses alike.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// LearnedAddresses returns the control plane addresses the agent learned
// from the control plane: those of the table in force, or, before any
// table is in force, those of cached, the table loaded from the agent's
// cache at start (nil for none). Both were validated as tables are
// (proxytable: "ip:port", canonical, unicast).
func LearnedAddresses(held, cached *proxytable.Table) []string {
	if held != nil && held.Version != "" {
		return held.Node.GetControlPlaneAddresses()
	}
	if cached != nil {
		return cached.Node.GetControlPlaneAddresses()
	}
	return nil
}
