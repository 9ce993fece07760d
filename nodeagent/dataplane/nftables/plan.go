package nftables

import (
	"net/netip"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// svcPlan is one Service as one family's rules need it: addresses of the
// family only, and every per-port decision made (which chains exist, where
// traffic goes, REJECT or DROP). The decisions are kube-proxy's
// (syncProxyRules in both its iptables and nftables modes) and the
// iptables dataplane's, re-derived here because that package keeps them
// unexported; build.go turns them into nf_tables objects.
type svcPlan struct {
	key          string
	clusterIP    netip.Addr
	externalIPs  []netip.Addr
	lbIPs        []netip.Addr
	sourceRanges []netip.Prefix // of the family
	// firewall is set when the Service has loadBalancerSourceRanges at
	// all. A Service whose ranges are all of the other family gets a
	// firewall that lets nothing of this family in: failing closed, where
	// kube-proxy would leave the load balancer open.
	firewall      bool
	affinity      int32 // timeout in seconds; 0 for no affinity
	internalLocal bool
	externalLocal bool
	ports         []portPlan
}

// portPlan is one service port's decisions, named as in kube-proxy's
// syncProxyRules so that the two can be compared.
type portPlan struct {
	name     string // service port name, for comments
	proto    uint8  // IPPROTO_TCP, _UDP or _SCTP
	port     uint16
	nodePort uint16 // 0 when none

	svcChain, svlChain, extChain, fwChain string

	clusterEps, localEps []epPlan
	allEps               []epPlan // every endpoint with a chain

	hasEndpoints         bool // usable endpoints of the family anywhere
	hasInternalEndpoints bool
	hasExternalEndpoints bool
	usesClusterChain     bool
	usesLocalChain       bool
	usesExternalChain    bool
	usesFWChain          bool
	internalChain        string
	externalPolicyChain  string
}

// epPlan is one endpoint, its chain and (with affinity) its set.
type epPlan struct {
	chain, affinitySet string
	addr               netip.Addr
	port               uint16
}

// Protocol numbers as nf_tables compares them (meta l4proto).
const (
	protoTCP  = 6
	protoUDP  = 17
	protoSCTP = 132
)

func protoNumber(p pb.Protocol) uint8 {
	switch p {
	case pb.Protocol_PROTOCOL_UDP:
		return protoUDP
	case pb.Protocol_PROTOCOL_SCTP:
		return protoSCTP
	}
	return protoTCP
}

func protoName(p uint8) string {
	switch p {
	case protoUDP:
		return "udp"
	case protoSCTP:
		return "sctp"
	}
	return "tcp"
}

// planService plans e for family; ok is false when the Service has no
// cluster IP of the family and so nothing to program (kube-proxy's
// per-family proxier never sees such a Service).
func planService(e *pb.ServiceEntry, family Family) (plan *svcPlan, ok bool) {
	s := e.GetService()
	p := &svcPlan{key: e.GetKey()}
	for _, ip := range s.GetClusterIps() {
		if a, err := netip.ParseAddr(ip); err == nil && family.has(a.Unmap()) {
			p.clusterIP = a.Unmap()
			break
		}
	}
	if !p.clusterIP.IsValid() {
		return nil, false
	}
	p.externalIPs = familyAddrs(s.GetExternalIps(), family)
	p.lbIPs = familyAddrs(s.GetLoadBalancerIps(), family)
	for _, r := range s.GetLoadBalancerSourceRanges() {
		p.firewall = true
		if pr, err := netip.ParsePrefix(r); err == nil && family.has(pr.Addr()) {
			p.sourceRanges = append(p.sourceRanges, pr.Masked())
		}
	}
	if a := s.GetSessionAffinity(); a != nil && a.GetTimeoutSeconds() > 0 {
		p.affinity = a.GetTimeoutSeconds()
	}
	p.internalLocal = s.GetInternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	p.externalLocal = s.GetExternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL

	clusterEps := endpointsByPort(s.GetClusterEndpoints(), family)
	localEps := endpointsByPort(s.GetLocalEndpoints(), family)
	p.ports = make([]portPlan, 0, len(s.GetPorts()))
	for _, sp := range s.GetPorts() {
		p.ports = append(p.ports, p.planPort(sp, clusterEps[sp.GetName()], localEps[sp.GetName()]))
	}
	return p, true
}

func (p *svcPlan) planPort(sp *pb.ServicePort, cluster, local []*pb.Endpoint) portPlan {
	pp := portPlan{
		name:     servicePortName(p.key, sp.GetName()),
		proto:    protoNumber(sp.GetProtocol()),
		port:     uint16(sp.GetPort()),
		nodePort: uint16(sp.GetNodePort()),
	}
	proto := protoName(pp.proto)
	base := portNameBase(p.key, proto, sp.GetName())
	pp.svcChain, pp.svlChain = prefixClusterPolicyChain+base, prefixLocalPolicyChain+base
	pp.extChain, pp.fwChain = prefixExternalChain+base, prefixFirewallChain+base

	// Upstream's UsesClusterEndpoints and UsesLocalEndpoints, with
	// external reachability judged on this family's addresses.
	external := pp.nodePort != 0 || len(p.externalIPs) > 0 || len(p.lbIPs) > 0
	usesCluster := !p.internalLocal || external
	usesLocal := p.internalLocal || (p.externalLocal && external)

	seen := map[string]bool{}
	mk := func(eps []*pb.Endpoint) []epPlan {
		out := make([]epPlan, 0, len(eps))
		for _, ep := range eps {
			addr := netip.MustParseAddr(ep.GetIp()).Unmap() // parsed by endpointsByPort
			e := epPlan{
				chain: prefixEndpointChain + endpointNameBase(p.key, proto, sp.GetName(), addr.String(), ep.GetPort()),
				addr:  addr, port: uint16(ep.GetPort()),
			}
			if p.affinity > 0 {
				e.affinitySet = prefixAffinitySet + affinityNameBase(p.key, proto, sp.GetName(), addr.String(), ep.GetPort(), p.affinity)
			}
			out = append(out, e)
			if !seen[e.chain] {
				seen[e.chain] = true
				pp.allEps = append(pp.allEps, e)
			}
		}
		return out
	}
	if usesCluster {
		pp.clusterEps = mk(cluster)
	}
	if usesLocal {
		pp.localEps = mk(local)
	}

	// has_endpoints covers both families; when the Cluster set is in use
	// it is the whole picture for this family (the control plane falls
	// back to terminating endpoints and to no topology before leaving it
	// empty), so an empty set here means no endpoint of this family.
	pp.hasEndpoints = sp.GetHasEndpoints() || len(pp.localEps) > 0
	if usesCluster && len(pp.clusterEps) == 0 {
		pp.hasEndpoints = false
	}
	pp.usesClusterChain = usesCluster && len(pp.clusterEps) > 0
	pp.usesLocalChain = usesLocal && len(pp.localEps) > 0

	pp.internalChain, pp.hasInternalEndpoints = pp.svcChain, pp.hasEndpoints
	if p.internalLocal {
		pp.internalChain, pp.hasInternalEndpoints = pp.svlChain, len(pp.localEps) > 0
	}
	pp.externalPolicyChain, pp.hasExternalEndpoints = pp.svcChain, pp.hasEndpoints
	if p.externalLocal {
		pp.externalPolicyChain, pp.hasExternalEndpoints = pp.svlChain, len(pp.localEps) > 0
	}
	// The external chain depends on hasEndpoints, not hasExternalEndpoints:
	// with eTP Local and no local endpoint it still short-circuits pod and
	// node traffic to the cluster endpoints.
	pp.usesExternalChain = pp.hasEndpoints && external
	pp.usesFWChain = pp.hasEndpoints && len(p.lbIPs) > 0 && p.firewall
	return pp
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

func endpointsByPort(in []*pb.PortEndpoints, family Family) map[string][]*pb.Endpoint {
	out := make(map[string][]*pb.Endpoint, len(in))
	for _, pe := range in {
		var eps []*pb.Endpoint
		for _, ep := range pe.GetEndpoints() {
			if a, err := netip.ParseAddr(ep.GetIp()); err == nil && family.has(a.Unmap()) {
				eps = append(eps, ep)
			}
		}
		out[pe.GetPortName()] = eps
	}
	return out
}

// servicePortName is kube-proxy's ServicePortName.String(): "ns/name" with
// ":port" appended for a named port.
func servicePortName(key, port string) string {
	if port == "" {
		return key
	}
	return key + ":" + port
}
