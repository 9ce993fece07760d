package iptables

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

// svcPlan is one Service as one family's rules need it: plan.Service's
// addresses and per-port decisions, with the chains they need (which
// chains exist, where traffic goes, REJECT or DROP). Planning is separate
// from writing so that both the dispatch rules (always written) and the
// per-service chains (written only when the Service changed) come from the
// same decisions.
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
func planService(e *pb.ServiceEntry, family Family) (p *svcPlan, ok bool) {
	s, ok := plan.Of(e, plan.Family(family))
	if !ok {
		return nil, false
	}
	p = &svcPlan{
		key:           s.Key,
		clusterIP:     s.ClusterIP.String(),
		externalIPs:   strs(s.ExternalIPs),
		lbIPs:         strs(s.LoadBalancerIPs),
		sourceRanges:  strs(s.SourceRanges),
		firewall:      s.Firewall,
		internalLocal: s.InternalLocal,
		externalLocal: s.ExternalLocal,
		hcNodePort:    s.HealthCheckNodePort,
		ports:         make([]portPlan, 0, len(s.Ports)),
	}
	if s.AffinityTimeout > 0 {
		p.affinity = strconv.Itoa(int(s.AffinityTimeout))
	}
	for _, sp := range s.Ports {
		p.ports = append(p.ports, p.planPort(&sp))
	}
	return p, true
}

func (p *svcPlan) planPort(sp *plan.Port) portPlan {
	pp := portPlan{Port: *sp, proto: protoName(sp.Protocol), port: strconv.Itoa(int(sp.Port))}
	if sp.NodePort != 0 {
		pp.nodePort = strconv.Itoa(int(sp.NodePort))
	}
	h := portHash(pp.Name, pp.proto)
	pp.svcChain, pp.svlChain, pp.extChain, pp.fwChain = prefixSvc+h, prefixSvl+h, prefixExt+h, prefixFw+h
	pp.internalChain, pp.externalPolicyChain = pp.svcChain, pp.svcChain
	if p.internalLocal {
		pp.internalChain = pp.svlChain
	}
	if p.externalLocal {
		pp.externalPolicyChain = pp.svlChain
	}

	seen := map[string]bool{}
	mk := func(eps []plan.Endpoint) []epPlan {
		out := make([]epPlan, 0, len(eps))
		for _, ep := range eps {
			ip := ep.Addr.String()
			ipPort := net.JoinHostPort(ip, strconv.Itoa(int(ep.Port)))
			e := epPlan{chain: prefixSep + portHash(pp.Name, pp.proto, ipPort), ip: ip, ipPort: ipPort}
			out = append(out, e)
			if !seen[e.chain] {
				seen[e.chain] = true
				pp.allEps = append(pp.allEps, e)
			}
		}
		return out
	}
	pp.clusterEps, pp.localEps = mk(sp.Cluster), mk(sp.Local)
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
