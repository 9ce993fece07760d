package client

import (
	"slices"

	hrw "github.com/proxyplane/proxyplane/internal/rendezvous"
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
// (internal/rendezvous, which the fleet harness's simulated agents share):
// a node always starts at the same replica, and when a replica goes its
// nodes spread evenly over all the others.
func rendezvous(nodeName string, addrs []string) []string { return hrw.Order(nodeName, addrs) }

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
