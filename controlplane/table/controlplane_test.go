package table

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// controlPlaneAddresses builds the control plane addresses of ready
// replicas at ips, port 9640.
func controlPlaneAddresses(ips ...string) *compute.ControlPlaneAddresses {
	name, port, tcp := compute.ControlPlanePortName, int32(9640), corev1.ProtocolTCP
	s := &discoveryv1.EndpointSlice{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &tcp}},
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}})
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "proxyplane-system", Name: "proxyplane-controlplane"}}
	return compute.BuildControlPlaneAddresses(svc, []*discoveryv1.EndpointSlice{s}, name)
}

// TestStoreControlPlaneAddresses checks that the control plane addresses
// reach every agent, of a known node or not, as a delta carrying the node
// alone, that they survive node publishes and service CIDR changes, and
// that replacing a replica reaches the agents again.
func TestStoreControlPlaneAddresses(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.96.0.10")), nodes(buildNode(t, "n1", "a")))
	known := connect(t, s, "n1", Held{}, true, testMaxPending)
	known.sync()
	unknown := connect(t, s, "ghost", Held{}, true, testMaxPending)
	unknown.sync()

	want := []string{"192.168.0.10:9640", "192.168.0.11:9640"}
	if gs, gn := s.Apply(Update{ControlPlaneAddresses: controlPlaneAddresses("192.168.0.11", "192.168.0.10"), SetControlPlaneAddresses: true}); gs != 0 || gn != 1 {
		t.Errorf("Apply(addresses) changed %d services and %d nodes, want 0 and 1", gs, gn)
	}
	for _, p := range []*peer{known, unknown} {
		r := p.next()
		d := decodeDelta(t, r)
		if !slices.Equal(d.GetNode().GetControlPlaneAddresses(), want) || r.Upserts != 0 || r.Removals != 0 {
			t.Errorf("%s: node %v, %d upserts, %d removals; want the node alone with control plane addresses %v",
				p.node, d.GetNode(), r.Upserts, r.Removals, want)
		}
		p.ack(r)
		checkAgentCurrent(t, &p.agent, s.Current(), p.node)
	}

	// The same addresses again change nothing and wake nobody.
	sub := s.Subscribe()
	if gs, gn := s.Apply(Update{ControlPlaneAddresses: controlPlaneAddresses("192.168.0.10", "192.168.0.11"), SetControlPlaneAddresses: true}); gs != 0 || gn != 0 {
		t.Errorf("Apply(same addresses) changed %d services and %d nodes, want nothing", gs, gn)
	}
	if woken(sub) {
		t.Error("Apply(same addresses) woke subscribers")
	}

	// Node publishes and service CIDR changes keep them.
	s.Publish(nil, nodes(buildNode(t, "n1", "b"), buildNode(t, "n2", "b")))
	s.Apply(Update{ServiceCIDRs: serviceCIDRs("10.96.0.0/16"), SetServiceCIDRs: true})
	for _, name := range []string{"n1", "n2", "ghost"} {
		if got := s.Current().Node(name).ControlPlaneAddresses().List(); !slices.Equal(got, want) {
			t.Errorf("node %s: control plane addresses %v, want %v", name, got, want)
		}
	}
	known.sync()
	checkAgentCurrent(t, &known.agent, s.Current(), "n1")

	// A replica replaced on another machine reaches the agents.
	s.Apply(Update{ControlPlaneAddresses: controlPlaneAddresses("192.168.0.10", "192.168.0.12"), SetControlPlaneAddresses: true})
	r := known.next()
	if d := decodeDelta(t, r); !slices.Equal(d.GetNode().GetControlPlaneAddresses(), []string{"192.168.0.10:9640", "192.168.0.12:9640"}) {
		t.Errorf("after a replacement: node %v", d.GetNode())
	}
}
