package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// params is everything building needs besides the table, resolved from
// Config and the table's NodeInfo at each sync.
type params struct {
	family        dataplane.Family
	mark          uint32
	masqueradeAll bool
	// localCIDR is the pod CIDR of the family; invalid when pod traffic
	// cannot be recognised (LocalNone, or NodeCIDR without a pod CIDR).
	localCIDR     netip.Prefix
	nodePortAll   bool           // NodePorts on every local address but loopback
	nodePortCIDRs []netip.Prefix // else on the local addresses in these
	nodeIPs       []netip.Addr
	// serviceCIDRs are the cluster's service CIDRs of the family, from
	// the table's NodeInfo.
	serviceCIDRs []netip.Prefix
	randomFully  bool
	// endpointMapMin is Config.EndpointMapMin, defaulted.
	endpointMapMin int
}

func newParams(c *Config, node *pb.NodeInfo) params {
	s := &c.Settings
	p := params{
		family:        s.Family,
		mark:          uint32(1) << uint(s.MasqueradeBit),
		masqueradeAll: s.MasqueradeAll,
		nodeIPs:       s.PrimaryIPs(node),
		randomFully:   !s.NoRandomFully,
		localCIDR:     s.LocalCIDR(node),
		serviceCIDRs:  s.Family.Prefixes(node.GetServiceCidrs()),
	}
	p.nodePortAll, p.nodePortCIDRs = s.NodePorts(p.nodeIPs)
	p.endpointMapMin = c.EndpointMapMin
	if p.endpointMapMin == 0 {
		p.endpointMapMin = DefaultEndpointMapMin
	}
	return p
}

// fingerprint identifies everything in p that rules depend on; a change
// (the node's pod CIDR in NodeCIDR mode, the service CIDRs) makes the next
// sync a full one.
func (p *params) fingerprint() string { return fmt.Sprintf("%+v", *p) }

// Base-chain priorities, numeric because nft 1.0.6 names them only on some
// hooks. NAT at the standard dstnat (-100) and srcnat (100); the filter
// chains that must see the original destination (source ranges) just
// before DNAT; the checks that must see it after DNAT (so that
// short-circuited and DNATed traffic no longer matches) just after it on
// the output hook, as kube-proxy's filter-output-post-dnat.
const (
	prioDNAT     = -100
	prioSNAT     = 100
	prioPreDNAT  = prioDNAT - 10
	prioPostDNAT = prioDNAT + 10
)

// skeleton returns the shared chains and sets: everything that does not
// belong to one Service. Elements are added by the Services.
func skeleton(p *params) ([]*chain, []*set) {
	f := p.family
	newCT := ctState{}
	sets := []*set{
		{name: mapServiceIPs, key: keyAddrProtoPort, vmap: true},
		{name: mapServiceNodePorts, key: keyProtoPort, vmap: true},
		{name: mapNoEndpointServices, key: keyAddrProtoPort, vmap: true},
		{name: mapNoEndpointNodePorts, key: keyProtoPort, vmap: true},
		{name: mapFirewallIPs, key: keyAddrProtoPort, vmap: true},
		{name: setClusterIPs, key: keyAddr},
		{name: setHairpin, key: keyHairpin},
	}
	base := func(name, typ, hook string, prio int, rules ...rule) *chain {
		return &chain{name: name, hook: &baseHook{typ: typ, hook: hook, priority: prio}, rules: rules}
	}
	// No "ct state invalid drop", as upstream's nftables mode (kubernetes
	// #122663): that iptables-mode rule works around a conntrack bug
	// fixed in Linux 6.1 (out-of-window packets forwarded un-NATed,
	// kubernetes #74839), for which nf_conntrack_tcp_be_liberal is the
	// cure on older kernels, and it drops legitimate forwarded traffic
	// that conntrack cannot follow, asymmetric routes and multi-homed
	// nodes included (kubernetes #94861, #117924).
	forward := []rule{
		newRule(newCT, jump(chainServiceEndpoints)),
		newRule(newCT, jump(chainClusterIPsCheck)),
	}

	loopback := f.Loopback()
	services := []rule{newRule(vmapLookup{withAddr: true, set: mapServiceIPs})}
	nodePortChecks := []rule{}
	if p.nodePortAll {
		// fib daddr type local matches every address of the node, present
		// and future, without listing interfaces; loopback is excluded
		// (localhost NodePorts would need route_localnet, see README).
		services = append(services, newRule(fibLocal{}, addrMatch{neg: true, p: loopback}, vmapLookup{set: mapServiceNodePorts}))
		// On the input path every destination is local already.
		nodePortChecks = append(nodePortChecks, newRule(addrMatch{neg: true, p: loopback}, vmapLookup{set: mapNoEndpointNodePorts}))
	} else {
		for _, cidr := range p.nodePortCIDRs {
			services = append(services, newRule(addrMatch{p: cidr}, fibLocal{}, vmapLookup{set: mapServiceNodePorts}))
			nodePortChecks = append(nodePortChecks, newRule(addrMatch{p: cidr}, vmapLookup{set: mapNoEndpointNodePorts}))
		}
	}

	chains := []*chain{
		// Source ranges are checked before DNAT, on the load balancer IP.
		base(chainFilterPrerouting, "filter", "prerouting", prioPreDNAT, newRule(newCT, jump(chainFirewallCheck))),
		base(chainFilterInput, "filter", "input", prioPreDNAT,
			newRule(newCT, jump(chainNodePortEndpoints)),
			newRule(newCT, jump(chainServiceEndpoints))),
		base(chainFilterForward, "filter", "forward", prioPreDNAT, forward...),
		base(chainFilterOutput, "filter", "output", prioPreDNAT, newRule(newCT, jump(chainFirewallCheck))),
		// The node's own traffic is checked after DNAT: traffic the
		// external chain short-circuits (eTP Local) has a new destination
		// by then, as on the forward path.
		base(chainFilterOutputPost, "filter", "output", prioPostDNAT,
			newRule(newCT, jump(chainServiceEndpoints)),
			newRule(newCT, jump(chainClusterIPsCheck))),
		base(chainNATPrerouting, "nat", "prerouting", prioDNAT, newRule(jump(chainServices))),
		base(chainNATOutput, "nat", "output", prioDNAT, newRule(jump(chainServices))),
		base(chainNATPostrouting, "nat", "postrouting", prioSNAT, newRule(jump(chainMasquerading))),
		{name: chainServices, rules: services},
		{name: chainMasquerading, rules: []rule{
			// Hairpin: a pod reaching itself through a Service must be
			// masqueraded, or it would answer itself directly. One set
			// of endpoints, as upstream's, rather than a rule per
			// endpoint: an endpoint is then an element, not a chain.
			// Upstream lists only the node's own endpoints; this lists
			// every endpoint, so that the packets masqueraded are those
			// the iptables mode masquerades.
			newRule(hairpinMatch{set: setHairpin}, markSet{mark: p.mark}),
			newRule(markClear{p.mark}, verdictOf(verdictReturn)),
			// Clear the mark so that a packet that traverses the stack
			// again (a tunnel, a bridge) is not masqueraded twice.
			newRule(markSet{xor: true, mark: p.mark}),
			newRule(masquerade{fullyRandom: p.randomFully}),
		}},
		{name: chainMarkMasq, rules: []rule{newRule(markSet{mark: p.mark})}},
		{name: chainServiceEndpoints, rules: []rule{newRule(vmapLookup{withAddr: true, set: mapNoEndpointServices})}},
		{name: chainNodePortEndpoints, rules: nodePortChecks},
		// ICMP port unreachable for every protocol, TCP included, as
		// upstream's reject-chain (and iptables' REJECT).
		{name: chainReject, rules: []rule{newRule(reject{})}},
		{name: chainFirewallCheck, rules: []rule{newRule(vmapLookup{withAddr: true, set: mapFirewallIPs})}},
		{name: chainClusterIPsCheck, rules: clusterIPsCheck(p)},
	}
	return chains, sets
}

// clusterIPsCheck returns the rules of cluster-ips-check, which sees new
// connections after DNAT, as kube-proxy's nftables mode. What is still
// addressed to a ClusterIP then is for a port the Service does not have:
// refuse it rather than route it out. What is still addressed to the
// service CIDRs is for an address no Service of the table holds
// (unallocated, or a Service another proxy handles): drop it, as upstream,
// rather than route it off the node. One rule per CIDR, not an anonymous
// set: a cluster has one or two, and anonymous sets are what makes large
// commits slow.
func clusterIPsCheck(p *params) []rule {
	rules := []rule{newRule(setMatch{set: setClusterIPs}, goTo(chainReject))}
	for _, cidr := range p.serviceCIDRs {
		rules = append(rules, newRule(addrMatch{p: cidr}, verdictOf(verdictDrop)))
	}
	return rules
}

// fragment is what one Service contributes: its own chains, endpoint
// maps and affinity sets, and its elements in the shared maps and sets.
type fragment struct {
	// entry is the table's entry the fragment was built from (see
	// rebuildState).
	entry  *pb.ServiceEntry
	chains []*chain
	sets   []*set
	// epMaps holds the endpoints of the Service's endpoint maps, by
	// name: endpoint i is the element of index i. Endpoints, not
	// elements: one per endpoint, a third of an element's size.
	epMaps map[string][]netip.AddrPort
	elems  []elemRef
	// hairpin holds the Service's keys in the hairpin set, each once.
	// Not in elems: the set holds one element per endpoint, and the
	// state counts the Services wanting each (state.hairpin) rather
	// than holding a claim apiece, which would be a third of the
	// agent's memory at 250,000 endpoints.
	hairpin []hairpinKey
}

// hairpinKey is a hairpin element's key, an endpoint's address, protocol
// and port, without netip.Addr's pointer: there is one per endpoint in
// the fragments and one in the state's counts, 20 bytes rather than an
// elemKey's 32, and nothing for the collector to scan.
type hairpinKey struct {
	addr  [16]byte
	port  uint16
	proto uint8
	is4   bool
}

func newHairpinKey(a netip.Addr, proto uint8, port uint16) hairpinKey {
	return hairpinKey{addr: a.As16(), port: port, proto: proto, is4: a.Is4()}
}

// elemKey is h as the hairpin set's key.
func (h hairpinKey) elemKey() elemKey {
	a := netip.AddrFrom16(h.addr)
	if h.is4 {
		a = a.Unmap()
	}
	return elemKey{addr: a, proto: h.proto, port: h.port}
}

func compareHairpin(a, b hairpinKey) int { return compareKeys(a.elemKey(), b.elemKey()) }

// elemRef is an element of a shared map or set.
type elemRef struct {
	set string
	element
}

// elemID identifies an element across the table.
type elemID struct {
	set string
	key elemKey
}

func (r elemRef) id() elemID { return elemID{set: r.set, key: r.key} }

// fragmentOf returns the fragment of entry e for p, nil when e has no
// cluster IP of p's family.
func fragmentOf(e *pb.ServiceEntry, p *params) *fragment {
	plan, ok := planService(e, p.family)
	if !ok {
		return nil
	}
	fr := buildService(p, plan)
	fr.entry = e
	return fr
}

// buildService returns plan's fragment.
func buildService(p *params, plan *svcPlan) *fragment {
	// At most this many elements (see buildPort): allocated once, as
	// fragments are held as long as their Services.
	n, eps := 1, 0
	for i := range plan.ports {
		n += 4 + 2*len(plan.ExternalIPs) + 3*len(plan.LoadBalancerIPs)
		eps += len(plan.ports[i].allEps)
	}
	fr := &fragment{elems: make([]elemRef, 0, n), hairpin: make([]hairpinKey, 0, eps)}
	seen := make(map[elemID]struct{}, n+eps)
	add := func(set string, key elemKey, v verdict) {
		r := elemRef{set: set, element: element{key: key, verdict: v}}
		if _, dup := seen[r.id()]; !dup {
			seen[r.id()] = struct{}{}
			fr.elems = append(fr.elems, r)
		}
	}
	addHairpin := func(k elemKey) {
		id := elemID{set: setHairpin, key: k}
		if _, dup := seen[id]; !dup {
			seen[id] = struct{}{}
			fr.hairpin = append(fr.hairpin, newHairpinKey(k.addr, k.proto, k.port))
		}
	}
	add(setClusterIPs, elemKey{addr: plan.ClusterIP}, verdict{})
	for i := range plan.ports {
		buildPort(p, plan, &plan.ports[i], fr, add, addHairpin)
	}
	if cap(fr.elems) > len(fr.elems)+len(fr.elems)/4 {
		fr.elems = slices.Clone(fr.elems)
	}
	if cap(fr.hairpin) > len(fr.hairpin)+len(fr.hairpin)/4 {
		fr.hairpin = slices.Clone(fr.hairpin)
	}
	return fr
}

func buildPort(p *params, plan *svcPlan, pp *portPlan, fr *fragment, add func(string, elemKey, verdict), addHairpin func(elemKey)) {
	key := func(a netip.Addr) elemKey { return elemKey{addr: a, proto: pp.proto, port: pp.port} }

	var internalFilter, externalFilter verdict
	if !pp.HasEndpoints {
		// No endpoint anywhere: reject, so clients fail fast.
		internalFilter, externalFilter = goTo(chainReject), goTo(chainReject)
	} else {
		// Endpoints exist but not on this node (policy Local): drop, so
		// the client retries or the load balancer's health check moves
		// traffic elsewhere, rather than seeing the service as down.
		if !pp.HasInternalEndpoints {
			internalFilter = verdictOf(verdictDrop)
		}
		if !pp.HasExternalEndpoints {
			externalFilter = verdictOf(verdictDrop)
		}
	}

	if pp.HasInternalEndpoints {
		add(mapServiceIPs, key(plan.ClusterIP), goTo(pp.internalChain))
	} else {
		add(mapNoEndpointServices, key(plan.ClusterIP), internalFilter)
	}
	for _, ip := range plan.ExternalIPs {
		if pp.HasEndpoints {
			add(mapServiceIPs, key(ip), goTo(pp.extChain))
		}
		if !pp.HasExternalEndpoints {
			// Traffic the external chain did not short-circuit ends here.
			add(mapNoEndpointServices, key(ip), externalFilter)
		}
	}
	for _, ip := range plan.LoadBalancerIPs {
		if pp.HasEndpoints {
			add(mapServiceIPs, key(ip), goTo(pp.extChain))
		}
		if pp.UsesFirewall {
			add(mapFirewallIPs, key(ip), goTo(pp.fwChain))
		}
		if !pp.HasExternalEndpoints {
			add(mapNoEndpointServices, key(ip), externalFilter)
		}
	}
	if pp.nodePort != 0 {
		np := elemKey{proto: pp.proto, port: pp.nodePort}
		if pp.HasEndpoints {
			// NodePorts are not subject to loadBalancerSourceRanges, as
			// upstream: a load balancer may deliver to them.
			add(mapServiceNodePorts, np, goTo(pp.extChain))
		}
		if !pp.HasExternalEndpoints {
			add(mapNoEndpointNodePorts, np, externalFilter)
		}
	}

	// Internal traffic: masquerade what does not come from a local pod,
	// so that replies from an endpoint on another node come back through
	// this node (a ClusterIP route pointed at any node works).
	var internalMasq []rule
	if pp.HasInternalEndpoints {
		match := []rexpr{addrMatch{p: netip.PrefixFrom(plan.ClusterIP, plan.ClusterIP.BitLen())}, dportMatch{proto: pp.proto, port: pp.port}}
		switch {
		case p.masqueradeAll:
			internalMasq = append(internalMasq, newRule(append(match, jump(chainMarkMasq))...))
		case p.localCIDR.IsValid():
			internalMasq = append(internalMasq, newRule(append(match, addrMatch{src: true, neg: true, p: p.localCIDR}, jump(chainMarkMasq))...))
		}
	}

	if pp.UsesExternal {
		ext := &chain{name: pp.extChain}
		if !plan.ExternalLocal {
			// Endpoints may be on other nodes: masquerade so replies
			// return through this node.
			ext.rules = append(ext.rules, newRule(jump(chainMarkMasq)))
		} else {
			// Local endpoints only: keep the client's address. Pods and
			// the node itself reaching an external address take the
			// Cluster path, as if they had gone out to the load
			// balancer and come back.
			if p.localCIDR.IsValid() {
				ext.rules = append(ext.rules, newRule(addrMatch{src: true, p: p.localCIDR}, goTo(pp.svcChain)))
			}
			// The node's own traffic has a local (often the external)
			// source address, which an endpoint could not answer.
			ext.rules = append(ext.rules,
				newRule(fibLocal{src: true}, jump(chainMarkMasq)),
				newRule(fibLocal{src: true}, goTo(pp.svcChain)))
		}
		if pp.HasExternalEndpoints {
			ext.rules = append(ext.rules, newRule(goTo(pp.externalPolicyChain)))
		}
		fr.chains = append(fr.chains, ext)
	}

	if pp.UsesFirewall {
		// Everything not from an allowed source is dropped, before DNAT
		// (chain firewall-check, filter-prerouting and filter-output). One
		// "!=" per range rather than an anonymous set: anonymous sets are
		// what makes large commits quadratic.
		var exprs []rexpr
		allowFromNode := false
		for _, cidr := range plan.SourceRanges {
			exprs = append(exprs, addrMatch{src: true, neg: true, p: cidr})
			for _, ip := range p.nodeIPs {
				allowFromNode = allowFromNode || cidr.Contains(ip)
			}
		}
		if allowFromNode {
			// A VIP-style load balancer IP is often local to the node:
			// the node's own requests to it loop back with the LB IP as
			// source and must be let in when the node itself is allowed.
			for _, ip := range plan.LoadBalancerIPs {
				exprs = append(exprs, addrMatch{src: true, neg: true, p: netip.PrefixFrom(ip, ip.BitLen())})
			}
		}
		fr.chains = append(fr.chains, &chain{name: pp.fwChain, rules: []rule{newRule(append(exprs, verdictOf(verdictDrop))...)}})
	}

	if len(pp.clusterEps) > 0 {
		c := &chain{name: pp.svcChain}
		if pp.internalChain == pp.svcChain {
			c.rules = append(c.rules, internalMasq...)
		}
		c.rules = endpointRules(p, plan, pp, c.rules, pp.clusterEps, pp.svcMap, fr)
		fr.chains = append(fr.chains, c)
	}
	if len(pp.localEps) > 0 {
		c := &chain{name: pp.svlChain}
		if pp.internalChain == pp.svlChain {
			c.rules = append(c.rules, internalMasq...)
		}
		c.rules = endpointRules(p, plan, pp, c.rules, pp.localEps, pp.svlMap, fr)
		fr.chains = append(fr.chains, c)
	}

	for _, ep := range pp.allEps {
		// Hairpin (see the masquerading chain): the endpoint reaching
		// itself, after DNAT to its address and port.
		addHairpin(elemKey{addr: ep.addr, proto: pp.proto, port: ep.port})
		if ep.affinitySet == "" {
			continue
		}
		// With affinity, each endpoint has a chain that records the
		// client in the endpoint's set, then DNATs.
		fr.sets = append(fr.sets, &set{name: ep.affinitySet, key: keyAddr, timeout: time.Duration(plan.AffinityTimeout) * time.Second})
		fr.chains = append(fr.chains, &chain{name: ep.chain, rules: []rule{
			newRule(setUpdate{set: ep.affinitySet}),
			newRule(protoMatch{pp.proto}, dnatTo{addr: ep.addr, port: ep.port}),
		}})
	}
}

// endpointRules appends the rules of a service or local chain. The
// random choice is a cascade: rule i of n matches with probability
// 1/(n-i), which gives each endpoint 1/n overall, and the last is
// unconditional. Without affinity each rule DNATs; from
// p.endpointMapMin endpoints, one rule picks from the chain's endpoint
// map instead, and the map (named mapName) goes into fr. With affinity,
// as upstream, the endpoints have chains: affinity first (a client seen
// recently goes back to its endpoint), then the cascade to the chains.
func endpointRules(p *params, plan *svcPlan, pp *portPlan, rules []rule, eps []epPlan, mapName string, fr *fragment) []rule {
	n := len(eps)
	if plan.AffinityTimeout == 0 && n < p.endpointMapMin {
		for i, ep := range eps {
			dnat := []rexpr{protoMatch{pp.proto}, dnatTo{addr: ep.addr, port: ep.port}}
			if i < n-1 {
				dnat = append([]rexpr{numgenZero{mod: uint32(n - i)}}, dnat...)
			}
			rules = append(rules, newRule(dnat...))
		}
		return rules
	}
	if plan.AffinityTimeout == 0 {
		els := make([]netip.AddrPort, n)
		for i, ep := range eps {
			els[i] = netip.AddrPortFrom(ep.addr, ep.port)
		}
		fr.sets = append(fr.sets, &set{name: mapName, key: keyIndex, endpoints: true})
		if fr.epMaps == nil {
			fr.epMaps = map[string][]netip.AddrPort{}
		}
		fr.epMaps[mapName] = els
		return append(rules, newRule(protoMatch{pp.proto}, dnatMap{set: mapName, mod: uint32(n)}))
	}
	for _, ep := range eps {
		rules = append(rules, newRule(setMatch{src: true, set: ep.affinitySet}, goTo(ep.chain)))
	}
	for i, ep := range eps {
		if i < n-1 {
			rules = append(rules, newRule(numgenZero{mod: uint32(n - i)}, goTo(ep.chain)))
			continue
		}
		rules = append(rules, newRule(goTo(ep.chain)))
	}
	return rules
}
