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
	netutils "k8s.io/utils/net"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/capture"
)

// LabelServiceProxyName marks a Service as handled by another proxy;
// kube-proxy, and so proxyplane, leaves such Services alone.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// defaultAffinityTimeout is Kubernetes' default for
// sessionAffinityConfig.clientIP.timeoutSeconds (3 hours).
const defaultAffinityTimeout = 10800

// ErrInvalidService reports a Service that cannot be programmed. Build
// returns it for a Service that BuildReport would leave out.
var ErrInvalidService = errors.New("invalid service")

// Kinds of object a Problem names, as their Kubernetes kind.
const (
	KindService       = "Service"
	KindEndpointSlice = "EndpointSlice"
)

// Reasons a Problem gives, in the style of Kubernetes Event reasons.
const (
	// ReasonInvalidService: a field of the Service cannot be used, so the
	// whole Service is left out of every table.
	ReasonInvalidService = "InvalidService"
	// ReasonInvalidValue: one value of a list of the Service (an external
	// IP, a load balancer ingress IP, a source range) cannot be used; that
	// value is left out and the rest of the Service is proxied, as
	// upstream kube-proxy does.
	ReasonInvalidValue = "InvalidValue"
	// ReasonInvalidEndpoint: an endpoint or a port of an EndpointSlice
	// cannot be used; that element is left out and the rest of the slice
	// still counts.
	ReasonInvalidEndpoint = "InvalidEndpoint"
)

// Problem is a part of a Service, or of one of its EndpointSlices, that
// BuildReport left out. Problems are returned rather than logged so that
// compute stays pure and the caller decides how often to tell anyone.
type Problem struct {
	// Kind is KindService or KindEndpointSlice.
	Kind string
	// Namespace and Name name the object at fault.
	Namespace, Name string
	// Reason is ReasonInvalidService, ReasonInvalidValue or
	// ReasonInvalidEndpoint.
	Reason string
	// Message says what is wrong, naming the field.
	Message string
}

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
	endpoints              []endpoint // sorted by address (IPv4 first), then port
	// families splits endpoints by IP family. Upstream runs one proxier
	// per family, each seeing only its own family's endpoints, so hints,
	// topology and the terminating fallback are decided per family.
	families             []portFamily
	hasEndpointsAnywhere bool
}

// portFamily is one IP family's endpoints of a port.
type portFamily struct {
	endpoints             []endpoint // a run of servicePort.endpoints
	allReadyHaveZoneHints bool
	allReadyHaveNodeHints bool
}

// Build computes the table views of svc from its EndpointSlices. svc must
// not be skipped (see SkipReason). Invalid Service fields are an error
// wrapping ErrInvalidService; invalid elements of the slices are left out
// silently (BuildReport reports them).
func Build(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) (*Service, error) {
	s, _, err := build(svc, slices, nil)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidService, Key(svc.Namespace, svc.Name), err)
	}
	return s, nil
}

// BuildReport is Build that also says what it left out; Build stays for
// callers that only need the Service. When a field of svc is invalid it
// returns a nil Service and one ReasonInvalidService Problem, and the
// caller leaves the Service out of every table. An invalid value in a list
// that upstream filters value by value (an external IP, a load balancer
// ingress IP, a source range) is left out alone, as upstream's
// MapIPsByIPFamily and MapCIDRsByIPFamily leave it out, with a
// ReasonInvalidValue Problem; the rest of the Service is proxied. Upstream
// opens a load balancer to everyone when every source range is dropped;
// here it then admits no one (see ClosedSourceRange). It also returns a
// ReasonInvalidEndpoint Problem for each endpoint or slice port it
// skipped, as upstream's EndpointSliceCache skips elements, not whole
// slices. Problems come in a deterministic order: the Service's, by
// field, then the slices', by slice name, then field.
func BuildReport(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) (*Service, []Problem) {
	return BuildGuarded(svc, slices, nil)
}

// BuildGuarded is BuildReport that also leaves out, as ReasonInvalidValue
// Problems, the external and load balancer IPs that would capture what g
// guards: every agent would refuse a table holding one.
func BuildGuarded(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, g *Guard) (*Service, []Problem) {
	s, problems, err := build(svc, slices, g)
	if err != nil {
		return nil, []Problem{{
			Kind: KindService, Namespace: svc.Namespace, Name: svc.Name,
			Reason: ReasonInvalidService, Message: err.Error(),
		}}
	}
	return s, problems
}

// build is Build and BuildReport; its error is frontend's, unwrapped, so
// that each caller words it for its audience.
func build(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, g *Guard) (*Service, []Problem, error) {
	base, dropped, err := frontend(svc, g)
	if err != nil {
		return nil, nil, err
	}
	problems := make([]Problem, 0, len(dropped))
	for _, d := range dropped {
		problems = append(problems, Problem{
			Kind: KindService, Namespace: svc.Namespace, Name: svc.Name,
			Reason: ReasonInvalidValue, Message: d,
		})
	}
	externallyAccessible := len(base.ExternalIps) > 0 || len(base.LoadBalancerIps) > 0
	externalLocal := base.ExternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	internalLocal := base.InternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL

	sorted := sortedSlices(slices, base.ClusterIps)
	usable, sliceProblems := usableSlices(sorted)
	problems = append(problems, sliceProblems...)
	ports := make([]servicePort, len(base.Ports))
	for i, p := range base.Ports {
		portExternal := externallyAccessible || p.NodePort != 0
		sp := servicePort{
			name:        p.Name,
			usesCluster: !internalLocal || portExternal,
			usesLocal:   internalLocal || (externalLocal && portExternal),
			endpoints:   portEndpoints(usable, p.Name, svc.Spec.Ports[i].Protocol),
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
	if len(problems) == 0 {
		problems = nil
	}
	return s, problems, nil
}

// ClosedSourceRange is the one source range a Service carries when it
// lists loadBalancerSourceRanges but none of them can be used. Upstream
// drops invalid ranges and, left with none, opens the load balancer to
// everyone; a typo must not do that. No packet can come from 0.0.0.0 (the
// kernel drops it as a martian source), and every agent version treats a
// family without ranges of its own as closed when the Service has ranges
// at all, so the load balancer admits no one in either family without the
// agent knowing anything about it.
const ClosedSourceRange = "0.0.0.0/32"

// frontend validates svc and renders everything but its endpoints. An
// invalid field is an error; an invalid value that upstream drops alone is
// left out and described in dropped, in field order, as is an external or
// load balancer IP that would capture what g guards.
func frontend(svc *corev1.Service, g *Guard) (out *pb.Service, dropped []string, err error) {
	if !utf8.ValidString(svc.Namespace) || !utf8.ValidString(svc.Name) || svc.Namespace == "" || svc.Name == "" {
		return nil, nil, errors.New("bad namespace or name")
	}
	out = &pb.Service{
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
		return nil, nil, fmt.Errorf("unknown type %q", svc.Spec.Type)
	}

	// Without a cluster IP nothing can be programmed (upstream's proxier
	// skips a Service with none of its family), so a bad one is fatal.
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	out.ClusterIps = make([]string, 0, len(clusterIPs))
	for _, s := range clusterIPs {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, nil, fmt.Errorf("clusterIPs: %w", err)
		}
		out.ClusterIps = append(out.ClusterIps, ip.Unmap().String())
	}
	// External IPs, ingress IPs and source ranges are filtered value by
	// value, as upstream's newBaseServiceInfo filters them.
	drop := func(format string, args ...any) { dropped = append(dropped, fmt.Sprintf(format, args...)) }
	var ports []int32 // for g; a bad port makes the Service invalid below
	if g != nil && (len(svc.Spec.ExternalIPs) > 0 || len(svc.Status.LoadBalancer.Ingress) > 0) {
		for _, p := range svc.Spec.Ports {
			ports = append(ports, p.Port)
		}
	}
	for i, s := range svc.Spec.ExternalIPs {
		ip, ok := parseAddrSloppy(s)
		if !ok {
			drop("externalIPs[%d] %q is not an IP address: left out", i, s)
			continue
		}
		if err := g.check(capture.ExternalIP, ip, ports); err != nil {
			drop("externalIPs[%d] %q: %v: left out", i, s, err)
			continue
		}
		out.ExternalIps = append(out.ExternalIps, ip.String())
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		// Upstream ignores hostname-only entries and those with ipMode
		// Proxy: that load balancer sends traffic to the node itself.
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
			continue
		}
		ip, ok := parseAddrSloppy(ing.IP)
		if !ok {
			drop("status.loadBalancer.ingress[%d].ip %q is not an IP address: left out", i, ing.IP)
			continue
		}
		if err := g.check(capture.LoadBalancerIP, ip, ports); err != nil {
			drop("status.loadBalancer.ingress[%d].ip %q: %v: left out", i, ing.IP, err)
			continue
		}
		out.LoadBalancerIps = append(out.LoadBalancerIps, ip.String())
	}
	for i, r := range svc.Spec.LoadBalancerSourceRanges {
		// Validation lets whitespace around a range through; upstream
		// trims it.
		p, ok := parsePrefixSloppy(strings.TrimSpace(r))
		if !ok {
			drop("loadBalancerSourceRanges[%d] %q is not a CIDR: left out", i, r)
			continue
		}
		out.LoadBalancerSourceRanges = append(out.LoadBalancerSourceRanges, p.String())
	}
	if len(svc.Spec.LoadBalancerSourceRanges) > 0 && len(out.LoadBalancerSourceRanges) == 0 {
		out.LoadBalancerSourceRanges = []string{ClosedSourceRange}
		drop("loadBalancerSourceRanges: none is valid: the load balancer admits no one (upstream would admit everyone)")
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
		return nil, nil, fmt.Errorf("healthCheckNodePort %d out of range", out.HealthCheckNodePort)
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		timeout := int32(defaultAffinityTimeout)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			timeout = *c.ClientIP.TimeoutSeconds
		}
		if timeout <= 0 || timeout > 86400 {
			return nil, nil, fmt.Errorf("session affinity timeout %d out of range", timeout)
		}
		out.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: timeout}
	}

	seen := make(map[string]bool, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		proto, ok := protocols[p.Protocol]
		switch {
		case !ok:
			return nil, nil, fmt.Errorf("port %q: unknown protocol %q", p.Name, p.Protocol)
		case !utf8.ValidString(p.Name):
			return nil, nil, errors.New("port name is not UTF-8")
		case seen[p.Name]:
			return nil, nil, fmt.Errorf("duplicate port name %q", p.Name)
		case p.Port < 1 || p.Port > 65535:
			return nil, nil, fmt.Errorf("port %q: port %d out of range", p.Name, p.Port)
		case p.NodePort < 0 || p.NodePort > 65535:
			return nil, nil, fmt.Errorf("port %q: nodePort %d out of range", p.Name, p.NodePort)
		}
		seen[p.Name] = true
		out.Ports = append(out.Ports, &pb.ServicePort{Name: p.Name, Protocol: proto, Port: p.Port, NodePort: p.NodePort})
	}
	return out, dropped, nil
}

var protocols = map[corev1.Protocol]pb.Protocol{
	"":                  pb.Protocol_PROTOCOL_TCP, // the API server defaults it
	corev1.ProtocolTCP:  pb.Protocol_PROTOCOL_TCP,
	corev1.ProtocolUDP:  pb.Protocol_PROTOCOL_UDP,
	corev1.ProtocolSCTP: pb.Protocol_PROTOCOL_SCTP,
}

// parseAddrSloppy parses an address as upstream's netutils.ParseIPSloppy
// does (leading zeros in IPv4 octets are decimal, as objects stored before
// the API server rejected them may hold them), unmapped and without a zone.
func parseAddrSloppy(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), a.Zone() == ""
	}
	a, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(s))
	return a.Unmap(), ok
}

// parsePrefixSloppy parses a CIDR as upstream's netutils.ParseCIDRSloppy
// does, masked.
func parsePrefixSloppy(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	// Only leading zeros get this far (netip takes everything else
	// ParseCIDRSloppy takes), and only in IPv4 addresses.
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP.To4())
	ones, bits := n.Mask.Size()
	if !ok || bits != 32 {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
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

// usableSlice is what Build uses of one EndpointSlice: the ports and
// endpoints that passed usableSlices' checks.
type usableSlice struct {
	ports     []usablePort
	endpoints []usableEndpoint
}

// usablePort is a slice port with a name, a known protocol (TCP when
// unset, as the API server defaults it) and a port number in range.
type usablePort struct {
	name     string
	protocol corev1.Protocol
	port     int32
}

// usableEndpoint is a slice endpoint whose first address parsed, in the
// slice's family.
type usableEndpoint struct {
	addr netip.Addr
	e    *discoveryv1.Endpoint
}

// usableSlices checks each slice once and keeps what can be used. Like
// upstream's EndpointSliceCache it skips elements, never whole slices: a
// port without a name or number (upstream: "Ignoring invalid endpoint
// port"), an endpoint without an address, or of the other family
// (upstream: an IncorrectIPVersion event). It also skips what upstream
// does not check but the API server's validation rejects, and what would
// make the result ambiguous: addresses that do not parse, port numbers out
// of range, unknown protocols and duplicate port names (every port sharing
// the name, since none of them is more right than the others). Each skip is
// a Problem naming the slice.
func usableSlices(sorted []*discoveryv1.EndpointSlice) ([]usableSlice, []Problem) {
	var problems []Problem
	out := make([]usableSlice, len(sorted))
	for i, s := range sorted {
		report := func(format string, args ...any) {
			problems = append(problems, Problem{
				Kind: KindEndpointSlice, Namespace: s.Namespace, Name: s.Name,
				Reason: ReasonInvalidEndpoint, Message: fmt.Sprintf(format, args...),
			})
		}
		names := make(map[string]int, len(s.Ports))
		for _, p := range s.Ports {
			if p.Name != nil {
				names[*p.Name]++
			}
		}
		u := &out[i]
		for j, p := range s.Ports {
			proto := corev1.ProtocolTCP
			if p.Protocol != nil && *p.Protocol != "" {
				proto = *p.Protocol
			}
			switch {
			case p.Name == nil:
				report("ports[%d]: no name", j)
			case names[*p.Name] > 1:
				report("ports[%d]: duplicate port name %q", j, *p.Name)
			case p.Port == nil:
				report("ports[%d] %q: no port number", j, *p.Name)
			case *p.Port < 1 || *p.Port > 65535:
				report("ports[%d] %q: port %d out of range", j, *p.Name, *p.Port)
			case !knownProtocol(proto):
				report("ports[%d] %q: unknown protocol %q", j, *p.Name, proto)
			default:
				u.ports = append(u.ports, usablePort{name: *p.Name, protocol: proto, port: *p.Port})
			}
		}
		v4 := s.AddressType == discoveryv1.AddressTypeIPv4
		for j := range s.Endpoints {
			e := &s.Endpoints[j]
			if len(e.Addresses) == 0 {
				report("endpoints[%d]: no address", j)
				continue
			}
			// Only the first address counts, as upstream.
			addr, err := netip.ParseAddr(e.Addresses[0])
			addr = addr.Unmap()
			switch {
			case err != nil:
				report("endpoints[%d]: address %q is not an IP address", j, e.Addresses[0])
			case addr.Is4() != v4:
				report("endpoints[%d]: address %q is not of the slice's address type %s", j, e.Addresses[0], s.AddressType)
			default:
				u.endpoints = append(u.endpoints, usableEndpoint{addr: addr, e: e})
			}
		}
	}
	return out, problems
}

func knownProtocol(p corev1.Protocol) bool {
	_, ok := protocols[p]
	return ok && p != ""
}

// portEndpoints merges the endpoints of the service port called name across
// slices. Ports match by name and protocol, as upstream's ServicePortName.
// An address seen twice keeps the later copy unless that one is terminating,
// so a live endpoint beats a terminating duplicate.
func portEndpoints(usable []usableSlice, name string, protocol corev1.Protocol) []endpoint {
	if protocol == "" {
		protocol = corev1.ProtocolTCP
	}
	type ipPort struct {
		addr netip.Addr
		port int32
	}
	byAddr := map[ipPort]endpoint{}
	for _, s := range usable {
		target := int32(0)
		for _, p := range s.ports {
			if p.name == name && p.protocol == protocol {
				target = p.port // unique: duplicate names were left out
				break
			}
		}
		if target == 0 {
			continue
		}
		for _, u := range s.endpoints {
			e := u.e
			ep := endpoint{
				addr:        u.addr,
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
// (as in upstream's hint sets), but here it never matches: nodes without a
// zone label never use topology, where upstream would match an empty zone
// hint (a known difference, docs/semantics.md).
func appendName(names []string, n string) []string {
	if !utf8.ValidString(n) || slices.Contains(names, n) {
		return names
	}
	return append(names, n)
}

// classify splits the endpoints by family and precomputes what topology
// needs: upstream uses a family's hints only when every ready endpoint of
// that family has them (topologyModeFromHints skips endpoints that are not
// ready).
func (p *servicePort) classify() {
	p.families = nil
	for rest := p.endpoints; len(rest) > 0; {
		n := 1
		for n < len(rest) && rest[n].addr.Is4() == rest[0].addr.Is4() {
			n++
		}
		f := portFamily{endpoints: rest[:n:n], allReadyHaveZoneHints: true, allReadyHaveNodeHints: true}
		ready := 0
		for i := range f.endpoints {
			e := &f.endpoints[i]
			if e.ready || e.usableTerminating() {
				p.hasEndpointsAnywhere = true
			}
			if !e.ready {
				continue
			}
			ready++
			f.allReadyHaveZoneHints = f.allReadyHaveZoneHints && len(e.zoneHints) > 0
			f.allReadyHaveNodeHints = f.allReadyHaveNodeHints && len(e.nodeHints) > 0
		}
		if ready == 0 {
			f.allReadyHaveZoneHints, f.allReadyHaveNodeHints = false, false
		}
		p.families = append(p.families, f)
		rest = rest[n:]
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
