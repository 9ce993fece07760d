package iptables

import (
	"slices"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

var ctNew = []string{"-m", "conntrack", "--ctstate", "NEW"}

// jumps lists the hooks, as kube-proxy's iptablesJumpChains (README.md
// explains each). Each is inserted at position 1 in turn, so in the
// kernel they end up in reverse order of this list.
var jumps = []xtables.Jump{
	// filter: REJECT/DROP for external addresses without endpoints, on
	// new connections only (replies of established ones must pass).
	{Table: "filter", From: "INPUT", To: chainExternalServices, Match: ctNew, Comment: "proxyplane externally-visible service portals"},
	{Table: "filter", From: "FORWARD", To: chainExternalServices, Match: ctNew, Comment: "proxyplane externally-visible service portals"},
	// filter: healthCheckNodePorts open whatever the INPUT policy.
	{Table: "filter", From: "INPUT", To: chainNodePorts, Comment: "proxyplane health check service ports"},
	// filter: REJECT/DROP for ClusterIPs without endpoints. A ClusterIP
	// is never local, so pod traffic meets it in FORWARD and the node's
	// own in OUTPUT.
	{Table: "filter", From: "FORWARD", To: chainServices, Match: ctNew, Comment: "proxyplane service portals"},
	{Table: "filter", From: "OUTPUT", To: chainServices, Match: ctNew, Comment: "proxyplane service portals"},
	// filter: accept marked service traffic under a DROP FORWARD policy.
	{Table: "filter", From: "FORWARD", To: chainForward, Comment: "proxyplane forwarding rules"},
	// filter: drop load balancer traffic its PP-FW chain did not admit.
	{Table: "filter", From: "INPUT", To: chainFirewall, Match: ctNew, Comment: "proxyplane load balancer firewall"},
	{Table: "filter", From: "OUTPUT", To: chainFirewall, Match: ctNew, Comment: "proxyplane load balancer firewall"},
	{Table: "filter", From: "FORWARD", To: chainFirewall, Match: ctNew, Comment: "proxyplane load balancer firewall"},
	// nat: DNAT before routing, for traffic arriving (PREROUTING) and for
	// the node's own (OUTPUT), so the routing decision sees the endpoint.
	{Table: "nat", From: "OUTPUT", To: chainServices, Comment: "proxyplane service portals"},
	{Table: "nat", From: "PREROUTING", To: chainServices, Comment: "proxyplane service portals"},
	// nat: SNAT after routing, once the output interface is known.
	{Table: "nat", From: "POSTROUTING", To: chainPostrouting, Comment: "proxyplane postrouting rules"},
}

// localnetJumps send everything the node receives or sends to PP-LOCALNET,
// as kube-proxy's KUBE-FIREWALL: the martian rule must see every state
// but the ones it spares, so no --ctstate NEW here.
var localnetJumps = []xtables.Jump{
	{Table: "filter", From: "INPUT", To: chainLocalnet, Comment: "proxyplane localnet firewall"},
	{Table: "filter", From: "OUTPUT", To: chainLocalnet, Comment: "proxyplane localnet firewall"},
}

// jumpsFor returns the jumps of a ruleset: with localhost NodePorts, the
// localnet firewall's too.
func jumpsFor(localhostNodePorts bool) []xtables.Jump {
	if !localhostNodePorts {
		return jumps
	}
	return append(slices.Clip(jumps), localnetJumps...)
}
