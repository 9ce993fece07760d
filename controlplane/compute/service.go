package compute

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// LabelServiceProxyName marks a Service as handled by another proxy;
// kube-proxy, and so proxyplane, leaves such Services alone.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// defaultAffinityTimeout is Kubernetes' default for
// sessionAffinityConfig.clientIP.timeoutSeconds (3 hours).
const defaultAffinityTimeout = 10800

// ErrInvalidService reports a Service or EndpointSlice that cannot be
// programmed. The caller keeps the Service's last good state.
var ErrInvalidService = errors.New("invalid service")

// SkipReason says why kube-proxy would not proxy svc, or "" when it would.
// Skipped Services are absent from every table.
func SkipReason(svc *corev1.Service) string {
	switch {
	case hasLabel(svc, LabelServiceProxyName):
		// Any value, even empty, as the informers' DoesNotExist selector.
		return "labelled " + LabelServiceProxyName
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return "type ExternalName"
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return "headless"
	case svc.Spec.ClusterIP == "" && len(svc.Spec.ClusterIPs) == 0:
		return "no cluster IP"
	}
	return ""
}

func hasLabel(svc *corev1.Service, l string) bool { _, ok := svc.Labels[l]; return ok }

// Key returns the table key of a Service: "namespace/name".
func Key(namespace, name string) string { return namespace + "/" + name }

// endpoint is one backend of one service port, merged across slices.
type endpoint struct {
	addr                        netip.Addr
	port                        int32
	ready, serving, terminating bool
	nodeName                    string
	zoneHints, nodeHints        []string
}

func (e *endpoint) usableTerminating() bool { return e.serving && e.terminating }

func (e *endpoint) proto() *pb.Endpoint {
	return &pb.Endpoint{
		Ip: e.addr.String(), Port: e.port,
		Ready: e.ready, Serving: e.serving, Terminating: e.terminating,
	}
}

// servicePort is one port of a Service with its endpoints and with which
// traffic policies it uses (upstream's UsesClusterEndpoints and
// UsesLocalEndpoints).
type servicePort struct {
	name                   string
	usesCluster, usesLocal bool
	endpoints              []endpoint // sorted by address, then port
	allReadyHaveZoneHints  bool
	allReadyHaveNodeHints  bool
	hasEndpointsAnywhere   bool
}

// Build computes the table views of svc from its EndpointSlices. svc must
// not be skipped (see SkipReason). Invalid Service fields are an error
// wrapping ErrInvalidService; an endpoint with an unusable address is left
// out, as upstream does.
func Build(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) (*Service, error) {
	base, err := frontend(svc)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidService, Key(svc.Namespace, svc.Name), err)
	}
	externallyAccessible := len(base.ExternalIps) > 0 || len(base.LoadBalancerIps) > 0
	externalLocal := base.ExternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	internalLocal := base.InternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL

	sorted := sortedSlices(slices, base.ClusterIps)
	ports := make([]servicePort, len(base.Ports))
	for i, p := range base.Ports {
		portExternal := externallyAccessible || p.NodePort != 0
		sp := servicePort{
			name:        p.Name,
			usesCluster: !internalLocal || portExternal,
			usesLocal:   internalLocal || (externalLocal && portExternal),
			endpoints:   portEndpoints(sorted, p.Name, svc.Spec.Ports[i].Protocol),
		}
		sp.classify()
		p.HasEndpoints = sp.hasEndpointsAnywhere
		ports[i] = sp
	}

	s := &Service{
		Key:         Key(svc.Namespace, svc.Name),
		TriggerTime: triggerTime(sorted),
		base:        base,
		ports:       ports,
	}
	s.index()
	return s, nil
}

// frontend validates svc and renders everything but its endpoints.
func frontend(svc *corev1.Service) (*pb.Service, error) {
	if !utf8.ValidString(svc.Namespace) || !utf8.ValidString(svc.Name) || svc.Namespace == "" || svc.Name == "" {
		return nil, errors.New("bad namespace or name")
	}
	out := &pb.Service{
		Namespace:             svc.Namespace,
		Name:                  svc.Name,
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
	}
	switch svc.Spec.Type {
	case corev1.ServiceTypeClusterIP, "":
		out.Type = pb.ServiceType_SERVICE_TYPE_CLUSTER_IP
	case corev1.ServiceTypeNodePort:
		out.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	case corev1.ServiceTypeLoadBalancer:
		out.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	default:
		return nil, fmt.Errorf("unknown type %q", svc.Spec.Type)
	}

	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	var err error
	if out.ClusterIps, err = parseIPs("clusterIPs", clusterIPs); err != nil {
		return nil, err
	}
	if out.ExternalIps, err = parseIPs("externalIPs", svc.Spec.ExternalIPs); err != nil {
		return nil, err
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		// Upstream ignores hostname-only entries and those with ipMode
		// Proxy: that load balancer sends traffic to the node itself.
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
			continue
		}
		ip, err := parseIPs("status.loadBalancer.ingress", []string{ing.IP})
		if err != nil {
			return nil, err
		}
		out.LoadBalancerIps = append(out.LoadBalancerIps, ip...)
	}
	for _, r := range svc.Spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			return nil, fmt.Errorf("loadBalancerSourceRanges: %w", err)
		}
		out.LoadBalancerSourceRanges = append(out.LoadBalancerSourceRanges, p.Masked().String())
	}

	// Like apiservice.ExternalPolicyLocal: the external policy only means
	// something for a Service reachable from outside.
	reachable := out.Type != pb.ServiceType_SERVICE_TYPE_CLUSTER_IP || len(out.ExternalIps) > 0
	if reachable && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		out.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		if out.Type == pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER {
			out.HealthCheckNodePort = svc.Spec.HealthCheckNodePort
		}
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		out.InternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	if out.HealthCheckNodePort < 0 || out.HealthCheckNodePort > 65535 {
		return nil, fmt.Errorf("healthCheckNodePort %d out of range", out.HealthCheckNodePort)
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		timeout := int32(defaultAffinityTimeout)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			timeout = *c.ClientIP.TimeoutSeconds
		}
		if timeout <= 0 || timeout > 86400 {
			return nil, fmt.Errorf("session affinity timeout %d out of range", timeout)
		}
		out.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: timeout}
	}

	seen := make(map[string]bool, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		proto, ok := protocols[p.Protocol]
		switch {
		case !ok:
			return nil, fmt.Errorf("port %q: unknown protocol %q", p.Name, p.Protocol)
		case !utf8.ValidString(p.Name):
			return nil, errors.New("port name is not UTF-8")
		case seen[p.Name]:
			return nil, fmt.Errorf("duplicate port name %q", p.Name)
		case p.Port < 1 || p.Port > 65535:
			return nil, fmt.Errorf("port %q: port %d out of range", p.Name, p.Port)
		case p.NodePort < 0 || p.NodePort > 65535:
			return nil, fmt.Errorf("port %q: nodePort %d out of range", p.Name, p.NodePort)
		}
		seen[p.Name] = true
		out.Ports = append(out.Ports, &pb.ServicePort{Name: p.Name, Protocol: proto, Port: p.Port, NodePort: p.NodePort})
	}
	return out, nil
}

var protocols = map[corev1.Protocol]pb.Protocol{
	"":                  pb.Protocol_PROTOCOL_TCP, // the API server defaults it
	corev1.ProtocolTCP:  pb.Protocol_PROTOCOL_TCP,
	corev1.ProtocolUDP:  pb.Protocol_PROTOCOL_UDP,
	corev1.ProtocolSCTP: pb.Protocol_PROTOCOL_SCTP,
}

func parseIPs(field string, in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for _, s := range in {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		out = append(out, ip.Unmap().String())
	}
	return out, nil
}

// sortedSlices keeps the slices of the Service's IP families (upstream runs
// one proxier per family, and each ignores the other family's slices and
// FQDN ones) and orders them by name, so that merging is deterministic.
func sortedSlices(in []*discoveryv1.EndpointSlice, clusterIPs []string) []*discoveryv1.EndpointSlice {
	families := map[discoveryv1.AddressType]bool{}
	for _, ip := range clusterIPs {
		if netip.MustParseAddr(ip).Is4() {
			families[discoveryv1.AddressTypeIPv4] = true
		} else {
			families[discoveryv1.AddressTypeIPv6] = true
		}
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(in))
	for _, s := range in {
		if families[s.AddressType] {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// portEndpoints merges the endpoints of the service port called name across
// slices. Ports match by name and protocol, as upstream's ServicePortName.
// An address seen twice keeps the later copy unless that one is terminating,
// so a live endpoint beats a terminating duplicate.
func portEndpoints(sorted []*discoveryv1.EndpointSlice, name string, protocol corev1.Protocol) []endpoint {
	if protocol == "" {
		protocol = corev1.ProtocolTCP
	}
	type ipPort struct {
		addr netip.Addr
		port int32
	}
	byAddr := map[ipPort]endpoint{}
	for _, s := range sorted {
		target := int32(0)
		for _, p := range s.Ports {
			pp := corev1.ProtocolTCP
			if p.Protocol != nil {
				pp = *p.Protocol
			}
			if p.Name != nil && *p.Name == name && pp == protocol && p.Port != nil {
				target = *p.Port
				break
			}
		}
		if target < 1 || target > 65535 {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if len(e.Addresses) == 0 {
				continue
			}
			addr, err := netip.ParseAddr(e.Addresses[0])
			addr = addr.Unmap()
			if err != nil || addr.Is4() != (s.AddressType == discoveryv1.AddressTypeIPv4) {
				continue // garbage, or the wrong family for the slice
			}
			ep := endpoint{
				addr:        addr,
				port:        target,
				ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
				serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
				terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
			}
			if e.NodeName != nil {
				ep.nodeName = *e.NodeName
			}
			if e.Hints != nil {
				for _, z := range e.Hints.ForZones {
					ep.zoneHints = appendName(ep.zoneHints, z.Name)
				}
				for _, n := range e.Hints.ForNodes {
					ep.nodeHints = appendName(ep.nodeHints, n.Name)
				}
			}
			k := ipPort{ep.addr, ep.port}
			if _, dup := byAddr[k]; !dup || !ep.terminating {
				byAddr[k] = ep
			}
		}
	}
	out := make([]endpoint, 0, len(byAddr))
	for _, ep := range byAddr {
		out = append(out, ep)
	}
	slices.SortFunc(out, func(a, b endpoint) int {
		return cmp.Or(a.addr.Compare(b.addr), cmp.Compare(a.port, b.port))
	})
	return out
}

// appendName adds a hint name once. An empty name still counts as a hint
// (as upstream's hint sets), but it never matches: nodes without a zone
// label or name never use topology.
func appendName(names []string, n string) []string {
	if !utf8.ValidString(n) || slices.Contains(names, n) {
		return names
	}
	return append(names, n)
}

// classify precomputes what topology needs: upstream uses hints only when
// every ready endpoint has them (topologyModeFromHints skips endpoints that
// are not ready).
func (p *servicePort) classify() {
	p.allReadyHaveZoneHints, p.allReadyHaveNodeHints = true, true
	ready := 0
	for i := range p.endpoints {
		e := &p.endpoints[i]
		if e.ready || e.usableTerminating() {
			p.hasEndpointsAnywhere = true
		}
		if !e.ready {
			continue
		}
		ready++
		p.allReadyHaveZoneHints = p.allReadyHaveZoneHints && len(e.zoneHints) > 0
		p.allReadyHaveNodeHints = p.allReadyHaveNodeHints && len(e.nodeHints) > 0
	}
	if ready == 0 {
		p.allReadyHaveZoneHints, p.allReadyHaveNodeHints = false, false
	}
}

// triggerTime is the newest endpoints.kubernetes.io/last-change-trigger-time
// among the slices; unparseable values are ignored, as upstream does.
func triggerTime(sorted []*discoveryv1.EndpointSlice) time.Time {
	var newest time.Time
	for _, s := range sorted {
		v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]
		if !ok {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.After(newest) {
			newest = t
		}
	}
	return newest
}
