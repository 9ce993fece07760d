package client

import (
	"hash/fnv"
	"slices"

	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// dialOrder returns the control plane addresses to try, in turn, the
// preferred one first: the learned addresses (the replicas the control
// plane last reported, LearnedAddresses), rotated to start at the one the
// node name picks, then the configured seed, rotated likewise; each
// address once. Learned addresses come first because they are the
// replicas as of the last table, while the seed may name machines
// replaced since (Cluster API, kOps, managed node pools). The seed stays
// in the list so that an agent whose learned addresses went stale (a
// cache from long ago) still reaches the control plane. With nothing
// learned the order is the seed's alone, as before addresses were
// learned.
//
// It is the one place where the order is chosen: a change of policy
// (rendezvous hashing, say) belongs here.
func dialOrder(nodeName string, seed, learned []string) []string {
	out := make([]string, 0, len(seed)+len(learned))
	for _, list := range [][]string{learned, seed} {
		if len(list) == 0 {
			continue
		}
		first := firstAddress(nodeName, len(list))
		for i := range list {
			if a := list[(first+i)%len(list)]; !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// firstAddress picks the address an agent tries first: the same for a
// node every time (it returns to the replica that knows it), spread evenly
// over the replicas across nodes.
func firstAddress(nodeName string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(nodeName))
	return int(h.Sum32() % uint32(n))
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
