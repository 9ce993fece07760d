package ipvs

import (
	"fmt"
	"net/netip"
	"slices"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// params is everything planning needs besides the table, resolved from
// Config, the table's NodeInfo and the node's addresses at each sync.
type params struct {
	family    Family
	scheduler string
	// nodeAddrs are the node's own addresses (not the dummy link's): an
	// external or load balancer IP among them is not bound again.
	nodeAddrs []netip.Addr
	// nodePortAddrs are the addresses NodePort virtual servers are made
	// on: nodeAddrs inside Config.NodePortAddresses.
	nodePortAddrs []netip.Addr
	// nodeIPs are Config.NodeIPs of the family.
	nodeIPs []netip.Addr
	rules   ruleParams
}

// ruleParams is what the iptables rules depend on.
type ruleParams struct {
	family        Family
	mark          string // the masquerade bit as a mark value, "0x004000"
	masqueradeAll bool
	// localCIDR is the pod CIDR of the family; "" when pod traffic cannot
	// be recognised (LocalNone, or NodeCIDR without a pod CIDR).
	localCIDR   string
	randomFully bool
}

func newParams(c *Config, node *pb.NodeInfo, nodeAddrs []netip.Addr) *params {
	p := &params{
		family:    c.Family,
		scheduler: c.Scheduler,
		nodeIPs:   c.nodeIPs(),
		rules: ruleParams{
			family:        c.Family,
			mark:          fmt.Sprintf("%#08x", uint32(1)<<uint(c.MasqueradeBit)),
			masqueradeAll: c.MasqueradeAll,
			randomFully:   !c.NoRandomFully,
		},
	}
	for _, a := range nodeAddrs {
		if c.Family.has(a) {
			p.nodeAddrs = append(p.nodeAddrs, a)
		}
	}
	slices.SortFunc(p.nodeAddrs, netip.Addr.Compare)
	p.nodeAddrs = slices.Compact(p.nodeAddrs)
	cidrs := c.prefixesOf(c.NodePortAddresses)
	for _, a := range p.nodeAddrs {
		if len(c.NodePortAddresses) == 0 || slices.ContainsFunc(cidrs, func(pr netip.Prefix) bool { return pr.Contains(a) }) {
			p.nodePortAddrs = append(p.nodePortAddrs, a)
		}
	}
	switch c.LocalMode {
	case LocalClusterCIDR:
		if cidr, err := c.clusterCIDR(); err == nil {
			p.rules.localCIDR = cidr.String()
		}
	case LocalNodeCIDR:
		// Upstream takes the node's first pod CIDR of the family too.
		for _, s := range node.GetPodCidrs() {
			if pr, err := netip.ParsePrefix(s); err == nil && c.Family.has(pr.Addr()) {
				p.rules.localCIDR = pr.Masked().String()
				break
			}
		}
	}
	return p
}

// fingerprint identifies everything in p that plans and rules depend on;
// a change (a node address, the pod CIDR in NodeCIDR mode) makes the next
// sync full.
func (p *params) fingerprint() string { return fmt.Sprintf("%+v", *p) }

// svcPlan is what one Service wants in the kernel for one family.
type svcPlan struct {
	key string
	vss []*vsPlan
	// binds are the addresses the Service wants on the dummy link.
	binds []netip.Addr
	// entries are its members of each set.
	entries [numSets][]string
}

// vsPlan is one wanted virtual server and its real servers (weight 1).
type vsPlan struct {
	vs VirtualServer
	// dests are the real servers, sorted and unique.
	dests []netip.AddrPort
	// name is the service port name ("ns/name:port"), for dumps and
	// errors.
	name string
	key  string // the Service's key
}

// planService plans e for p.family; ok is false when the Service has no
// cluster IP of the family and so nothing to program (kube-proxy's
// per-family proxier never sees such a Service).
func planService(e *pb.ServiceEntry, p *params) (plan *svcPlan, ok bool) {
	s := e.GetService()
	fam := p.family
	var clusterIP netip.Addr
	for _, ip := range s.GetClusterIps() {
		if a, err := netip.ParseAddr(ip); err == nil && fam.has(a.Unmap()) {
			clusterIP = a.Unmap()
			break
		}
	}
	if !clusterIP.IsValid() {
		return nil, false
	}
	plan = &svcPlan{key: e.GetKey()}
	externalIPs := familyAddrs(s.GetExternalIps(), fam)
	lbIPs := familyAddrs(s.GetLoadBalancerIps(), fam)
	// A Service with source ranges, none of this family, lets nothing of
	// this family in: failing closed, as the iptables dataplane does.
	firewall := len(s.GetLoadBalancerSourceRanges()) > 0
	var sourceRanges []netip.Prefix
	for _, r := range s.GetLoadBalancerSourceRanges() {
		if pr, err := netip.ParsePrefix(r); err == nil && fam.has(pr.Addr()) {
			sourceRanges = append(sourceRanges, pr.Masked())
		}
	}
	allowFromNode := slices.ContainsFunc(sourceRanges, func(pr netip.Prefix) bool {
		return slices.ContainsFunc(p.nodeIPs, pr.Contains)
	})
	var timeout uint32
	if a := s.GetSessionAffinity(); a != nil && a.GetTimeoutSeconds() > 0 {
		timeout = uint32(a.GetTimeoutSeconds())
	}
	internalLocal := s.GetInternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	externalLocal := s.GetExternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	if hc := s.GetHealthCheckNodePort(); hc > 0 {
		plan.entries[setHealthCheck] = append(plan.entries[setHealthCheck], fmt.Sprint(hc))
	}

	bound := map[netip.Addr]bool{}
	bind := func(a netip.Addr) {
		// An address the node already has is local without us; binding it
		// to the dummy link too would take it away from its interface
		// when the Service goes.
		if !bound[a] && !slices.Contains(p.nodeAddrs, a) {
			bound[a] = true
			plan.binds = append(plan.binds, a)
		}
	}
	bind(clusterIP)
	for _, a := range externalIPs {
		bind(a)
	}
	for _, a := range lbIPs {
		bind(a)
	}

	clusterEps := endpointsByPort(s.GetClusterEndpoints(), fam)
	localEps := endpointsByPort(s.GetLocalEndpoints(), fam)
	seen := map[vsKey]bool{}
	for _, sp := range s.GetPorts() {
		proto, ok := protocolOf(sp.GetProtocol())
		if !ok {
			continue
		}
		name := plan.key
		if sp.GetName() != "" {
			name += ":" + sp.GetName()
		}
		port, nodePort := uint16(sp.GetPort()), uint16(sp.GetNodePort())

		// Upstream's UsesClusterEndpoints and UsesLocalEndpoints, with
		// external reachability judged on this family's addresses.
		external := nodePort != 0 || len(externalIPs) > 0 || len(lbIPs) > 0
		usesCluster := !internalLocal || external
		usesLocal := internalLocal || (externalLocal && external)
		var cluster, local []netip.AddrPort
		if usesCluster {
			cluster = clusterEps[sp.GetName()]
		}
		if usesLocal {
			local = localEps[sp.GetName()]
		}
		// has_endpoints covers both families; when the Cluster set is in
		// use it is the whole picture for this family, so an empty set
		// means no endpoint of this family (as the iptables dataplane).
		hasEndpoints := sp.GetHasEndpoints() || len(local) > 0
		if usesCluster && len(cluster) == 0 {
			hasEndpoints = false
		}

		// One virtual server has one set of real servers. ClusterIP
		// traffic uses the internal policy's; every external address the
		// external policy's, except that with eTP Local and no local
		// endpoint it keeps the cluster's (kube-proxy's choice,
		// kubernetes#97081): pods and the node itself still reach the
		// Service through its external addresses, and setDropExternal
		// drops everyone else before IPVS sees them.
		internalDests, externalDests := cluster, cluster
		if internalLocal {
			internalDests = local
		}
		if externalLocal && len(local) > 0 {
			externalDests = local
		}
		internalDrop := hasEndpoints && internalLocal && len(local) == 0
		externalDrop := hasEndpoints && externalLocal && len(local) == 0
		externalSet := setExternal
		if externalLocal {
			externalSet = setExternalLocal
		}

		add := func(a netip.Addr, port uint16, dests []netip.AddrPort) string {
			k := vsKey{a, proto, port}
			if seen[k] {
				return "" // an external IP equal to a load balancer IP
			}
			seen[k] = true
			vs := VirtualServer{Addr: a, Protocol: proto, Port: port, Scheduler: p.scheduler}
			if timeout > 0 {
				vs.Persistent, vs.Timeout = true, timeout
			}
			plan.vss = append(plan.vss, &vsPlan{vs: vs, dests: dests, name: name, key: plan.key})
			return ipPortEntry(a, proto, port)
		}
		if e := add(clusterIP, port, internalDests); e != "" {
			plan.entries[setClusterIP] = append(plan.entries[setClusterIP], e)
			if internalDrop {
				plan.entries[setDropInternal] = append(plan.entries[setDropInternal], e)
			}
		}
		addExternal := func(a netip.Addr, port uint16) string {
			e := add(a, port, externalDests)
			if e != "" {
				plan.entries[externalSet] = append(plan.entries[externalSet], e)
				if externalDrop {
					plan.entries[setDropExternal] = append(plan.entries[setDropExternal], e)
				}
			}
			return e
		}
		for _, a := range externalIPs {
			addExternal(a, port)
		}
		for _, a := range lbIPs {
			e := addExternal(a, port)
			if e == "" || !firewall {
				continue
			}
			// loadBalancerSourceRanges apply to the load balancer IPs
			// only: NodePorts ignore them, as upstream (a load balancer
			// may deliver to them).
			plan.entries[setFirewall] = append(plan.entries[setFirewall], e)
			for _, r := range sourceRanges {
				plan.entries[setSourceRanges] = append(plan.entries[setSourceRanges], e+","+netString(r))
			}
			if allowFromNode {
				// A VIP-style load balancer IP is local to the node, and
				// the node's own requests to it may come from it.
				plan.entries[setSourceRanges] = append(plan.entries[setSourceRanges], e+","+a.String())
			}
		}
		if nodePort != 0 {
			for _, a := range p.nodePortAddrs {
				addExternal(a, nodePort)
			}
		}
		// Hairpin: any endpoint can reach itself through the Service;
		// after IPVS's DNAT its packet has source = destination.
		for _, ep := range slices.Concat(cluster, local) {
			plan.entries[setLoopBack] = append(plan.entries[setLoopBack],
				ep.Addr().String()+","+proto.lower()+":"+fmt.Sprint(ep.Port())+","+ep.Addr().String())
		}
	}
	for _, a := range plan.binds {
		plan.entries[setServiceIPs] = append(plan.entries[setServiceIPs], a.String())
	}
	return plan, true
}

func protocolOf(p pb.Protocol) (Protocol, bool) {
	switch p {
	case pb.Protocol_PROTOCOL_TCP:
		return TCP, true
	case pb.Protocol_PROTOCOL_UDP:
		return UDP, true
	case pb.Protocol_PROTOCOL_SCTP:
		return SCTP, true
	}
	return 0, false
}

func familyAddrs(in []string, family Family) []netip.Addr {
	var out []netip.Addr
	for _, s := range in {
		if a, err := netip.ParseAddr(s); err == nil && family.has(a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// endpointsByPort returns each port's endpoints of the family, sorted and
// unique (IPVS has one real server per address and port).
func endpointsByPort(in []*pb.PortEndpoints, family Family) map[string][]netip.AddrPort {
	out := make(map[string][]netip.AddrPort, len(in))
	for _, pe := range in {
		var eps []netip.AddrPort
		for _, ep := range pe.GetEndpoints() {
			a, err := netip.ParseAddr(ep.GetIp())
			if err != nil || !family.has(a.Unmap()) || ep.GetPort() <= 0 || ep.GetPort() > 65535 {
				continue
			}
			eps = append(eps, netip.AddrPortFrom(a.Unmap(), uint16(ep.GetPort())))
		}
		slices.SortFunc(eps, netip.AddrPort.Compare)
		out[pe.GetPortName()] = slices.Compact(eps)
	}
	return out
}

// desired is the whole wanted kernel state of one family: the union of
// every Service's plan.
type desired struct {
	vss   map[vsKey]*vsPlan
	addrs map[netip.Addr]struct{}
	sets  [numSets]members
}

// aggregate joins plans, visiting keys in order so that when two Services
// want the same virtual server (an invalid table: two Services on one
// external IP and port) the first key wins on every node and every sync.
func aggregate(plans map[string]*svcPlan) *desired {
	d := &desired{vss: map[vsKey]*vsPlan{}, addrs: map[netip.Addr]struct{}{}}
	for id := range numSets {
		d.sets[id] = members{}
	}
	for _, k := range sortedKeys(plans) {
		p := plans[k]
		for _, v := range p.vss {
			if _, ok := d.vss[v.vs.key()]; !ok {
				d.vss[v.vs.key()] = v
			}
		}
		for _, a := range p.binds {
			d.addrs[a] = struct{}{}
		}
		for id := range numSets {
			for _, e := range p.entries[id] {
				d.sets[id][e] = struct{}{}
			}
		}
	}
	return d
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// planAll plans every Service of t.
func planAll(t *proxytable.Table, p *params) map[string]*svcPlan {
	out := make(map[string]*svcPlan, len(t.Entries))
	for k, e := range t.Entries {
		if plan, ok := planService(e, p); ok {
			out[k] = plan
		}
	}
	return out
}
