package nftables

import (
	"context"
	"slices"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// serviceCIDRNode is dptest.Node carrying dual-stack service CIDRs.
func serviceCIDRNode() *pb.NodeInfo {
	n := dptest.Node()
	n.ServiceCidrs = []string{"10.96.0.0/16", "fd00:96::/112"}
	return n
}

// TestServiceCIDRs checks the drop of traffic to the service CIDRs that no
// ClusterIP of the table holds: the ruleset per family (goldens
// service-cidrs-ipv4 and -ipv6, each with its family's CIDR only), and
// the packets that it drops and those it leaves alone.
func TestServiceCIDRs(t *testing.T) {
	type flow struct {
		name string
		flow dptest.Flow
		want []dptest.Outcome
	}
	v4 := []flow{
		{"unallocated address", dptest.Flow{Src: dptest.LocalPod, Dst: "10.96.5.5", Proto: "tcp", DPort: 80}, dptest.Refused("DROP")},
		{"node to an unallocated address", dptest.Flow{Src: dptest.NodeIP, Dst: "10.96.5.5", Proto: "udp", DPort: 53, FromNode: true}, dptest.Refused("DROP")},
		// A ClusterIP on a port the Service lacks is still rejected:
		// the reject rule comes first, as upstream's.
		{"ClusterIP other port", dptest.Flow{Src: dptest.LocalPod, Dst: "10.96.0.10", Proto: "tcp", DPort: 81}, dptest.Refused("REJECT")},
		{"ClusterIP", dptest.Flow{Src: dptest.Client, Dst: "10.96.0.10", Proto: "tcp", DPort: 80}, dptest.Accepted(true, dptest.LocalEP+":8080", dptest.RemoteEP+":8080")},
		{"outside the service CIDRs", dptest.Flow{Src: dptest.LocalPod, Dst: "10.97.0.1", Proto: "tcp", DPort: 80}, dptest.Accepted(false)},
		{"node outside the service CIDRs", dptest.Flow{Src: dptest.NodeIP, Dst: "10.97.0.1", Proto: "tcp", DPort: 80, FromNode: true}, dptest.Accepted(false)},
	}
	v6 := []flow{
		{"unallocated address", dptest.Flow{Src: "fd00:244:1::5", Dst: "fd00:96::99", Proto: "tcp", DPort: 80}, dptest.Refused("DROP")},
		{"outside the service CIDRs", dptest.Flow{Src: "fd00:244:1::5", Dst: "fd00:97::1", Proto: "tcp", DPort: 80}, dptest.Accepted(false)},
	}
	for _, tc := range []struct {
		family dataplane.Family
		golden string
		svc    *pb.Service
		flows  []flow
	}{
		{dataplane.IPv4, "service-cidrs-ipv4", dptest.ClusterIPTwoEndpoints(), v4},
		{dataplane.IPv6, "service-cidrs-ipv6", dptest.DualStackService(), v6},
	} {
		t.Run(tc.family.String(), func(t *testing.T) {
			cfg := testConfig(tc.family)
			tbl := dptest.Table(t, serviceCIDRNode(), tc.svc)
			dptest.Golden(t, tc.golden, rulesetText(fullState(tbl, cfg), tc.family), *update)
			k := newFakeKernel(tc.family)
			if err := newTestDataplane(cfg, k).Sync(context.Background(), tbl, nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			tr := newTracer(t, k, dptest.NodeIP, dptest.NodeIP6, "127.0.0.1", "::1")
			for _, f := range tc.flows {
				if got, want := tr.trace(f.flow), dptest.SortOutcomes(slices.Clone(f.want)); !slices.Equal(got, want) {
					t.Errorf("%s: flow %+v:\n got  %v\n want %v", f.name, f.flow, got, want)
				}
			}
		})
	}
}

// TestServiceCIDRChangeIsFull checks that a change of the service CIDRs
// alone, with no Service changed, reaches the kernel: the skeleton is only
// rewritten by full syncs.
func TestServiceCIDRChangeIsFull(t *testing.T) {
	k := newFakeKernel(dataplane.IPv4)
	d := newTestDataplane(testConfig(dataplane.IPv4), k)
	svc := dptest.ClusterIPTwoEndpoints()
	if err := d.Sync(context.Background(), dptest.Table(t, dptest.Node(), svc), nil, true); err != nil {
		t.Fatalf("first Sync: %v", err)
	}
	tr := func() []dptest.Outcome {
		return newTracer(t, k, dptest.NodeIP).trace(dptest.Flow{Src: dptest.LocalPod, Dst: "10.96.5.5", Proto: "tcp", DPort: 80})
	}
	if got := tr(); !slices.Equal(got, dptest.Accepted(false)) {
		t.Fatalf("without service CIDRs: %v, want routed on", got)
	}
	if err := d.Sync(context.Background(), dptest.Table(t, serviceCIDRNode(), svc), nil, false); err != nil {
		t.Fatalf("Sync with service CIDRs: %v", err)
	}
	if got := tr(); !slices.Equal(got, dptest.Refused("DROP")) {
		t.Errorf("after the service CIDRs came: %v, want dropped", got)
	}
}
