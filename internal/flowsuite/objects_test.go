package flowsuite

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/internal/nstest"
)

// Every Service in the suite is dual-stack with a TCP and a UDP port, both
// 80, both served by the pods on backendPort; each case has its own
// addresses and ports, derived from its index, so cases never interfere.
const (
	servicePort   = 80
	firstNodePort = 30000
	firstHCPort   = 32000
	namespace     = "flows"
)

// clusterIPs returns case idx's ClusterIPs, IPv4 first.
func clusterIPs(idx int) []string {
	return []string{fmt.Sprintf("10.96.0.%d", 10+idx), fmt.Sprintf("fd00:96::%x", 10+idx)}
}

// svcOption adjusts a Service.
type svcOption func(*corev1.Service)

// newService returns a dual-stack ClusterIP Service named name for case
// idx.
func newService(idx int, name string, opts ...svcOption) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  clusterIPs(idx)[0],
			ClusterIPs: clusterIPs(idx),
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromString("web")},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: servicePort, TargetPort: intstr.FromInt32(backendPort)},
			},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

// nodePorts makes the Service type NodePort (unless already
// LoadBalancer) with case idx's node port for TCP and the next for UDP.
func nodePorts(idx int) svcOption {
	return func(s *corev1.Service) {
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			s.Spec.Type = corev1.ServiceTypeNodePort
		}
		s.Spec.Ports[0].NodePort = int32(firstNodePort + 2*idx)
		s.Spec.Ports[1].NodePort = int32(firstNodePort + 2*idx + 1)
	}
}

// loadBalancer makes the Service type LoadBalancer with ingress IPs ips
// (VIP mode) and case idx's node ports.
func loadBalancer(idx int, ips ...netip.Addr) svcOption {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		nodePorts(idx)(s)
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
		}
	}
}

func externalIPs(ips ...netip.Addr) svcOption {
	return func(s *corev1.Service) {
		for _, ip := range ips {
			s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, ip.String())
		}
	}
}

// externalLocal sets externalTrafficPolicy Local and case idx's
// healthCheckNodePort.
func externalLocal(idx int) svcOption {
	return func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = int32(firstHCPort + idx)
	}
}

func internalLocal(s *corev1.Service) {
	s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
}

func affinity(timeout int32) svcOption {
	return func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	}
}

func sourceRanges(cidrs ...string) svcOption {
	return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = cidrs }
}

func trafficDistribution(d string) svcOption {
	return func(s *corev1.Service) { s.Spec.TrafficDistribution = &d }
}

func labelled(k, v string) svcOption {
	return func(s *corev1.Service) { s.Labels = map[string]string{k: v} }
}

// ep describes one endpoint: a pod and its conditions and hints.
type ep struct {
	pod                         int
	notReady, serving, terminat bool // ready unless notReady
	zoneHint, nodeHint          string
}

func ready(pod int) ep { return ep{pod: pod} }

// terminating is a pod being deleted that still serves (serving) or not.
func terminating(pod int, serving bool) ep {
	return ep{pod: pod, notReady: true, serving: serving, terminat: true}
}

func (e ep) zone(z string) ep { e.zoneHint = z; return e }
func (e ep) node(n string) ep { e.nodeHint = n; return e }

// endpointSlices returns the slices of Service name: per family, the
// endpoints in slices of at most two, so Services with more than two
// endpoints exercise merging several slices.
func endpointSlices(tp *nstest.Topology, name string, eps ...ep) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		for n := 0; n == 0 || n*2 < len(eps); n++ {
			s := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: namespace, Name: fmt.Sprintf("%s-%s-%d", name, fam, n),
					Labels: map[string]string{discoveryv1.LabelServiceName: name},
				},
				AddressType: fam,
				Ports: []discoveryv1.EndpointPort{
					{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](backendPort)},
					{Name: ptr.To("udp"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](backendPort)},
				},
			}
			for _, e := range eps[min(2*n, len(eps)):min(2*n+2, len(eps))] {
				s.Endpoints = append(s.Endpoints, endpoint(tp, fam, e))
			}
			out = append(out, s)
		}
	}
	return out
}

func endpoint(tp *nstest.Topology, fam discoveryv1.AddressType, e ep) discoveryv1.Endpoint {
	addr := tp.PodIP(e.pod)
	if fam == discoveryv1.AddressTypeIPv6 {
		addr = tp.PodIPv6(e.pod)
	}
	node := tp.PodNode(e.pod)
	out := discoveryv1.Endpoint{
		Addresses: []string{addr.String()},
		Conditions: discoveryv1.EndpointConditions{
			Ready: ptr.To(!e.notReady), Serving: ptr.To(!e.notReady || e.serving), Terminating: ptr.To(e.terminat),
		},
		NodeName: ptr.To(node.Name()),
		Zone:     ptr.To(zones[nodeIndex(tp, node)]),
	}
	if e.zoneHint != "" || e.nodeHint != "" {
		out.Hints = &discoveryv1.EndpointHints{}
		if e.zoneHint != "" {
			out.Hints.ForZones = []discoveryv1.ForZone{{Name: e.zoneHint}}
		}
		if e.nodeHint != "" {
			out.Hints.ForNodes = []discoveryv1.ForNode{{Name: e.nodeHint}}
		}
	}
	return out
}

func nodeIndex(tp *nstest.Topology, n *nstest.Node) int {
	for k := range tp.Nodes() {
		if tp.Node(k) == n {
			return k
		}
	}
	panic("node not in topology")
}
