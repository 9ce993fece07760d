package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// The world: N Nodes in three zones (node i in zones[i%3]) and S
// Services in one namespace, each with one EndpointSlice shaped as the
// EndpointSlice controller writes it. Everything is planned up front from
// the seed, so a run is reproducible.
const (
	namespace  = "fleet"
	nodePrefix = "fleet-node-"
	portName   = "http"
	port       = 80
	targetPort = 8080
	managedBy  = "endpointslice-controller.k8s.io"
)

var zones = []string{"zone-a", "zone-b", "zone-c"}

// class is what kind of Service it is.
type class int

const (
	plain  class = iota // ClusterIP, Cluster policies
	hinted              // ClusterIP, trafficDistribution PreferClose, hints on every endpoint
	local               // externalTrafficPolicy Local: LoadBalancer or NodePort
)

func (c class) String() string { return [...]string{"plain", "hinted", "eTP-local"}[c] }

// service is one planned Service and what the harness knows of it.
type service struct {
	idx   int
	name  string
	class class
	// lb: a LoadBalancer (with a VIP ingress and a healthCheckNodePort);
	// otherwise a local Service is a NodePort.
	lb        bool
	endpoints []endpoint
	// changes counts the changes made to it, which picks the endpoint to
	// move next.
	changes int
	// slice is the EndpointSlice as last written, for the next update.
	slice *discoveryv1.EndpointSlice
}

// endpoint is one backend: a pod IP on a node.
type endpoint struct {
	node int
	ip   netip.Addr
}

// world is the plan.
type world struct {
	nodes    int
	services []*service
	byClass  [3][]*service
	rnd      *rand.Rand
	// nextIP numbers pod IPs from 10.128.0.0/9; changes take new ones.
	nextIP uint32
}

func newWorld(o *Options) *world {
	w := &world{nodes: o.Nodes, rnd: rand.New(rand.NewPCG(o.Seed, 0x666c656574))}
	// Classes by share, placed at random.
	nh := int(float64(o.Services)*o.HintedPercent/100 + 0.5)
	nl := int(float64(o.Services)*o.LocalPercent/100 + 0.5)
	classes := make([]class, o.Services)
	for i := range classes {
		switch {
		case i < nh:
			classes[i] = hinted
		case i < nh+nl:
			classes[i] = local
		}
	}
	w.rnd.Shuffle(len(classes), func(i, j int) { classes[i], classes[j] = classes[j], classes[i] })
	nLocal := 0
	for i, c := range classes {
		s := &service{idx: i, name: fmt.Sprintf("svc-%05d", i), class: c}
		if c == local {
			s.lb = nLocal%2 == 0
			nLocal++
		}
		for j := range o.EndpointsPer {
			s.endpoints = append(s.endpoints, endpoint{node: w.placeEndpoint(c, j), ip: w.newIP()})
		}
		w.services = append(w.services, s)
		w.byClass[c] = append(w.byClass[c], s)
	}
	return w
}

// placeEndpoint picks endpoint j's node: for a hinted Service endpoint j
// is in zone j%3, so with 3 or more endpoints every zone has its own and
// uses its hints; otherwise any node.
func (w *world) placeEndpoint(c class, j int) int {
	if c != hinted {
		return w.rnd.IntN(w.nodes)
	}
	z := j % len(zones)
	inZone := (w.nodes - z + len(zones) - 1) / len(zones)
	return z + len(zones)*w.rnd.IntN(inZone)
}

func (w *world) newIP() netip.Addr {
	v := uint32(10)<<24 | 128<<16 + w.nextIP
	w.nextIP++
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func zoneOf(node int) string { return zones[node%len(zones)] }

func nodeName(i int) string { return contract.NodeName(nodePrefix, i) }

// ---- Kubernetes objects ---------------------------------------------------

func apiNode(i int) *corev1.Node {
	cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24).String()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: map[string]string{
			corev1.LabelHostname: nodeName(i), corev1.LabelTopologyZone: zoneOf(i), corev1.LabelOSStable: "linux",
		}},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
	}
}

func apiService(s *service) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{
				Name: portName, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(targetPort),
			}},
			Selector: map[string]string{"app": s.name},
		},
	}
	switch s.class {
	case hinted:
		svc.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
	case local:
		svc.Spec.Type = corev1.ServiceTypeNodePort
		if s.lb {
			svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		}
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	return svc
}

// loadBalancerIP is the VIP ingress of the i'th Service, in 198.18.0.0/15
// (reserved for benchmarks).
func loadBalancerIP(i int) string {
	return netip.AddrFrom4([4]byte{198, 18 + byte(i>>16&1), byte(i >> 8), byte(i)}).String()
}

// apiSlice is s's EndpointSlice as the EndpointSlice controller writes
// it, owned by the Service, with the trigger time of its last change.
func apiSlice(s *service, owner *corev1.Service, trigger time.Time) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.name + "-" + fmt.Sprintf("%05x", s.idx*2654435761&0xfffff), Namespace: namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: s.name,
				discoveryv1.LabelManagedBy:   managedBy,
			},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Service", Name: owner.Name, UID: owner.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To(portName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](targetPort),
		}},
	}
	sl.Endpoints = endpointsOf(s)
	return sl
}

func endpointsOf(s *service) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, len(s.endpoints))
	for j, e := range s.endpoints {
		out[j] = discoveryv1.Endpoint{
			Addresses:  []string{e.ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(nodeName(e.node)),
			Zone:       ptr.To(zoneOf(e.node)),
		}
		if s.class == hinted {
			out[j].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zoneOf(e.node)}}}
		}
	}
	return out
}
