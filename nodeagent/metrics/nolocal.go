package metrics

import (
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// NoLocalEndpoints keeps sync_proxy_rules_no_local_endpoints_total: after
// each sync, per family, the service ports whose traffic of one kind is
// dropped because its policy is Local and this node has no endpoint,
// while the Service has endpoints elsewhere (kube-proxy's DROP, counted
// where it writes it; with no endpoint at all it REJECTs instead and
// counts nothing). The decisions are plan's, the dataplanes' own.
//
// Tables are immutable and share unchanged entries, so an entry is
// planned again only when its pointer changed: a delta costs a map walk,
// not a plan of every Service. Not safe for concurrent use: the agent's
// goroutine owns it.
type NoLocalEndpoints struct {
	families []dataplane.Family
	// seen holds, by key, the entry last planned and its counts per
	// family (in families' order).
	seen map[string]noLocal
}

type noLocal struct {
	entry              *pb.ServiceEntry
	internal, external []int
}

// NewNoLocalEndpoints returns a NoLocalEndpoints for the node's families.
func NewNoLocalEndpoints(families []dataplane.Family) *NoLocalEndpoints {
	return &NoLocalEndpoints{families: families, seen: map[string]noLocal{}}
}

// Observe sets the gauge from t, the table now in force.
func (n *NoLocalEndpoints) Observe(t *proxytable.Table) {
	internal := make([]int, len(n.families))
	external := make([]int, len(n.families))
	for k, e := range t.Entries {
		c, ok := n.seen[k]
		if !ok || c.entry != e {
			c = n.count(e)
			n.seen[k] = c
		}
		for i := range n.families {
			internal[i] += c.internal[i]
			external[i] += c.external[i]
		}
	}
	for k := range n.seen {
		if _, ok := t.Entries[k]; !ok {
			delete(n.seen, k)
		}
	}
	for i, f := range n.families {
		SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues("internal", f.String()).Set(float64(internal[i]))
		SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues("external", f.String()).Set(float64(external[i]))
	}
}

func (n *NoLocalEndpoints) count(e *pb.ServiceEntry) noLocal {
	c := noLocal{entry: e, internal: make([]int, len(n.families)), external: make([]int, len(n.families))}
	for i, f := range n.families {
		s, ok := plan.Of(e, f)
		if !ok {
			continue
		}
		for _, p := range s.Ports {
			if p.HasEndpoints && !p.HasInternalEndpoints {
				c.internal[i]++
			}
			// External traffic exists only where the port is reachable
			// from outside (kube-proxy's ExternalPolicyLocal).
			if p.HasEndpoints && p.External && !p.HasExternalEndpoints {
				c.external[i]++
			}
		}
	}
	return c
}
