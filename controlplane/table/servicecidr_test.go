package table

import (
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// serviceCIDRs builds the cluster's service CIDRs from one object.
func serviceCIDRs(cidrs ...string) *compute.ServiceCIDRs {
	return compute.BuildServiceCIDRs([]*networkingv1.ServiceCIDR{{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
	}})
}

// TestStoreServiceCIDRs checks that the service CIDRs reach every agent,
// of a known node or not, as a delta carrying the node alone, and that
// nodes published later carry them too.
func TestStoreServiceCIDRs(t *testing.T) {
	s := NewStore(testMaxPending)
	s.Publish(services(simpleService(t, "a", "10.96.0.10")), nodes(buildNode(t, "n1", "a")))
	known := connect(t, s, "n1", Held{}, true, testMaxPending)
	known.sync()
	unknown := connect(t, s, "ghost", Held{}, true, testMaxPending)
	unknown.sync()

	want := []string{"10.96.0.0/16", "fd00:96::/112"}
	if gs, gn := s.Apply(Update{ServiceCIDRs: serviceCIDRs("fd00:96::/112", "10.96.0.0/16"), SetServiceCIDRs: true}); gs != 0 || gn != 1 {
		t.Errorf("Apply(CIDRs) changed %d services and %d nodes, want 0 and 1", gs, gn)
	}
	for _, p := range []*peer{known, unknown} {
		r := p.next()
		d := decodeDelta(t, r)
		if !slices.Equal(d.GetNode().GetServiceCidrs(), want) || r.Upserts != 0 || r.Removals != 0 {
			t.Errorf("%s: node %v, %d upserts, %d removals; want the node alone with service CIDRs %v",
				p.node, d.GetNode(), r.Upserts, r.Removals, want)
		}
		if n := s.Current().Node(p.node); d.GetNode().GetHash() != n.Hash {
			t.Errorf("%s: node hash %016x, want %016x", p.node, d.GetNode().GetHash(), n.Hash)
		}
		p.ack(r)
		checkAgentCurrent(t, &p.agent, s.Current(), p.node)
	}

	// The same CIDRs again change nothing and wake nobody.
	sub := s.Subscribe()
	if gs, gn := s.Apply(Update{ServiceCIDRs: serviceCIDRs("10.96.0.0/16", "fd00:96::/112"), SetServiceCIDRs: true}); gs != 0 || gn != 0 {
		t.Errorf("Apply(same CIDRs) changed %d services and %d nodes, want nothing", gs, gn)
	}
	if woken(sub) {
		t.Error("Apply(same CIDRs) woke subscribers")
	}

	// A node published afterwards, and Publish, which leaves the CIDRs
	// alone, keep them.
	s.Publish(nil, nodes(buildNode(t, "n1", "b"), buildNode(t, "n2", "b")))
	for _, name := range []string{"n1", "n2", "ghost"} {
		if got := s.Current().Node(name).ServiceCIDRs().List(); !slices.Equal(got, want) {
			t.Errorf("node %s after a node publish: service CIDRs %v, want %v", name, got, want)
		}
	}
	known.sync()
	checkAgentCurrent(t, &known.agent, s.Current(), "n1")

	// Clearing them reaches the agents too.
	s.Apply(Update{SetServiceCIDRs: true})
	r := known.next()
	if d := decodeDelta(t, r); d.GetNode() == nil || len(d.GetNode().GetServiceCidrs()) != 0 {
		t.Errorf("after clearing: node %v, want one without service CIDRs", d.GetNode())
	}
}
