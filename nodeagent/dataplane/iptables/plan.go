package iptables

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// svcPlan is one Service as one family's rules need it: addresses of the
// family only, and every per-port decision made (which chains exist, where
// traffic goes, REJECT or DROP). Planning is separate from writing so that
// both the dispatch rules (always written) and the per-service chains
// (written only when the Service changed) come from the same decisions.
type svcPlan struct {
	key          string
	clusterIP    string
	externalIPs  []string
	lbIPs        []string
	sourceRanges []string // of the family
	// firewall is set when the Service has loadBalancerSourceRanges at
	// all. A Service whose ranges are all of the other family gets a
	// firewall that lets nothing of this family in: failing closed, where
	// kube-proxy would leave the load balancer open.
	firewall      bool
	affinity      string // timeout in seconds; "" for no affinity
	internalLocal bool
	externalLocal bool
	hcNodePort    int32
	ports         []portPlan
}

// portPlan is one service port's decisions, named as in kube-proxy's
// syncProxyRules so that the two can be compared.
type portPlan struct {
	name     string // service port name "ns/name:port", for comments
	proto    string // "tcp", "udp" or "sctp"
	port     string
	nodePort string // "" when none

	svcChain, svlChain, extChain, fwChain string

	clusterEps, localEps []epPlan
	allEps               []epPlan // every endpoint with a PP-SEP chain

	hasEndpoints         bool // usable endpoints of the family anywhere
	hasInternalEndpoints bool
	hasExternalEndpoints bool
	usesClusterChain     bool // PP-SVC exists
	usesLocalChain       bool // PP-SVL exists
	usesExternalChain    bool // PP-EXT exists
	usesFWChain          bool // PP-FW exists
	internalChain        string
	externalPolicyChain  string
}

// epPlan is one endpoint and its chain.
type epPlan struct {
	chain  string
	ip     string
	ipPort string // "ip:port" or "[ip]:port", the DNAT target
}

// planService plans e for family; ok is false when the Service has no
// cluster IP of the family and so nothing to program (kube-proxy's
// per-family proxier never sees such a Service).
func planService(e *pb.ServiceEntry, family Family) (plan *svcPlan, ok bool) {
	s := e.GetService()
	p := &svcPlan{key: e.GetKey()}
	for _, ip := range s.GetClusterIps() {
		if a, err := netip.ParseAddr(ip); err == nil && family.has(a.Unmap()) {
			p.clusterIP = a.Unmap().String()
			break
		}
	}
	if p.clusterIP == "" {
		return nil, false
	}
	p.externalIPs = familyAddrs(s.GetExternalIps(), family)
	p.lbIPs = familyAddrs(s.GetLoadBalancerIps(), family)
	for _, r := range s.GetLoadBalancerSourceRanges() {
		p.firewall = true
		if pr, err := netip.ParsePrefix(r); err == nil && family.has(pr.Addr()) {
			p.sourceRanges = append(p.sourceRanges, pr.Masked().String())
		}
	}
	if a := s.GetSessionAffinity(); a != nil && a.GetTimeoutSeconds() > 0 {
		p.affinity = strconv.Itoa(int(a.GetTimeoutSeconds()))
	}
	p.internalLocal = s.GetInternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	p.externalLocal = s.GetExternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	p.hcNodePort = s.GetHealthCheckNodePort()

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
		name:  servicePortName(p.key, sp.GetName()),
		proto: protoName(sp.GetProtocol()),
		port:  strconv.Itoa(int(sp.GetPort())),
	}
	if sp.GetNodePort() != 0 {
		pp.nodePort = strconv.Itoa(int(sp.GetNodePort()))
	}
	h := portHash(pp.name, pp.proto)
	pp.svcChain, pp.svlChain, pp.extChain, pp.fwChain = prefixSvc+h, prefixSvl+h, prefixExt+h, prefixFw+h

	// Upstream's UsesClusterEndpoints and UsesLocalEndpoints, with
	// external reachability judged on this family's addresses.
	external := pp.nodePort != "" || len(p.externalIPs) > 0 || len(p.lbIPs) > 0
	usesCluster := !p.internalLocal || external
	usesLocal := p.internalLocal || (p.externalLocal && external)

	seen := map[string]bool{}
	mk := func(eps []*pb.Endpoint) []epPlan {
		out := make([]epPlan, 0, len(eps))
		for _, ep := range eps {
			ip := netip.MustParseAddr(ep.GetIp()).Unmap().String() // parsed by endpointsByPort
			ipPort := net.JoinHostPort(ip, strconv.Itoa(int(ep.GetPort())))
			e := epPlan{chain: prefixSep + portHash(pp.name, pp.proto, ipPort), ip: ip, ipPort: ipPort}
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
	// The EXT chain depends on hasEndpoints, not hasExternalEndpoints:
	// with eTP Local and no local endpoint it still short-circuits pod and
	// node traffic to the cluster endpoints.
	pp.usesExternalChain = pp.hasEndpoints && external
	pp.usesFWChain = pp.hasEndpoints && len(p.lbIPs) > 0 && p.firewall
	return pp
}

func familyAddrs(in []string, family Family) []string {
	var out []string
	for _, s := range in {
		if a, err := netip.ParseAddr(s); err == nil && family.has(a.Unmap()) {
			out = append(out, a.Unmap().String())
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

func protoName(p pb.Protocol) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "PROTOCOL_"))
}
