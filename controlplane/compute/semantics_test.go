package compute

// Endpoint-choice cases that view_test.go and service_test.go leave out,
// each checked against what upstream kube-proxy computes
// (pkg/proxy/topology.go CategorizeEndpoints and topologyModeFromHints,
// pkg/proxy/serviceport.go, pkg/proxy/endpointslicecache.go).
//
// Where compute differs from upstream, the case states upstream's result
// and its bug field says how compute differs; such a case is skipped while
// the difference stands, and passes once compute is fixed.

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// withTrafficDistribution sets spec.trafficDistribution.
func withTrafficDistribution(d string) svcOpt {
	return func(s *corev1.Service) { s.Spec.TrafficDistribution = ptr(d) }
}

// endpointCase is one node's view of a Service, compared by endpoint IPs.
type endpointCase struct {
	name        string
	svc         *corev1.Service // newService() when nil
	slices      []*discoveryv1.EndpointSlice
	node        *Node
	wantCluster map[string][]string // port name -> IPs; nil for none
	wantLocal   map[string][]string
	wantHas     *bool // has_endpoints of every port, when set
}

func runEndpointCases(t *testing.T, tests []endpointCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.svc
			if svc == nil {
				svc = newService()
			}
			got := viewFor(t, mustBuild(t, svc, tt.slices...), tt.node)
			checkIPs(t, "cluster_endpoints", got.ClusterEndpoints, tt.wantCluster)
			checkIPs(t, "local_endpoints", got.LocalEndpoints, tt.wantLocal)
			if tt.wantHas != nil {
				for _, p := range got.Ports {
					if p.HasEndpoints != *tt.wantHas {
						t.Errorf("port %q: has_endpoints = %v, want %v", p.Name, p.HasEndpoints, *tt.wantHas)
					}
				}
			}
		})
	}
}

// TestTrafficDistribution checks that hints, not spec.trafficDistribution,
// decide topology: upstream kube-proxy reads only the hints, which the
// EndpointSlice controller writes for PreferClose and PreferSameZone (zone
// hints) and PreferSameNode (a node hint and a zone hint per endpoint).
// Endpoint IPs: 10.0.1.x in zone-a, 10.0.2.x in zone-b; 10.0.1.1 runs on
// node-1, 10.0.1.2 on node-2, 10.0.2.1 on node-3.
func TestTrafficDistribution(t *testing.T) {
	zoneHinted := func(eps ...discoveryv1.Endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{httpSlice("web-a", eps...)}
	}
	// What the controller writes for PreferSameNode.
	sameNode := zoneHinted(
		ep("10.0.1.1", onNode("node-1"), forNodes("node-1"), forZones("zone-a")),
		ep("10.0.1.2", onNode("node-2"), forNodes("node-2"), forZones("zone-a")),
		ep("10.0.2.1", onNode("node-3"), forNodes("node-3"), forZones("zone-b")),
	)
	// What the controller writes for PreferClose and PreferSameZone.
	sameZone := zoneHinted(
		ep("10.0.1.1", onNode("node-1"), forZones("zone-a")),
		ep("10.0.1.2", onNode("node-2"), forZones("zone-a")),
		ep("10.0.2.1", onNode("node-3"), forZones("zone-b")),
	)
	unhinted := zoneHinted(
		ep("10.0.1.1", onNode("node-1")),
		ep("10.0.1.2", onNode("node-2")),
		ep("10.0.2.1", onNode("node-3")),
	)
	all := map[string][]string{"http": {"10.0.1.1", "10.0.1.2", "10.0.2.1"}}
	zoneA := map[string][]string{"http": {"10.0.1.1", "10.0.1.2"}}
	tests := []endpointCase{
		{
			name:        "PreferClose: the node's zone",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferClose)),
			slices:      sameZone,
			node:        testNode("node-9", "zone-a"),
			wantCluster: zoneA,
		},
		{
			name:        "PreferSameZone: the node's zone",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameZone)),
			slices:      sameZone,
			node:        testNode("node-9", "zone-b"),
			wantCluster: map[string][]string{"http": {"10.0.2.1"}},
		},
		{
			name:        "PreferSameZone: a zone no hint names gets every endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameZone)),
			slices:      sameZone,
			node:        testNode("node-9", "zone-c"),
			wantCluster: all,
		},
		{
			name:        "PreferSameZone: a node without a zone label gets every endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameZone)),
			slices:      sameZone,
			node:        testNode("node-9", ""),
			wantCluster: all,
		},
		{
			name:        "PreferSameNode: the node's own endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:      sameNode,
			node:        testNode("node-2", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.2"}},
		},
		{
			name:        "PreferSameNode: a node without an endpoint falls back to its zone",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:      sameNode,
			node:        testNode("node-9", "zone-a"),
			wantCluster: zoneA,
		},
		{
			name:        "PreferSameNode: a node without an endpoint in a zone without one gets every endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:      sameNode,
			node:        testNode("node-9", "zone-c"),
			wantCluster: all,
		},
		{
			name:        "PreferSameNode: a node without a zone label and without an endpoint gets every endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:      sameNode,
			node:        testNode("node-9", ""),
			wantCluster: all,
		},
		{
			name:        "PreferSameNode: a node without a zone label still gets its own endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:      sameNode,
			node:        testNode("node-3", ""),
			wantCluster: map[string][]string{"http": {"10.0.2.1"}},
		},
		{
			name: "PreferSameNode: the node's own endpoint not ready falls back to its zone",
			svc:  newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices: zoneHinted(
				ep("10.0.1.1", onNode("node-1"), forNodes("node-1"), forZones("zone-a"), notReady()),
				ep("10.0.1.2", onNode("node-2"), forNodes("node-2"), forZones("zone-a")),
				ep("10.0.2.1", onNode("node-3"), forNodes("node-3"), forZones("zone-b")),
			),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.2"}},
		},
		{
			// The controller hints only what it can, e.g. while an
			// endpoint has no node name yet.
			name: "PreferSameNode: one ready endpoint without a node hint disables node topology",
			svc:  newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices: zoneHinted(
				ep("10.0.1.1", onNode("node-1"), forNodes("node-1"), forZones("zone-a")),
				ep("10.0.1.2", forZones("zone-a")),
				ep("10.0.2.1", onNode("node-3"), forNodes("node-3"), forZones("zone-b")),
			),
			node:        testNode("node-1", "zone-a"),
			wantCluster: zoneA,
		},
		{
			name: "PreferSameNode: one ready endpoint without any hint disables all topology",
			svc:  newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices: zoneHinted(
				ep("10.0.1.1", onNode("node-1"), forNodes("node-1"), forZones("zone-a")),
				ep("10.0.1.2", onNode("node-2")),
				ep("10.0.2.1", onNode("node-3"), forNodes("node-3"), forZones("zone-b")),
			),
			node:        testNode("node-1", "zone-a"),
			wantCluster: all,
		},
		{
			name: "PreferSameNode with eTP Local: topology for the cluster set only",
			svc: nodePortService(withExternalLocal(),
				withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:      sameNode,
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}},
			wantLocal:   map[string][]string{"http": {"10.0.1.1"}},
		},
		{
			name: "PreferSameNode with iTP Local: no topology, own endpoints only",
			svc: newService(withInternalLocal(),
				withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:    sameNode,
			node:      testNode("node-1", "zone-a"),
			wantLocal: map[string][]string{"http": {"10.0.1.1"}},
			wantHas:   ptr(true),
		},
		{
			name: "PreferSameNode with iTP Local, node without an endpoint: nothing, has_endpoints true",
			svc: newService(withInternalLocal(),
				withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:  sameNode,
			node:    testNode("node-9", "zone-a"),
			wantHas: ptr(true),
		},
		{
			// The controller has not hinted the endpoints yet, or cannot.
			name:        "trafficDistribution without hints: every endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameZone)),
			slices:      unhinted,
			node:        testNode("node-1", "zone-a"),
			wantCluster: all,
		},
		{
			name:        "PreferSameNode without hints: every endpoint",
			svc:         newService(withTrafficDistribution(corev1.ServiceTrafficDistributionPreferSameNode)),
			slices:      unhinted,
			node:        testNode("node-1", "zone-a"),
			wantCluster: all,
		},
		{
			// As with the topology-mode annotation, which kube-proxy no
			// longer reads either.
			name: "hints without trafficDistribution: hints apply",
			svc: newService(func(s *corev1.Service) {
				s.Annotations = map[string]string{corev1.AnnotationTopologyMode: "Auto"}
			}),
			slices:      sameZone,
			node:        testNode("node-9", "zone-a"),
			wantCluster: zoneA,
		},
		{
			// ForZones names are label values, which may be empty, and a
			// node without the zone label has zone "": upstream's
			// ZoneHints().Has("") matches it and keeps only 10.0.1.1.
			// proxyplane never matches an empty zone, a known difference
			// (docs/semantics.md): no EndpointSlice controller writes
			// such a hint, and telling "no zone label" apart from "a zone
			// no hint names" would cost every Service a class.
			name: "zone hint with an empty name on a node without a zone label",
			slices: zoneHinted(
				ep("10.0.1.1", forZones("")),
				ep("10.0.2.1", forZones("zone-b")),
			),
			node:        testNode("node-9", ""),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
	}
	runEndpointCases(t, tests)
}

// TestAllTerminating checks Services whose endpoints are all terminating,
// on a node that hosts one of them (node-1) and one that hosts none.
func TestAllTerminating(t *testing.T) {
	serving := []*discoveryv1.EndpointSlice{httpSlice("web-a",
		ep("10.0.0.1", onNode("node-1"), terminating(true)),
		ep("10.0.0.2", onNode("node-2"), terminating(true)),
		ep("10.0.0.3", onNode("node-3"), terminating(false)),
	)}
	notServing := []*discoveryv1.EndpointSlice{httpSlice("web-a",
		ep("10.0.0.1", onNode("node-1"), terminating(false)),
		ep("10.0.0.2", onNode("node-2"), terminating(false)),
	)}
	both := map[string][]string{"http": {"10.0.0.1", "10.0.0.2"}}
	tests := []endpointCase{
		{
			name: "Cluster policy: serving ones", svc: nodePortService(), slices: serving,
			node: testNode("node-9", ""), wantCluster: both, wantHas: ptr(true),
		},
		{
			name: "eTP Local, hosting node: serving ones in both sets", svc: nodePortService(withExternalLocal()), slices: serving,
			node: testNode("node-1", ""), wantCluster: both, wantLocal: map[string][]string{"http": {"10.0.0.1"}}, wantHas: ptr(true),
		},
		{
			name: "eTP Local, other node: no local set, has_endpoints true", svc: nodePortService(withExternalLocal()), slices: serving,
			node: testNode("node-9", ""), wantCluster: both, wantHas: ptr(true),
		},
		{
			name: "eTP Local, node whose endpoint stopped serving: no local set", svc: nodePortService(withExternalLocal()), slices: serving,
			node: testNode("node-3", ""), wantCluster: both, wantHas: ptr(true),
		},
		{
			name: "iTP Local, other node: nothing, has_endpoints true", svc: newService(withInternalLocal()), slices: serving,
			node: testNode("node-9", ""), wantHas: ptr(true),
		},
		{
			name: "none serving: nothing anywhere, has_endpoints false", svc: nodePortService(withExternalLocal()), slices: notServing,
			node: testNode("node-1", ""), wantHas: ptr(false),
		},
		{
			name: "iTP Local, none serving: has_endpoints false", svc: newService(withInternalLocal()), slices: notServing,
			node: testNode("node-1", ""), wantHas: ptr(false),
		},
		{
			name: "zone-hinted and all terminating: hints ignored", svc: nodePortService(),
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a",
				ep("10.0.0.1", onNode("node-1"), forZones("zone-a"), terminating(true)),
				ep("10.0.0.2", onNode("node-2"), forZones("zone-b"), terminating(true)),
			)},
			node: testNode("node-9", "zone-a"), wantCluster: both, wantHas: ptr(true),
		},
	}
	runEndpointCases(t, tests)
}

// TestTargetPorts checks that endpoints take their port from the slice port
// matched by name and protocol, whatever the Service's targetPort says: the
// EndpointSlice controller resolves named and numbered target ports, and
// kube-proxy never reads them.
func TestTargetPorts(t *testing.T) {
	v4 := discoveryv1.AddressTypeIPv4
	withTarget := func(name string, target intstr.IntOrString) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: target}
	}
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   map[string][]int32 // port name -> endpoint ports, in order
	}{
		{
			name:   "numbered targetPort: the slice's number wins",
			svc:    newService(withPorts(withTarget("http", intstr.FromInt32(9999)))),
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1"))},
			want:   map[string][]int32{"http": {8080}},
		},
		{
			name: "named targetPort resolved per pod by the controller",
			svc:  newService(withPorts(withTarget("http", intstr.FromString("web")))),
			slices: []*discoveryv1.EndpointSlice{
				// Pods that name a different container port land in
				// different slices.
				httpSlice("web-a", ep("10.0.0.1")),
				newSlice("web-b", v4, []discoveryv1.EndpointPort{slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8081)}, ep("10.0.0.2")),
			},
			want: map[string][]int32{"http": {8080, 8081}},
		},
		{
			name: "unnamed single port, numbered",
			svc:  newService(withPorts(corev1.ServicePort{Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)})),
			slices: []*discoveryv1.EndpointSlice{newSlice("web-a", v4,
				[]discoveryv1.EndpointPort{slicePort(ptr(""), ptr(corev1.ProtocolUDP), 5353)}, ep("10.0.0.1"))},
			want: map[string][]int32{"": {5353}},
		},
		{
			name: "slices with different port sets",
			svc: newService(withPorts(
				withTarget("http", intstr.FromInt32(8080)),
				corev1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromString("metrics")},
			)),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web-a", v4, []discoveryv1.EndpointPort{
					slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8080),
					slicePort(ptr("metrics"), ptr(corev1.ProtocolTCP), 9100),
				}, ep("10.0.0.1")),
				newSlice("web-b", v4, []discoveryv1.EndpointPort{
					slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8080),
				}, ep("10.0.0.2")),
			},
			want: map[string][]int32{"http": {8080, 8080}, "metrics": {9100}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := viewFor(t, mustBuild(t, tt.svc, tt.slices...), testNode("node-a", ""))
			if len(got.ClusterEndpoints) != len(tt.want) {
				t.Fatalf("got %d port lists, want %d: %v", len(got.ClusterEndpoints), len(tt.want), got.ClusterEndpoints)
			}
			for _, pe := range got.ClusterEndpoints {
				want := tt.want[pe.PortName]
				if len(pe.Endpoints) != len(want) {
					t.Errorf("port %q: %d endpoints, want %d", pe.PortName, len(pe.Endpoints), len(want))
					continue
				}
				for i, e := range pe.Endpoints {
					if e.Port != want[i] {
						t.Errorf("port %q endpoint %s: port %d, want %d", pe.PortName, e.Ip, e.Port, want[i])
					}
				}
			}
		})
	}
}

// TestDualStackPerFamily checks dual-stack Services against upstream,
// which runs one proxier per IP family: each family's endpoints choose
// their topology, and fall back to terminating endpoints, on their own.
// IPv4 endpoints are 10.0.x.1, IPv6 ones fd00:x::1, with x the zone.
func TestDualStackPerFamily(t *testing.T) {
	dual := withClusterIPs("10.96.0.10", "fd00::10")
	v6 := discoveryv1.AddressTypeIPv6
	tests := []endpointCase{
		{
			name: "both families zone-hinted alike",
			svc:  newService(dual),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-v4", ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
				newSlice("web-v6", v6, httpPort(), ep("fd00:1::1", forZones("zone-a")), ep("fd00:2::1", forZones("zone-b"))),
			},
			node:        testNode("node-9", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "fd00:1::1"}},
		},
		{
			name: "eTP Local: local set of both families",
			svc:  nodePortService(dual, withExternalLocal()),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-v4", ep("10.0.1.1", onNode("node-1")), ep("10.0.2.1", onNode("node-2"))),
				newSlice("web-v6", v6, httpPort(), ep("fd00:1::1", onNode("node-1")), ep("fd00:2::1", onNode("node-2"))),
			},
			node:        testNode("node-1", ""),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1", "fd00:1::1", "fd00:2::1"}},
			wantLocal:   map[string][]string{"http": {"10.0.1.1", "fd00:1::1"}},
		},
		{
			// Possible while the two slices are updated one after the
			// other, or with hand-made slices.
			name: "IPv6 has no endpoint in the node's zone: IPv6 ignores topology",
			svc:  newService(dual),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-v4", ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
				newSlice("web-v6", v6, httpPort(), ep("fd00:2::1", forZones("zone-b"))),
			},
			node:        testNode("node-9", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "fd00:2::1"}},
		},
		{
			name: "only IPv4 is hinted: IPv4 uses topology, IPv6 does not",
			svc:  newService(dual),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-v4", ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
				newSlice("web-v6", v6, httpPort(), ep("fd00:1::1"), ep("fd00:2::1")),
			},
			node:        testNode("node-9", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "fd00:1::1", "fd00:2::1"}},
		},
		{
			name: "IPv6 only terminating: IPv6 falls back on its own",
			svc:  newService(dual),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-v4", ep("10.0.1.1")),
				newSlice("web-v6", v6, httpPort(), ep("fd00:1::1", terminating(true))),
			},
			node:        testNode("node-9", ""),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "fd00:1::1"}},
		},
		{
			name: "eTP Local, IPv6 local endpoint only terminating: local IPv6 falls back on its own",
			svc:  nodePortService(dual, withExternalLocal()),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-v4", ep("10.0.1.1", onNode("node-1"))),
				newSlice("web-v6", v6, httpPort(), ep("fd00:1::1", onNode("node-1"), terminating(true)),
					ep("fd00:2::1", onNode("node-2"))),
			},
			node:        testNode("node-1", ""),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "fd00:2::1"}},
			wantLocal:   map[string][]string{"http": {"10.0.1.1", "fd00:1::1"}},
		},
	}
	runEndpointCases(t, tests)
}
