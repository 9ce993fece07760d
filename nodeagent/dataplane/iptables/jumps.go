package iptables

import (
	"context"
	"fmt"
)

// jump is a rule in a built-in chain that sends packets into one of our
// top-level chains. Jumps are not part of the restore input: a restore
// would have to own (and so flush) PREROUTING, INPUT and the rest, which
// belong to everyone on the node. They are ensured one by one instead,
// idempotently, at the top of the built-in chain so that a later
// "-A INPUT -j DROP" from a host firewall cannot shadow them.
type jump struct {
	table, from, to string
	match           []string // before the comment
	comment         string
}

// rule returns the rule's arguments as iptables takes them.
func (j jump) rule() []string {
	out := append([]string{}, j.match...)
	return append(out, "-m", "comment", "--comment", j.comment, "-j", j.to)
}

var ctNew = []string{"-m", "conntrack", "--ctstate", "NEW"}

// jumps lists the hooks, as kube-proxy's iptablesJumpChains (README.md
// explains each). Each is inserted at position 1 in turn, so in the
// kernel they end up in reverse order of this list.
var jumps = []jump{
	// filter: REJECT/DROP for external addresses without endpoints, on
	// new connections only (replies of established ones must pass).
	{"filter", "INPUT", chainExternalServices, ctNew, "proxyplane externally-visible service portals"},
	{"filter", "FORWARD", chainExternalServices, ctNew, "proxyplane externally-visible service portals"},
	// filter: healthCheckNodePorts open whatever the INPUT policy.
	{"filter", "INPUT", chainNodePorts, nil, "proxyplane health check service ports"},
	// filter: REJECT/DROP for ClusterIPs without endpoints. A ClusterIP
	// is never local, so pod traffic meets it in FORWARD and the node's
	// own in OUTPUT.
	{"filter", "FORWARD", chainServices, ctNew, "proxyplane service portals"},
	{"filter", "OUTPUT", chainServices, ctNew, "proxyplane service portals"},
	// filter: accept marked service traffic under a DROP FORWARD policy.
	{"filter", "FORWARD", chainForward, nil, "proxyplane forwarding rules"},
	// filter: drop load balancer traffic its PP-FW chain did not admit.
	{"filter", "INPUT", chainFirewall, ctNew, "proxyplane load balancer firewall"},
	{"filter", "OUTPUT", chainFirewall, ctNew, "proxyplane load balancer firewall"},
	{"filter", "FORWARD", chainFirewall, ctNew, "proxyplane load balancer firewall"},
	// nat: DNAT before routing, for traffic arriving (PREROUTING) and for
	// the node's own (OUTPUT), so the routing decision sees the endpoint.
	{"nat", "OUTPUT", chainServices, nil, "proxyplane service portals"},
	{"nat", "PREROUTING", chainServices, nil, "proxyplane service portals"},
	// nat: SNAT after routing, once the output interface is known.
	{"nat", "POSTROUTING", chainPostrouting, nil, "proxyplane postrouting rules"},
}

// ensureJumps installs every jump. Our chains must exist (a restore
// created them) or the kernel refuses the jump.
func ensureJumps(ctx context.Context, r runner) error {
	for _, j := range jumps {
		if err := r.EnsureRule(ctx, j.table, j.from, j.rule()...); err != nil {
			return fmt.Errorf("ensuring %s %s jumps to %s: %w", j.table, j.from, j.to, err)
		}
	}
	return nil
}
