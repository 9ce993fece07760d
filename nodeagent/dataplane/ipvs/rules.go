package ipvs

import (
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// Our chains. Every name starts with PP-IPVS-, so that neither kube-proxy
// (KUBE-*) nor the iptables dataplane (PP-*) shares a chain with us.
const (
	chainServices     = "PP-IPVS-SERVICES"      // nat: mark for masquerade
	chainPostrouting  = "PP-IPVS-POSTROUTING"   // nat: hairpin and marked SNAT
	chainMarkMasq     = "PP-IPVS-MARK-MASQ"     // nat: set the masquerade bit
	chainFirewall     = "PP-IPVS-FIREWALL"      // filter: source ranges and Local-policy drops
	chainSourceRanges = "PP-IPVS-SOURCE-RANGES" // filter: loadBalancerSourceRanges
	chainHealthCheck  = "PP-IPVS-HEALTH-CHECK"  // filter: healthCheckNodePorts
	chainFilter       = "PP-IPVS-FILTER"        // filter: reject non-services on service IPs
	chainForward      = "PP-IPVS-FORWARD"       // filter: forwarding under a DROP policy
)

// jumps are kube-proxy's IPVS-mode hooks (iptablesJumpChain) for our
// chains. The filter chains hook INPUT only: every address IPVS serves is
// local (bound to the dummy link, or the node's own), and IPVS takes
// packets in LOCAL_IN after the filter table has seen them.
var jumps = []xtables.Jump{
	{Table: "nat", From: "PREROUTING", To: chainServices, Comment: "proxyplane ipvs service portals"},
	{Table: "nat", From: "OUTPUT", To: chainServices, Comment: "proxyplane ipvs service portals"},
	{Table: "nat", From: "POSTROUTING", To: chainPostrouting, Comment: "proxyplane ipvs postrouting rules"},
	{Table: "filter", From: "INPUT", To: chainFirewall, Comment: "proxyplane ipvs firewall"},
	{Table: "filter", From: "INPUT", To: chainHealthCheck, Comment: "proxyplane ipvs health check node ports"},
	{Table: "filter", From: "INPUT", To: chainFilter, Comment: "proxyplane ipvs access filter"},
	{Table: "filter", From: "FORWARD", To: chainForward, Comment: "proxyplane ipvs forwarding rules"},
}

// renderRules writes the iptables-restore input (for --noflush) of every
// chain we own. It depends on p only, never on the Services: what changes
// with them is the sets' members. Each chain declaration flushes the chain,
// so the input rewrites our chains whole and touches nothing else.
func renderRules(p *ruleParams) []byte {
	var b strings.Builder
	line := func(args ...string) {
		b.WriteString(strings.Join(args, " "))
		b.WriteByte('\n')
	}
	set := func(id setID) []string {
		return []string{"-m", "set", "--match-set", setName(p.family, id), setInfo[id].match}
	}
	comment := func(c string) []string { return []string{"-m", "comment", "--comment", `"` + c + `"`} }
	join := func(parts ...[]string) []string {
		var out []string
		for _, pt := range parts {
			out = append(out, pt...)
		}
		return out
	}
	lo := p.family.Loopback().String()

	line("*nat")
	for _, c := range []string{chainServices, chainPostrouting, chainMarkMasq} {
		line(":" + c + " - [0:0]")
	}
	// Loopback sources never reach a virtual server (localhost NodePorts
	// are not offered); kube-proxy's first rule too.
	line("-A", chainServices, "-s", lo, "-j", "RETURN")
	// ClusterIP traffic from outside the pod network is masqueraded, so
	// that replies from an endpoint on another node come back here (a
	// route for the service range pointed at any node works). The node's
	// own connections are among it: their source is often the service IP
	// itself, bound to the dummy link, which no endpoint can answer.
	clusterMatch := join([]string{"-A", chainServices}, comment("cluster IP traffic from outside the pod network"), set(setClusterIP))
	switch {
	case p.masqueradeAll:
		line(join(clusterMatch, []string{"-j", chainMarkMasq})...)
	case p.localCIDR != "":
		line(join(clusterMatch, []string{"!", "-s", p.localCIDR, "-j", chainMarkMasq})...)
	default:
		// Pods cannot be told apart: masquerade the node's own traffic
		// only, the part that would otherwise break.
		line(join(clusterMatch, []string{"-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq})...)
	}
	// externalTrafficPolicy Cluster: the endpoint may be on another node,
	// and replies must come back through this one.
	line(join([]string{"-A", chainServices}, comment("external traffic, externalTrafficPolicy Cluster"), set(setExternal), []string{"-j", chainMarkMasq})...)
	// externalTrafficPolicy Local keeps the client's address, except for
	// the node's own connections, whose local source an endpoint could not
	// answer.
	line(join([]string{"-A", chainServices}, comment("the node's own traffic to externalTrafficPolicy Local addresses"), set(setExternalLocal),
		[]string{"-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq})...)
	// Hairpin: an endpoint reaching itself through its Service must see
	// the node as the client, or it would answer itself directly. After
	// IPVS's DNAT its packets have source = destination.
	line(join([]string{"-A", chainPostrouting}, comment("hairpin traffic"), set(setLoopBack), []string{"-j", "MASQUERADE"})...)
	line("-A", chainPostrouting, "-m", "mark", "!", "--mark", p.mark+"/"+p.mark, "-j", "RETURN")
	// Clear the bit so that a packet traversing the stack again (a bridge,
	// a tunnel) is not masqueraded twice.
	line("-A", chainPostrouting, "-j", "MARK", "--xor-mark", p.mark)
	masq := join([]string{"-A", chainPostrouting}, comment("proxyplane service traffic requiring SNAT"), []string{"-j", "MASQUERADE"})
	if p.randomFully {
		// Avoids source-port collisions between nodes SNATing to one
		// endpoint.
		masq = append(masq, "--random-fully")
	}
	line(masq...)
	line("-A", chainMarkMasq, "-j", "MARK", "--or-mark", p.mark)
	line("COMMIT")

	line("*filter")
	for _, c := range []string{chainFirewall, chainSourceRanges, chainHealthCheck, chainFilter, chainForward} {
		line(":" + c + " - [0:0]")
	}
	// loadBalancerSourceRanges: the filter table sees the packet before
	// IPVS (LOCAL_IN, after filter INPUT), still addressed to the LB IP.
	line(join([]string{"-A", chainFirewall}, comment("loadBalancerSourceRanges"), set(setFirewall), []string{"-j", chainSourceRanges})...)
	// Local policy, endpoints elsewhere but none here: drop, so clients
	// retry and load balancers' health checks move traffic elsewhere,
	// rather than conclude the Service is down. New connections only:
	// established ones keep their real server while it drains.
	line(join([]string{"-A", chainFirewall}, comment("internalTrafficPolicy Local without a local endpoint"),
		[]string{"-m", "conntrack", "--ctstate", "NEW"}, set(setDropInternal), []string{"-j", "DROP"})...)
	dropExternal := join([]string{"-A", chainFirewall}, comment("externalTrafficPolicy Local without a local endpoint"),
		[]string{"-m", "conntrack", "--ctstate", "NEW"}, set(setDropExternal))
	if p.localCIDR != "" {
		// Pods reaching an external address behave as if they had gone
		// out to the load balancer and come back: any endpoint.
		dropExternal = append(dropExternal, "!", "-s", p.localCIDR)
	}
	line(append(dropExternal, "-m", "addrtype", "!", "--src-type", "LOCAL", "-j", "DROP")...)
	line(join([]string{"-A", chainSourceRanges}, set(setSourceRanges), []string{"-j", "RETURN"})...)
	line("-A", chainSourceRanges, "-j", "DROP")
	// The health check server answers whether or not there are local
	// endpoints; its port must be open whatever the INPUT policy.
	line(join([]string{"-A", chainHealthCheck}, comment("health check node ports"), []string{"-p", "tcp"}, set(setHealthCheck), []string{"-j", "ACCEPT"})...)
	// Service addresses are local: without this, every port a host
	// program listens on would answer on them too (kubernetes#72236).
	for _, id := range []setID{setClusterIP, setExternal, setExternalLocal, setHealthCheck} {
		line(join([]string{"-A", chainFilter}, set(id), []string{"-j", "RETURN"})...)
	}
	line(join([]string{"-A", chainFilter}, comment("no service on this port of a service address"),
		[]string{"-m", "conntrack", "--ctstate", "NEW"}, set(setServiceIPs), []string{"-j", "REJECT"})...)
	// Accept service traffic even when FORWARD's policy is DROP: replies
	// of IPVS connections are forwarded back to the clients.
	line(join([]string{"-A", chainForward}, comment("proxyplane forwarding rules"), []string{"-m", "mark", "--mark", p.mark + "/" + p.mark, "-j", "ACCEPT"})...)
	line(join([]string{"-A", chainForward}, comment("proxyplane forwarding conntrack rule"),
		[]string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"})...)
	line("COMMIT")
	return []byte(b.String())
}
