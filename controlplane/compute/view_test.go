package compute

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestClusterFallback checks the cluster set: ready endpoints, else
// serving-and-terminating ones.
func TestClusterFallback(t *testing.T) {
	twoPorts := withPorts(svcPort("http", corev1.ProtocolTCP, 80, 0), svcPort("https", corev1.ProtocolTCP, 443, 0))
	tests := []struct {
		name    string
		svc     *corev1.Service // newService() when nil
		slices  []*discoveryv1.EndpointSlice
		want    []*pb.PortEndpoints
		wantHas []bool
	}{
		{
			name: "ready preferred over serving terminating",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a",
				ep("10.0.0.1", terminating(true)), ep("10.0.0.2"))},
			want:    []*pb.PortEndpoints{wantPort("http", ready("10.0.0.2", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "serving terminating when none is ready",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a",
				ep("10.0.0.2", terminating(true)), ep("10.0.0.1", terminating(true)),
				ep("10.0.0.3", terminating(false)), ep("10.0.0.4", notReady()))},
			want:    []*pb.PortEndpoints{wantPort("http", servingTerminating("10.0.0.1", 8080), servingTerminating("10.0.0.2", 8080))},
			wantHas: []bool{true},
		},
		{
			name: "terminating endpoints that stopped serving are never used",
			slices: []*discoveryv1.EndpointSlice{httpSlice("web-a",
				ep("10.0.0.1", terminating(false)))},
			wantHas: []bool{false},
		},
		{
			name: "fallback is per port",
			svc:  newService(twoPorts),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-a", ep("10.0.0.1")),
				newSlice("web-b", discoveryv1.AddressTypeIPv4,
					[]discoveryv1.EndpointPort{slicePort(ptr("https"), ptr(corev1.ProtocolTCP), 8443)},
					ep("10.0.0.2", terminating(true))),
			},
			want: []*pb.PortEndpoints{
				wantPort("http", ready("10.0.0.1", 8080)),
				wantPort("https", servingTerminating("10.0.0.2", 8443)),
			},
			wantHas: []bool{true, true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.svc
			if svc == nil {
				svc = newService()
			}
			got := viewFor(t, mustBuild(t, svc, tt.slices...), testNode("node-a", ""))
			checkProto(t, "cluster_endpoints", &pb.Service{ClusterEndpoints: got.ClusterEndpoints}, &pb.Service{ClusterEndpoints: tt.want})
			for i, p := range got.Ports {
				if p.HasEndpoints != tt.wantHas[i] {
					t.Errorf("port %q: has_endpoints = %v, want %v", p.Name, p.HasEndpoints, tt.wantHas[i])
				}
			}
		})
	}
}

// TestLocalFallback checks that the local set falls back to
// serving-and-terminating endpoints on its own, whatever the cluster set
// does.
func TestLocalFallback(t *testing.T) {
	clusterReady := []*discoveryv1.EndpointSlice{httpSlice("web-a",
		ep("10.0.0.1", onNode("node-a")),
		ep("10.0.0.2", onNode("node-b"), terminating(true)),
		ep("10.0.0.3", onNode("node-c")),
		ep("10.0.0.4", onNode("node-c"), terminating(true)),
		ep("10.0.0.5", onNode("node-d"), terminating(false)),
		ep("10.0.0.6", onNode("node-d"), notReady()),
	)}
	noneReady := []*discoveryv1.EndpointSlice{httpSlice("web-a",
		ep("10.0.0.2", onNode("node-b"), terminating(true)),
		ep("10.0.0.4", onNode("node-c"), terminating(true)),
	)}
	tests := []struct {
		name        string
		svc         *corev1.Service
		slices      []*discoveryv1.EndpointSlice
		node        string
		wantCluster []*pb.Endpoint // nil: no cluster_endpoints
		wantLocal   []*pb.Endpoint // nil: no local_endpoints
	}{
		{
			name: "eTP Local: ready local endpoint", svc: nodePortService(withExternalLocal()), slices: clusterReady, node: "node-a",
			wantCluster: []*pb.Endpoint{ready("10.0.0.1", 8080), ready("10.0.0.3", 8080)},
			wantLocal:   []*pb.Endpoint{ready("10.0.0.1", 8080)},
		},
		{
			name: "eTP Local: terminating local endpoint while the cluster has ready ones", svc: nodePortService(withExternalLocal()), slices: clusterReady, node: "node-b",
			wantCluster: []*pb.Endpoint{ready("10.0.0.1", 8080), ready("10.0.0.3", 8080)},
			wantLocal:   []*pb.Endpoint{servingTerminating("10.0.0.2", 8080)},
		},
		{
			name: "eTP Local: local ready preferred over local terminating", svc: nodePortService(withExternalLocal()), slices: clusterReady, node: "node-c",
			wantCluster: []*pb.Endpoint{ready("10.0.0.1", 8080), ready("10.0.0.3", 8080)},
			wantLocal:   []*pb.Endpoint{ready("10.0.0.3", 8080)},
		},
		{
			name: "eTP Local: only unusable local endpoints", svc: nodePortService(withExternalLocal()), slices: clusterReady, node: "node-d",
			wantCluster: []*pb.Endpoint{ready("10.0.0.1", 8080), ready("10.0.0.3", 8080)},
		},
		{
			name: "eTP Local: no local endpoints", svc: nodePortService(withExternalLocal()), slices: clusterReady, node: "node-e",
			wantCluster: []*pb.Endpoint{ready("10.0.0.1", 8080), ready("10.0.0.3", 8080)},
		},
		{
			name: "eTP Local: both sets fall back", svc: nodePortService(withExternalLocal()), slices: noneReady, node: "node-c",
			wantCluster: []*pb.Endpoint{servingTerminating("10.0.0.2", 8080), servingTerminating("10.0.0.4", 8080)},
			wantLocal:   []*pb.Endpoint{servingTerminating("10.0.0.4", 8080)},
		},
		{
			name: "iTP Local: terminating local endpoint", svc: newService(withInternalLocal()), slices: clusterReady, node: "node-b",
			wantLocal: []*pb.Endpoint{servingTerminating("10.0.0.2", 8080)},
		},
		{
			name: "iTP Local: ready local endpoint", svc: newService(withInternalLocal()), slices: clusterReady, node: "node-c",
			wantLocal: []*pb.Endpoint{ready("10.0.0.3", 8080)},
		},
		{
			name: "iTP Local: nothing usable here", svc: newService(withInternalLocal()), slices: clusterReady, node: "node-d",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := viewFor(t, mustBuild(t, tt.svc, tt.slices...), testNode(tt.node, ""))
			want := &pb.Service{}
			if tt.wantCluster != nil {
				want.ClusterEndpoints = []*pb.PortEndpoints{wantPort("http", tt.wantCluster...)}
			}
			if tt.wantLocal != nil {
				want.LocalEndpoints = []*pb.PortEndpoints{wantPort("http", tt.wantLocal...)}
			}
			checkProto(t, "endpoints", &pb.Service{ClusterEndpoints: got.ClusterEndpoints, LocalEndpoints: got.LocalEndpoints}, want)
			if !got.Ports[0].HasEndpoints {
				t.Errorf("has_endpoints = false, want true: the cluster has usable endpoints")
			}
		})
	}
}

func TestTopology(t *testing.T) {
	// Endpoint IPs by zone: 10.0.1.x in zone-a, 10.0.2.x in zone-b,
	// 10.0.3.x in zone-c.
	http := func(eps ...discoveryv1.Endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{httpSlice("web-a", eps...)}
	}
	tests := []struct {
		name        string
		svc         *corev1.Service // newService() when nil
		slices      []*discoveryv1.EndpointSlice
		node        *Node
		wantCluster map[string][]string // port name -> IPs
		wantLocal   map[string][]string
	}{
		{
			name:        "zone hints select the node's zone",
			slices:      http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.1.2", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.1.2"}},
		},
		{
			name:        "endpoint hinted for several zones",
			slices:      http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b", "zone-a"))),
			node:        testNode("node-1", "zone-b"),
			wantCluster: map[string][]string{"http": {"10.0.2.1"}},
		},
		{
			name:        "one ready endpoint without hints disables topology",
			slices:      http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1")),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name:        "zone that no hint names gets every endpoint",
			slices:      http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
			node:        testNode("node-1", "zone-c"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name:        "node without a zone label gets every endpoint",
			slices:      http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
			node:        testNode("node-1", ""),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name:        "unregistered node gets every endpoint",
			slices:      http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
			node:        BuildNode("node-1", nil),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name: "not-ready endpoint without hints does not disable topology",
			slices: http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b")),
				ep("10.0.3.1", notReady())),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}},
		},
		{
			name: "serving-terminating endpoint without hints does not disable topology",
			slices: http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b")),
				ep("10.0.3.1", terminating(true))),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}},
		},
		{
			name: "zone named only by a not-ready endpoint gets every ready endpoint",
			slices: http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b")),
				ep("10.0.3.1", forZones("zone-c"), notReady())),
			node:        testNode("node-1", "zone-c"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name: "terminating fallback ignores hints",
			slices: http(ep("10.0.1.1", forZones("zone-a"), terminating(true)),
				ep("10.0.2.1", forZones("zone-b"), terminating(true))),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name: "node hints win over zone hints",
			slices: http(ep("10.0.1.1", forZones("zone-a"), forNodes("node-1")),
				ep("10.0.1.2", forZones("zone-a"), forNodes("node-2")),
				ep("10.0.2.1", forZones("zone-b"), forNodes("node-3"))),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}},
		},
		{
			name: "node hints for other nodes: zone hints apply",
			slices: http(ep("10.0.1.1", forZones("zone-a"), forNodes("node-1")),
				ep("10.0.1.2", forZones("zone-a"), forNodes("node-2")),
				ep("10.0.2.1", forZones("zone-b"), forNodes("node-3"))),
			node:        testNode("node-4", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.1.2"}},
		},
		{
			name: "node hints on some ready endpoints only: zone hints apply",
			slices: http(ep("10.0.1.1", forZones("zone-a"), forNodes("node-1")),
				ep("10.0.1.2", forZones("zone-a")),
				ep("10.0.2.1", forZones("zone-b"), forNodes("node-3"))),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.1.2"}},
		},
		{
			name:        "node hints without zone hints",
			slices:      http(ep("10.0.1.1", forNodes("node-1")), ep("10.0.2.1", forNodes("node-2"))),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}},
		},
		{
			name:        "node hints without zone hints, unnamed node",
			slices:      http(ep("10.0.1.1", forNodes("node-1")), ep("10.0.2.1", forNodes("node-2"))),
			node:        testNode("node-3", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name: "node named only by a not-ready endpoint: zone hints apply",
			slices: http(ep("10.0.1.1", forZones("zone-a"), forNodes("node-2")),
				ep("10.0.1.2", forZones("zone-a"), forNodes("node-1"), notReady()),
				ep("10.0.2.1", forZones("zone-b"), forNodes("node-3"))),
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}},
		},
		{
			name: "topology is per port",
			svc:  newService(withPorts(svcPort("http", corev1.ProtocolTCP, 80, 0), svcPort("metrics", corev1.ProtocolTCP, 9090, 0))),
			slices: []*discoveryv1.EndpointSlice{
				httpSlice("web-a", ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
				newSlice("web-b", discoveryv1.AddressTypeIPv4,
					[]discoveryv1.EndpointPort{slicePort(ptr("metrics"), ptr(corev1.ProtocolTCP), 9090)},
					ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1")),
			},
			node:        testNode("node-1", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}, "metrics": {"10.0.1.1", "10.0.2.1"}},
		},
		{
			name: "no topology for the local set (iTP Local)",
			svc:  newService(withInternalLocal()),
			slices: http(ep("10.0.1.1", onNode("node-1"), forZones("zone-b")),
				ep("10.0.2.1", onNode("node-2"), forZones("zone-a"))),
			node:      testNode("node-1", "zone-a"),
			wantLocal: map[string][]string{"http": {"10.0.1.1"}},
		},
		{
			name: "eTP Local: cluster set uses topology, local set does not",
			svc:  nodePortService(withExternalLocal()),
			slices: http(ep("10.0.1.1", onNode("node-1"), forZones("zone-a")),
				ep("10.0.2.1", onNode("node-2"), forZones("zone-b"))),
			node:        testNode("node-2", "zone-a"),
			wantCluster: map[string][]string{"http": {"10.0.1.1"}},
			wantLocal:   map[string][]string{"http": {"10.0.2.1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.svc
			if svc == nil {
				svc = newService()
			}
			s := mustBuild(t, svc, tt.slices...)
			got := viewFor(t, s, tt.node)
			checkIPs(t, "cluster_endpoints", got.ClusterEndpoints, tt.wantCluster)
			checkIPs(t, "local_endpoints", got.LocalEndpoints, tt.wantLocal)
		})
	}
}

// checkIPs compares the endpoint IPs of lists, by port, with want.
func checkIPs(t *testing.T, what string, lists []*pb.PortEndpoints, want map[string][]string) {
	t.Helper()
	if len(lists) != len(want) {
		t.Errorf("%s: got %d ports, want %d: %v", what, len(lists), len(want), lists)
	}
	for port, ips := range want {
		if got := ipsOf(lists, port); !slices.Equal(got, ips) {
			t.Errorf("%s[%q] = %v, want %v", what, port, got, ips)
		}
	}
}

// TestTrafficPolicies checks which sets a Service uses (upstream's
// UsesClusterEndpoints and UsesLocalEndpoints) on a node that hosts an
// endpoint (node-a) and one that does not (node-b).
func TestTrafficPolicies(t *testing.T) {
	eps := func(ports []discoveryv1.EndpointPort) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{newSlice("web-a", discoveryv1.AddressTypeIPv4, ports,
			ep("10.0.0.1", onNode("node-a")), ep("10.0.0.2", onNode("node-c")))}
	}
	both := []string{"10.0.0.1", "10.0.0.2"}
	twoPorts := []discoveryv1.EndpointPort{
		slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8080),
		slicePort(ptr("admin"), ptr(corev1.ProtocolTCP), 8081),
	}
	lbNoNodePorts := func(opts ...svcOpt) *corev1.Service {
		return newService(append([]svcOpt{
			withType(corev1.ServiceTypeLoadBalancer),
			func(s *corev1.Service) { s.Spec.AllocateLoadBalancerNodePorts = ptr(false) },
		}, opts...)...)
	}
	tests := []struct {
		name        string
		svc         *corev1.Service
		slices      []*discoveryv1.EndpointSlice // eps(httpPort()) when nil
		wantUniform bool
		wantCluster map[string][]string // on every node
		wantLocalA  map[string][]string // on node-a; node-b has none
	}{
		{
			name:        "Cluster policies",
			svc:         nodePortService(),
			wantUniform: true,
			wantCluster: map[string][]string{"http": both},
		},
		{
			name:        "eTP Local on NodePort: cluster endpoints kept for short-circuiting",
			svc:         nodePortService(withExternalLocal()),
			wantCluster: map[string][]string{"http": both},
			wantLocalA:  map[string][]string{"http": {"10.0.0.1"}},
		},
		{
			name:        "eTP Local on LoadBalancer reached through its ingress IP",
			svc:         lbNoNodePorts(withExternalLocal(), withIngress(corev1.LoadBalancerIngress{IP: "198.51.100.1"})),
			wantCluster: map[string][]string{"http": both},
			wantLocalA:  map[string][]string{"http": {"10.0.0.1"}},
		},
		{
			name: "eTP Local on LoadBalancer with only a Proxy-mode ingress and no node port",
			svc: lbNoNodePorts(withExternalLocal(), withIngress(corev1.LoadBalancerIngress{
				IP: "198.51.100.1", IPMode: ptr(corev1.LoadBalancerIPModeProxy),
			})),
			wantUniform: true,
			wantCluster: map[string][]string{"http": both},
		},
		{
			name:        "eTP Local on ClusterIP with externalIPs",
			svc:         newService(withExternalLocal(), withExternalIPs("192.0.2.1")),
			wantCluster: map[string][]string{"http": both},
			wantLocalA:  map[string][]string{"http": {"10.0.0.1"}},
		},
		{
			name:        "eTP Local ignored on ClusterIP without externalIPs",
			svc:         newService(withExternalLocal()),
			wantUniform: true,
			wantCluster: map[string][]string{"http": both},
		},
		{
			name:       "iTP Local on ClusterIP: no cluster endpoints",
			svc:        newService(withInternalLocal()),
			wantLocalA: map[string][]string{"http": {"10.0.0.1"}},
		},
		{
			name:        "iTP Local on NodePort: cluster endpoints kept for the node port",
			svc:         nodePortService(withInternalLocal()),
			wantCluster: map[string][]string{"http": both},
			wantLocalA:  map[string][]string{"http": {"10.0.0.1"}},
		},
		{
			name:        "iTP Local on ClusterIP with externalIPs: cluster endpoints kept",
			svc:         newService(withInternalLocal(), withExternalIPs("192.0.2.1")),
			wantCluster: map[string][]string{"http": both},
			wantLocalA:  map[string][]string{"http": {"10.0.0.1"}},
		},
		{
			name: "iTP Local decided per port by its node port",
			svc: lbNoNodePorts(withInternalLocal(), withPorts(
				svcPort("http", corev1.ProtocolTCP, 80, 0),
				svcPort("admin", corev1.ProtocolTCP, 81, 30081),
			)),
			slices:      eps(twoPorts),
			wantCluster: map[string][]string{"admin": both},
			wantLocalA:  map[string][]string{"http": {"10.0.0.1"}, "admin": {"10.0.0.1"}},
		},
		{
			name: "eTP Local decided per port by its node port",
			svc: lbNoNodePorts(withExternalLocal(), withPorts(
				svcPort("http", corev1.ProtocolTCP, 80, 0),
				svcPort("admin", corev1.ProtocolTCP, 81, 30081),
			)),
			slices:      eps(twoPorts),
			wantCluster: map[string][]string{"http": both, "admin": both},
			wantLocalA:  map[string][]string{"admin": {"10.0.0.1"}},
		},
		{
			name:        "eTP Local with endpoints on no named node",
			svc:         nodePortService(withExternalLocal()),
			slices:      []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1"), ep("10.0.0.2"))},
			wantUniform: true,
			wantCluster: map[string][]string{"http": both},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sl := tt.slices
			if sl == nil {
				sl = eps(httpPort())
			}
			s := mustBuild(t, tt.svc, sl...)
			if got := s.Uniform(); got != tt.wantUniform {
				t.Errorf("Uniform() = %v, want %v", got, tt.wantUniform)
			}
			a := viewFor(t, s, testNode("node-a", ""))
			b := viewFor(t, s, testNode("node-b", ""))
			checkIPs(t, "node-a cluster_endpoints", a.ClusterEndpoints, tt.wantCluster)
			checkIPs(t, "node-b cluster_endpoints", b.ClusterEndpoints, tt.wantCluster)
			checkIPs(t, "node-a local_endpoints", a.LocalEndpoints, tt.wantLocalA)
			checkIPs(t, "node-b local_endpoints", b.LocalEndpoints, nil)
			for _, p := range b.Ports {
				if !p.HasEndpoints {
					t.Errorf("node-b port %q: has_endpoints = false, want true", p.Name)
				}
			}
		})
	}
}

func TestSharing(t *testing.T) {
	zoned := mustBuild(t, newService(), httpSlice("web-a",
		ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))))
	local := mustBuild(t, nodePortService(withExternalLocal()), httpSlice("web-a",
		ep("10.0.0.1", onNode("node-a")), ep("10.0.0.2", onNode("node-c"))))
	uniform := mustBuild(t, newService(), httpSlice("web-a", ep("10.0.0.1", onNode("node-a"))))
	nodeHinted := mustBuild(t, newService(), httpSlice("web-a",
		ep("10.0.1.1", forZones("zone-a"), forNodes("node-1")), ep("10.0.1.2", forZones("zone-a"), forNodes("node-2"))))

	tests := []struct {
		name       string
		svc        *Service
		a, b       *Node
		wantShared bool // same *Part for the shared part, and same hash
		wantLocal  bool // same *Part for the local part
	}{
		{
			name: "same zone, zone hints", svc: zoned,
			a: testNode("node-1", "zone-a"), b: testNode("node-2", "zone-a"),
			wantShared: true, wantLocal: true,
		},
		{
			name: "different zones, zone hints", svc: zoned,
			a: testNode("node-1", "zone-a"), b: testNode("node-2", "zone-b"),
			wantLocal: true,
		},
		{
			name: "unhinted zone and no zone share the default class", svc: zoned,
			a: testNode("node-1", "zone-c"), b: testNode("node-2", ""),
			wantShared: true, wantLocal: true,
		},
		{
			name: "same node twice, distinct Node objects", svc: zoned,
			a: testNode("node-1", "zone-a"), b: testNode("node-1", "zone-a"),
			wantShared: true, wantLocal: true,
		},
		{
			name: "eTP Local: two nodes without local endpoints", svc: local,
			a: testNode("node-b", ""), b: testNode("node-d", ""),
			wantShared: true, wantLocal: true,
		},
		{
			name: "eTP Local: hosting and non-hosting node share the shared part", svc: local,
			a: testNode("node-a", ""), b: testNode("node-b", ""),
			wantShared: true,
		},
		{
			name: "eTP Local: two hosting nodes", svc: local,
			a: testNode("node-a", ""), b: testNode("node-c", ""),
			wantShared: true,
		},
		{
			name: "uniform service", svc: uniform,
			a: testNode("node-a", "zone-a"), b: testNode("node-z", ""),
			wantShared: true, wantLocal: true,
		},
		{
			name: "node hints: named node has its own view", svc: nodeHinted,
			a: testNode("node-1", "zone-a"), b: testNode("node-2", "zone-a"),
			wantLocal: true,
		},
		{
			name: "node hints: unnamed nodes of a zone share", svc: nodeHinted,
			a: testNode("node-3", "zone-a"), b: testNode("node-4", "zone-a"),
			wantShared: true, wantLocal: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ea, eb := tt.svc.EntryFor(tt.a), tt.svc.EntryFor(tt.b)
			if got := ea.Shared == eb.Shared; got != tt.wantShared {
				t.Errorf("shared parts identical = %v, want %v", got, tt.wantShared)
			}
			if got := ea.Local == eb.Local; got != tt.wantLocal {
				t.Errorf("local parts identical = %v, want %v", got, tt.wantLocal)
			}
			wantSameHash := tt.wantShared && tt.wantLocal
			if got := ea.Hash == eb.Hash; got != wantSameHash {
				t.Errorf("entry hashes equal = %v (%x, %x), want %v", got, ea.Hash, eb.Hash, wantSameHash)
			}
			if got := proto.Equal(decode(t, ea), decode(t, eb)); got != wantSameHash {
				t.Errorf("decoded views equal = %v, want %v", got, wantSameHash)
			}
			// Asking again returns the memoised parts.
			if again := tt.svc.EntryFor(tt.a); again != ea {
				t.Errorf("second EntryFor(%s) = %+v, want the first %+v", tt.a.Name, again, ea)
			}
		})
	}
}

func TestUniformEntry(t *testing.T) {
	s := mustBuild(t, newService(), httpSlice("web-a", ep("10.0.0.1", onNode("node-a"), forZones("zone-a"))), httpSlice("web-b", ep("10.0.0.2")))
	if !s.Uniform() {
		t.Fatal("Uniform() = false, want true: one ready endpoint has no hints")
	}
	first := s.EntryFor(testNode("node-a", "zone-a"))
	for i := range 20 {
		n := testNode(fmt.Sprintf("node-%d", i), fmt.Sprintf("zone-%d", i%3))
		if got := s.EntryFor(n); got != first {
			t.Errorf("EntryFor(%s) = %+v, want %+v", n.Name, got, first)
		}
	}
	if first.Local.Bytes != nil || first.Local.Hash != xxhash.Sum64(nil) {
		t.Errorf("uniform entry has a non-empty local part %+v", first.Local)
	}
}

// TestEntryEncoding checks the parts and hashes of an entry.
func TestEntryEncoding(t *testing.T) {
	s := mustBuild(t, nodePortService(withExternalLocal()), httpSlice("web-a",
		ep("10.0.0.1", onNode("node-a")), ep("10.0.0.2", onNode("node-c"))))
	for _, name := range []string{"node-a", "node-b"} {
		t.Run(name, func(t *testing.T) {
			e := s.EntryFor(testNode(name, ""))
			if got, want := e.Size(), len(e.Shared.Bytes)+len(e.Local.Bytes); got != want {
				t.Errorf("Size() = %d, want %d", got, want)
			}
			for what, p := range map[string]*Part{"shared": e.Shared, "local": e.Local} {
				if got := xxhash.Sum64(p.Bytes); got != p.Hash {
					t.Errorf("%s part hash = %x, want xxhash of its bytes %x", what, p.Hash, got)
				}
			}
			if got := entryHash(s.Key, e.Shared.Hash, e.Local.Hash); got != e.Hash {
				t.Errorf("entry hash = %x, want %x", e.Hash, got)
			}

			// The shared part holds everything but local_endpoints, and the
			// local part only local_endpoints.
			var shared, loc pb.Service
			if err := proto.Unmarshal(e.Shared.Bytes, &shared); err != nil {
				t.Fatal(err)
			}
			if err := proto.Unmarshal(e.Local.Bytes, &loc); err != nil {
				t.Fatal(err)
			}
			if len(shared.LocalEndpoints) != 0 {
				t.Errorf("shared part has local_endpoints %v", shared.LocalEndpoints)
			}
			whole := decode(t, e)
			checkProto(t, "local part", &loc, &pb.Service{LocalEndpoints: whole.LocalEndpoints})
			whole.LocalEndpoints = nil
			checkProto(t, "shared part", &shared, whole)
		})
	}
	// The same content under another key is another entry.
	other := mustBuild(t, nodePortService(withExternalLocal(), func(svc *corev1.Service) { svc.Namespace = "other" }),
		httpSlice("web-a", ep("10.0.0.1", onNode("node-a"))))
	if s.EntryFor(testNode("node-b", "")).Hash == other.EntryFor(testNode("node-b", "")).Hash {
		t.Error("entries of two Services have the same hash")
	}
}

// TestEntryForConcurrent lets the race detector watch concurrent first
// uses of a Service's memo, and checks that every node of a class still
// gets the same parts.
func TestEntryForConcurrent(t *testing.T) {
	s := mustBuild(t, nodePortService(withExternalLocal()), httpSlice("web-a",
		ep("10.0.1.1", onNode("node-0"), forZones("zone-0")),
		ep("10.0.1.2", onNode("node-1"), forZones("zone-1")),
		ep("10.0.1.3", onNode("node-2"), forZones("zone-2")),
	))
	const nodes = 60
	got := make([]Entry, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			got[i] = s.EntryFor(testNode(fmt.Sprintf("node-%d", i), fmt.Sprintf("zone-%d", i%3)))
		})
	}
	wg.Wait()
	for i := range nodes {
		if want := got[i%3]; got[i].Shared != want.Shared {
			t.Errorf("node-%d and node-%d (same zone) have different shared parts", i, i%3)
		}
		if i >= 3 && got[i].Local != got[3].Local {
			t.Errorf("node-%d and node-3 (no local endpoints) have different local parts", i)
		}
	}
	for i := range 3 {
		for j := range i {
			if got[i].Hash == got[j].Hash {
				t.Errorf("node-%d and node-%d (different zones, own endpoints) have the same hash", i, j)
			}
		}
	}
}
