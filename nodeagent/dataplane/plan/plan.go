// Package plan holds what every dataplane derives alike from the proxy
// table for one IP family: per Service, the decisions
// kube-proxy's syncProxyRules makes for each port (which endpoint sets are
// in use, whether any endpoint exists, REJECT or DROP, whether external
// traffic and a firewall need handling). How the decisions become rules,
// chains or virtual servers is each dataplane's own.
//
// It is pure: no I/O, no goroutines.
package plan

import (
	"net/netip"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// Service is one Service as one family's dataplane sees it: addresses of
// the family only, and every per-port decision made.
type Service struct {
	// Key is the Service's table key, "ns/name".
	Key       string
	ClusterIP netip.Addr
	// ExternalIPs and LoadBalancerIPs are the Service's of the family.
	ExternalIPs, LoadBalancerIPs []netip.Addr
	// SourceRanges are the loadBalancerSourceRanges of the family.
	SourceRanges []netip.Prefix
	// Firewall is set when the Service has loadBalancerSourceRanges at
	// all. A Service whose ranges are all of the other family gets a
	// firewall that lets nothing of this family in: failing closed, where
	// kube-proxy would leave the load balancer open.
	Firewall bool
	// AffinityTimeout is the ClientIP affinity timeout in seconds; 0 for
	// no affinity.
	AffinityTimeout int32
	// InternalLocal and ExternalLocal are the traffic policies: iTP and
	// eTP Local.
	InternalLocal, ExternalLocal bool
	// HealthCheckNodePort is eTP Local's health check port; 0 for none.
	HealthCheckNodePort int32
	Ports               []Port
}

// Port is one service port's decisions, named as in kube-proxy's
// syncProxyRules so that the two can be compared.
type Port struct {
	// Name is kube-proxy's ServicePortName: "ns/name" with ":port"
	// appended for a named port.
	Name string
	// PortName is the port's own name, "" for an unnamed port.
	PortName       string
	Protocol       pb.Protocol
	Port, NodePort int32 // NodePort 0 when none
	// External is set when traffic can reach the port from outside: a
	// NodePort, or an external or load balancer IP of the family.
	External bool
	// UsesClusterEndpoints and UsesLocalEndpoints say which endpoint sets
	// the port uses, as upstream's functions of those names: the Cluster
	// set unless the only traffic is iTP Local, the Local set when a
	// policy that applies is Local.
	UsesClusterEndpoints, UsesLocalEndpoints bool
	// Cluster and Local are the endpoints of the family in the sets in
	// use, in table order; empty for a set not in use.
	Cluster, Local []Endpoint
	// HasEndpoints is set when usable endpoints of the family exist
	// anywhere: REJECT when it is not.
	HasEndpoints bool
	// HasInternalEndpoints and HasExternalEndpoints say whether the
	// internal (ClusterIP) and external traffic policies have endpoints
	// to go to: DROP when HasEndpoints is set and they are not.
	HasInternalEndpoints, HasExternalEndpoints bool
	// UsesExternal is set when external traffic needs handling (kube-proxy's
	// EXT chain): it depends on HasEndpoints, not HasExternalEndpoints, as
	// with eTP Local and no local endpoint pod and node traffic still
	// short-circuits to the cluster endpoints.
	UsesExternal bool
	// UsesFirewall is set when load balancer traffic must pass the source
	// ranges (kube-proxy's FW chain).
	UsesFirewall bool
}

// Endpoint is one endpoint of the family.
type Endpoint struct {
	Addr netip.Addr // unmapped
	Port int32      // as the table holds it
}

// Of plans e for family; ok is false when the Service has no cluster IP
// of the family and so nothing to program (kube-proxy's per-family
// proxier never sees such a Service).
func Of(e *pb.ServiceEntry, family dataplane.Family) (s *Service, ok bool) {
	svc := e.GetService()
	clusterIPs := family.Addrs(svc.GetClusterIps())
	if len(clusterIPs) == 0 {
		return nil, false
	}
	s = &Service{
		Key:                 e.GetKey(),
		ClusterIP:           clusterIPs[0],
		ExternalIPs:         family.Addrs(svc.GetExternalIps()),
		LoadBalancerIPs:     family.Addrs(svc.GetLoadBalancerIps()),
		SourceRanges:        family.Prefixes(svc.GetLoadBalancerSourceRanges()),
		Firewall:            len(svc.GetLoadBalancerSourceRanges()) > 0,
		InternalLocal:       svc.GetInternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		ExternalLocal:       svc.GetExternalTrafficPolicy() == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		HealthCheckNodePort: svc.GetHealthCheckNodePort(),
	}
	if a := svc.GetSessionAffinity(); a != nil && a.GetTimeoutSeconds() > 0 {
		s.AffinityTimeout = a.GetTimeoutSeconds()
	}
	cluster := endpointsByPort(svc.GetClusterEndpoints(), family)
	local := endpointsByPort(svc.GetLocalEndpoints(), family)
	s.Ports = make([]Port, 0, len(svc.GetPorts()))
	for _, sp := range svc.GetPorts() {
		s.Ports = append(s.Ports, s.port(sp, cluster[sp.GetName()], local[sp.GetName()]))
	}
	return s, true
}

func (s *Service) port(sp *pb.ServicePort, cluster, local []Endpoint) Port {
	p := Port{
		Name:     ServicePortName(s.Key, sp.GetName()),
		PortName: sp.GetName(),
		Protocol: sp.GetProtocol(),
		Port:     sp.GetPort(),
		NodePort: sp.GetNodePort(),
		// External reachability is judged on this family's addresses.
		External: sp.GetNodePort() != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0,
	}
	p.UsesClusterEndpoints = !s.InternalLocal || p.External
	p.UsesLocalEndpoints = s.InternalLocal || (s.ExternalLocal && p.External)
	if p.UsesClusterEndpoints {
		p.Cluster = cluster
	}
	if p.UsesLocalEndpoints {
		p.Local = local
	}
	// has_endpoints covers both families; when the Cluster set is in use
	// it is the whole picture for this family (the control plane falls
	// back to terminating endpoints and to no topology before leaving it
	// empty), so an empty set here means no endpoint of this family.
	p.HasEndpoints = sp.GetHasEndpoints() || len(p.Local) > 0
	if p.UsesClusterEndpoints && len(p.Cluster) == 0 {
		p.HasEndpoints = false
	}
	p.HasInternalEndpoints, p.HasExternalEndpoints = p.HasEndpoints, p.HasEndpoints
	if s.InternalLocal {
		p.HasInternalEndpoints = len(p.Local) > 0
	}
	if s.ExternalLocal {
		p.HasExternalEndpoints = len(p.Local) > 0
	}
	p.UsesExternal = p.HasEndpoints && p.External
	p.UsesFirewall = p.HasEndpoints && len(s.LoadBalancerIPs) > 0 && s.Firewall
	return p
}

func endpointsByPort(in []*pb.PortEndpoints, family dataplane.Family) map[string][]Endpoint {
	out := make(map[string][]Endpoint, len(in))
	for _, pe := range in {
		var eps []Endpoint
		for _, ep := range pe.GetEndpoints() {
			if a, err := netip.ParseAddr(ep.GetIp()); err == nil && family.Has(a.Unmap()) {
				eps = append(eps, Endpoint{Addr: a.Unmap(), Port: ep.GetPort()})
			}
		}
		out[pe.GetPortName()] = eps
	}
	return out
}

// ServicePortName is kube-proxy's ServicePortName.String(): "ns/name" with
// ":port" appended for a named port.
func ServicePortName(key, port string) string {
	if port == "" {
		return key
	}
	return key + ":" + port
}

// PolicyTargets returns where a port's internal and external traffic go,
// given where the Cluster and the Local traffic policies send it: local
// for a policy that is Local (kube-proxy's internal and external policy
// chains).
func PolicyTargets[T any](s *Service, cluster, local T) (internal, external T) {
	internal, external = cluster, cluster
	if s.InternalLocal {
		internal = local
	}
	if s.ExternalLocal {
		external = local
	}
	return internal, external
}

// MapEndpoints returns f of each endpoint of p's Cluster and Local sets,
// in order, and f of every distinct endpoint once (the Cluster set's,
// then the Local set's not already in it): a dataplane writes one
// per-endpoint object for an endpoint both sets hold. f is called once
// per distinct endpoint.
func MapEndpoints[E any](p *Port, f func(Endpoint) E) (cluster, local, all []E) {
	done := make(map[Endpoint]E, len(p.Cluster)+len(p.Local))
	mapped := func(eps []Endpoint) []E {
		out := make([]E, 0, len(eps))
		for _, ep := range eps {
			e, ok := done[ep]
			if !ok {
				e = f(ep)
				done[ep] = e
				all = append(all, e)
			}
			out = append(out, e)
		}
		return out
	}
	cluster = mapped(p.Cluster)
	local = mapped(p.Local)
	return cluster, local, all
}
