package compute

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestUDPServingEndpoints checks udp_serving_endpoints, which stale UDP
// conntrack cleanup reads: every serving endpoint of a UDP port, on every
// node, whenever the node's endpoint sets leave one out, as upstream's
// CleanStaleEntries keeps flows to any of them.
func TestUDPServingEndpoints(t *testing.T) {
	dns := func(opts ...svcOpt) *corev1.Service {
		return newService(append([]svcOpt{withPorts(
			svcPort("http", corev1.ProtocolTCP, 80, 0),
			svcPort("dns", corev1.ProtocolUDP, 53, 0),
		)}, opts...)...)
	}
	ports := []discoveryv1.EndpointPort{
		slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8080),
		slicePort(ptr("dns"), ptr(corev1.ProtocolUDP), 5353),
	}
	slice := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return newSlice("web-a", discoveryv1.AddressTypeIPv4, ports, eps...)
	}
	tests := []struct {
		name  string
		svc   *corev1.Service
		slice *discoveryv1.EndpointSlice
		node  *Node
		want  []string // IPs of dns's serving endpoints; nil: no entry
	}{
		{
			name:  "every serving endpoint used: none sent",
			svc:   dns(),
			slice: slice(ep("10.0.1.1"), ep("10.0.2.1"), ep("10.0.3.1", notReady())),
			node:  testNode("node-1", "zone-a"),
		},
		{
			name:  "no endpoints: none sent",
			svc:   dns(),
			slice: slice(),
			node:  testNode("node-1", "zone-a"),
		},
		{
			name:  "zone hints leave the other zone out: all sent",
			svc:   dns(),
			slice: slice(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b")), ep("10.0.3.1", notReady())),
			node:  testNode("node-1", "zone-a"),
			want:  []string{"10.0.1.1", "10.0.2.1"},
		},
		{
			name:  "serving terminating beside ready ones: all serving sent",
			svc:   dns(),
			slice: slice(ep("10.0.1.1"), ep("10.0.2.1", terminating(true)), ep("10.0.3.1", terminating(false))),
			node:  testNode("node-1", "zone-a"),
			want:  []string{"10.0.1.1", "10.0.2.1"},
		},
		{
			name:  "internalTrafficPolicy Local: all sent, to every node",
			svc:   dns(withInternalLocal()),
			slice: slice(ep("10.0.1.1", onNode("node-1")), ep("10.0.2.1", onNode("node-2"))),
			node:  testNode("node-3", "zone-a"),
			want:  []string{"10.0.1.1", "10.0.2.1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := viewFor(t, mustBuild(t, tc.svc, tc.slice), tc.node)
			if ips := ipsOf(got.GetUdpServingEndpoints(), "dns"); !slices.Equal(ips, tc.want) {
				t.Errorf("udp_serving_endpoints of dns: %v, want %v", ips, tc.want)
			}
			// Only UDP ports: TCP flows are never cleaned.
			if ips := ipsOf(got.GetUdpServingEndpoints(), "http"); ips != nil {
				t.Errorf("udp_serving_endpoints of the TCP port: %v, want none", ips)
			}
		})
	}
}
