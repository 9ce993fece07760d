package ipvs

import (
	"fmt"
	"net/netip"
	"slices"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// params is everything planning needs besides the table, resolved from
// Config, the table's NodeInfo and the node's addresses at each sync.
type params struct {
	family    dataplane.Family
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
	family        dataplane.Family
	mark          string // the masquerade bit as a mark value, "0x004000"
	masqueradeAll bool
	// localCIDR is the pod CIDR of the family; "" when pod traffic cannot
	// be recognised (LocalNone, or NodeCIDR without a pod CIDR).
	localCIDR   string
	randomFully bool
}

func newParams(c *Config, node *pb.NodeInfo, nodeAddrs []netip.Addr) *params {
	set := &c.Settings
	p := &params{
		family:    c.Family,
		scheduler: c.Scheduler,
		nodeIPs:   set.PrimaryIPs(node),
		rules: ruleParams{
			family:        c.Family,
			mark:          fmt.Sprintf("%#08x", uint32(1)<<uint(c.MasqueradeBit)),
			masqueradeAll: c.MasqueradeAll,
			randomFully:   !c.NoRandomFully,
		},
	}
	for _, a := range nodeAddrs {
		if c.Family.Has(a) {
			p.nodeAddrs = append(p.nodeAddrs, a)
		}
	}
	slices.SortFunc(p.nodeAddrs, netip.Addr.Compare)
	p.nodeAddrs = slices.Compact(p.nodeAddrs)
	all, cidrs := set.NodePorts(p.nodeIPs)
	for _, a := range p.nodeAddrs {
		if all || slices.ContainsFunc(cidrs, func(pr netip.Prefix) bool { return pr.Contains(a) }) {
			p.nodePortAddrs = append(p.nodePortAddrs, a)
		}
	}
	if cidr := set.LocalCIDR(node); cidr.IsValid() {
		p.rules.localCIDR = cidr.String()
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
// cluster IP of the family and so nothing to program. The decisions are
// plan.Of's; this turns them into virtual servers, bound addresses and
// set members.
func planService(e *pb.ServiceEntry, p *params) (out *svcPlan, ok bool) {
	s, ok := plan.Of(e, p.family)
	if !ok {
		return nil, false
	}
	out = &svcPlan{key: s.Key}
	allowFromNode := slices.ContainsFunc(s.SourceRanges, func(pr netip.Prefix) bool {
		return slices.ContainsFunc(p.nodeIPs, pr.Contains)
	})
	if hc := s.HealthCheckNodePort; hc > 0 {
		out.entries[setHealthCheck] = append(out.entries[setHealthCheck], fmt.Sprint(hc))
	}

	bound := map[netip.Addr]bool{}
	bind := func(a netip.Addr) {
		// An address the node already has is local without us; binding it
		// to the dummy link too would take it away from its interface
		// when the Service goes.
		if !bound[a] && !slices.Contains(p.nodeAddrs, a) {
			bound[a] = true
			out.binds = append(out.binds, a)
		}
	}
	bind(s.ClusterIP)
	for _, a := range s.ExternalIPs {
		bind(a)
	}
	for _, a := range s.LoadBalancerIPs {
		bind(a)
	}

	seen := map[vsKey]bool{}
	for _, sp := range s.Ports {
		proto, ok := protocolOf(sp.Protocol)
		if !ok {
			continue
		}
		port, nodePort := uint16(sp.Port), uint16(sp.NodePort)
		cluster, local := addrPorts(sp.Cluster), addrPorts(sp.Local)

		// One virtual server has one set of real servers. ClusterIP
		// traffic uses the internal policy's; every external address the
		// external policy's, except that with eTP Local and no local
		// endpoint it keeps the cluster's (kube-proxy's choice,
		// kubernetes#97081): pods and the node itself still reach the
		// Service through its external addresses, and setDropExternal
		// drops everyone else before IPVS sees them.
		internalDests, externalDests := cluster, cluster
		if s.InternalLocal {
			internalDests = local
		}
		if s.ExternalLocal && len(local) > 0 {
			externalDests = local
		}
		internalDrop := sp.HasEndpoints && !sp.HasInternalEndpoints
		externalDrop := sp.HasEndpoints && !sp.HasExternalEndpoints
		externalSet := setExternal
		if s.ExternalLocal {
			externalSet = setExternalLocal
		}

		add := func(a netip.Addr, port uint16, dests []netip.AddrPort) string {
			k := vsKey{a, proto, port}
			if seen[k] {
				return "" // an external IP equal to a load balancer IP
			}
			seen[k] = true
			vs := VirtualServer{Addr: a, Protocol: proto, Port: port, Scheduler: p.scheduler}
			if s.AffinityTimeout > 0 {
				vs.Persistent, vs.Timeout = true, uint32(s.AffinityTimeout)
			}
			out.vss = append(out.vss, &vsPlan{vs: vs, dests: dests, name: sp.Name, key: out.key})
			return ipPortEntry(a, proto, port)
		}
		if e := add(s.ClusterIP, port, internalDests); e != "" {
			out.entries[setClusterIP] = append(out.entries[setClusterIP], e)
			if internalDrop {
				out.entries[setDropInternal] = append(out.entries[setDropInternal], e)
			}
		}
		addExternal := func(a netip.Addr, port uint16) string {
			e := add(a, port, externalDests)
			if e != "" {
				out.entries[externalSet] = append(out.entries[externalSet], e)
				if externalDrop {
					out.entries[setDropExternal] = append(out.entries[setDropExternal], e)
				}
			}
			return e
		}
		for _, a := range s.ExternalIPs {
			addExternal(a, port)
		}
		for _, a := range s.LoadBalancerIPs {
			e := addExternal(a, port)
			if e == "" || !s.Firewall {
				continue
			}
			// loadBalancerSourceRanges apply to the load balancer IPs
			// only: NodePorts ignore them, as upstream (a load balancer
			// may deliver to them).
			out.entries[setFirewall] = append(out.entries[setFirewall], e)
			for _, r := range s.SourceRanges {
				out.entries[setSourceRanges] = append(out.entries[setSourceRanges], e+","+netString(r))
			}
			if allowFromNode {
				// A VIP-style load balancer IP is local to the node, and
				// the node's own requests to it may come from it.
				out.entries[setSourceRanges] = append(out.entries[setSourceRanges], e+","+a.String())
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
			out.entries[setLoopBack] = append(out.entries[setLoopBack],
				ep.Addr().String()+","+proto.lower()+":"+fmt.Sprint(ep.Port())+","+ep.Addr().String())
		}
	}
	for _, a := range out.binds {
		out.entries[setServiceIPs] = append(out.entries[setServiceIPs], a.String())
	}
	return out, true
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

// addrPorts returns eps as real servers, sorted and unique (IPVS has one
// real server per address and port).
func addrPorts(eps []plan.Endpoint) []netip.AddrPort {
	var out []netip.AddrPort
	for _, ep := range eps {
		if ep.Port > 0 && ep.Port <= 65535 {
			out = append(out, netip.AddrPortFrom(ep.Addr, uint16(ep.Port)))
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
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
