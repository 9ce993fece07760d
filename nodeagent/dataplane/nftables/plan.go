package nftables

import (
	"net/netip"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

// svcPlan is one Service as one family's rules need it: plan.Service's
// addresses and per-port decisions (kube-proxy's, in both its iptables and
// nftables modes), with the chains they need. build.go turns them into
// nf_tables objects.
type svcPlan struct {
	*plan.Service
	ports []portPlan // Ports, with their chains
}

// portPlan is one service port's decisions (plan.Port, named as in
// kube-proxy's syncProxyRules so that the two can be compared) with the
// chains they need.
type portPlan struct {
	plan.Port
	proto          uint8  // IPPROTO_TCP, _UDP or _SCTP
	port, nodePort uint16 // nodePort 0 when none

	svcChain, svlChain, extChain, fwChain string
	// svcMap and svlMap are the endpoint maps of the two policy chains
	// (without affinity).
	svcMap, svlMap string

	clusterEps, localEps []epPlan // the chains exist when not empty
	allEps               []epPlan // every endpoint

	// internalChain and externalPolicyChain are the cluster or local
	// policy chain, as the internal and external traffic policies are
	// Cluster or Local.
	internalChain, externalPolicyChain string
}

// epPlan is one endpoint and, with affinity, its chain and set.
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
// cluster IP of the family and so nothing to program. The decisions are
// plan.Of's; this adds the chains and sets they need.
func planService(e *pb.ServiceEntry, family dataplane.Family) (p *svcPlan, ok bool) {
	s, ok := plan.Of(e, family)
	if !ok {
		return nil, false
	}
	p = &svcPlan{Service: s, ports: make([]portPlan, 0, len(s.Ports))}
	for i := range s.Ports {
		p.ports = append(p.ports, p.planPort(&s.Ports[i]))
	}
	return p, true
}

func (p *svcPlan) planPort(sp *plan.Port) portPlan {
	pp := portPlan{Port: *sp, proto: protoNumber(sp.Protocol), port: uint16(sp.Port), nodePort: uint16(sp.NodePort)}
	proto := protoName(pp.proto)
	base := portNameBase(p.Key, proto, sp.PortName)
	pp.svcChain, pp.svlChain = prefixClusterPolicyChain+base, prefixLocalPolicyChain+base
	pp.extChain, pp.fwChain = prefixExternalChain+base, prefixFirewallChain+base
	pp.svcMap, pp.svlMap = prefixEndpointsMap+base, prefixLocalEndpointsMap+base
	pp.internalChain, pp.externalPolicyChain = plan.PolicyTargets(p.Service, pp.svcChain, pp.svlChain)
	pp.clusterEps, pp.localEps, pp.allEps = plan.MapEndpoints(sp, func(ep plan.Endpoint) epPlan {
		e := epPlan{addr: ep.Addr, port: uint16(ep.Port)}
		if p.AffinityTimeout > 0 {
			ip := ep.Addr.String()
			e.chain = prefixEndpointChain + endpointNameBase(p.Key, proto, sp.PortName, ip, ep.Port)
			e.affinitySet = prefixAffinitySet + affinityNameBase(p.Key, proto, sp.PortName, ip, ep.Port, p.AffinityTimeout)
		}
		return e
	})
	return pp
}
