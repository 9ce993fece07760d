// Package rendezvous orders control plane replica addresses for a node by
// highest random weight (rendezvous hashing). The node agent dials in
// this order (nodeagent/client), and the fleet harness's simulated agents
// use the same order to fail over as real agents do (e2e/cmd/fleet).
package rendezvous

import (
	"hash/fnv"
	"slices"
	"strings"
)

// Order returns addrs ordered for key (a node name) by highest random
// weight: each key and address pair gets a pseudo-random weight, and a
// node tries the addresses by falling weight. A node always starts at the
// same replica, so it returns to the one that knows it, and nodes spread
// evenly over the replicas. Unlike a rotation of one list, the order
// after the first choice is the node's own: when a replica goes, its
// nodes spread evenly over all the others instead of all moving to the
// next address in the list, and a replica added takes an even share from
// every other, moving no node between two old ones. addrs is not
// modified; the order does not depend on addrs' order.
func Order(key string, addrs []string) []string {
	type weighted struct {
		addr   string
		weight uint64
	}
	ws := make([]weighted, len(addrs))
	for i, a := range addrs {
		ws[i] = weighted{a, Weight(key, a)}
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

// Weight is the pseudo-random weight of key at addr.
func Weight(key, addr string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(addr))
	return mix64(h.Sum64())
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
