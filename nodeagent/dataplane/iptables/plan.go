package iptables

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

// svcPlan is one Service as one family's rules need it: plan.Service's
// addresses and per-port decisions, with their rule text and the chains
// they need (which chains exist, where traffic goes, REJECT or DROP).
// Planning is separate from writing so that both the dispatch rules
// (always written) and the per-service chains (written only when the
// Service changed) come from the same decisions.
type svcPlan struct {
	*plan.Service
	// The addresses as rule text.
	clusterIP                        string
	externalIPs, lbIPs, sourceRanges []string
	affinity                         string // timeout in seconds; "" for no affinity
	ports                            []portPlan
}

// portPlan is one service port's decisions (plan.Port, named as in
// kube-proxy's syncProxyRules so that the two can be compared) with the
// chains they need.
type portPlan struct {
	plan.Port
	proto    string // "tcp", "udp" or "sctp"
	port     string // Port as rule text
	nodePort string // NodePort as rule text, "" when none

	svcChain, svlChain, extChain, fwChain string

	clusterEps, localEps []epPlan // PP-SVC and PP-SVL exist when not empty
	allEps               []epPlan // every endpoint with a PP-SEP chain

	// internalChain and externalPolicyChain are PP-SVC or PP-SVL, as the
	// internal and external traffic policies are Cluster or Local.
	internalChain, externalPolicyChain string
}

// epPlan is one endpoint and its chain.
type epPlan struct {
	chain  string
	ip     string
	ipPort string // "ip:port" or "[ip]:port", the DNAT target
}

// planService plans e for family; ok is false when the Service has no
// cluster IP of the family and so nothing to program. The decisions are
// plan.Of's; this adds the chains they need.
func planService(e *pb.ServiceEntry, family dataplane.Family) (p *svcPlan, ok bool) {
	s, ok := plan.Of(e, family)
	if !ok {
		return nil, false
	}
	p = &svcPlan{
		Service:      s,
		clusterIP:    s.ClusterIP.String(),
		externalIPs:  strs(s.ExternalIPs),
		lbIPs:        strs(s.LoadBalancerIPs),
		sourceRanges: strs(s.SourceRanges),
		ports:        make([]portPlan, 0, len(s.Ports)),
	}
	if s.AffinityTimeout > 0 {
		p.affinity = strconv.Itoa(int(s.AffinityTimeout))
	}
	for i := range s.Ports {
		p.ports = append(p.ports, p.planPort(&s.Ports[i]))
	}
	return p, true
}

func (p *svcPlan) planPort(sp *plan.Port) portPlan {
	pp := portPlan{Port: *sp, proto: protoName(sp.Protocol), port: strconv.Itoa(int(sp.Port))}
	// The name goes only into comments and chain hashes: escaped, it can
	// never break out of either (commentText).
	pp.Name = commentText(sp.Name)
	if sp.NodePort != 0 {
		pp.nodePort = strconv.Itoa(int(sp.NodePort))
	}
	h := portHash(pp.Name, pp.proto)
	pp.svcChain, pp.svlChain, pp.extChain, pp.fwChain = prefixSvc+h, prefixSvl+h, prefixExt+h, prefixFw+h
	pp.internalChain, pp.externalPolicyChain = plan.PolicyTargets(p.Service, pp.svcChain, pp.svlChain)
	pp.clusterEps, pp.localEps, pp.allEps = plan.MapEndpoints(sp, func(ep plan.Endpoint) epPlan {
		ip := ep.Addr.String()
		ipPort := net.JoinHostPort(ip, strconv.Itoa(int(ep.Port)))
		return epPlan{chain: chainName(prefixSep, pp.Name, pp.proto, ipPort), ip: ip, ipPort: ipPort}
	})
	return pp
}

// strs returns the values' text forms.
func strs[T fmt.Stringer](in []T) []string {
	var out []string
	for _, v := range in {
		out = append(out, v.String())
	}
	return out
}

func protoName(p pb.Protocol) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "PROTOCOL_"))
}
