package plan_test

import (
	"net/netip"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

// TestPortDecisions pins the per-port decisions on the feature cases'
// Services, the ones every dataplane's goldens and flows rest on.
func TestPortDecisions(t *testing.T) {
	type decisions struct {
		usesCluster, usesLocal, has, hasInternal, hasExternal, usesExternal, firewall bool
		cluster, local                                                                int
	}
	lbNoRanges := dptest.LBSourceRanges()
	lbNoRanges.LoadBalancerSourceRanges = []string{"2001:db8::/32"} // none of IPv4: fails closed
	for _, tt := range []struct {
		name   string
		svc    *pb.Service
		family dataplane.Family
		want   decisions
	}{
		{
			"ClusterIP", dptest.ClusterIPTwoEndpoints(), dataplane.IPv4,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, cluster: 2},
		},
		{
			"no endpoints", dptest.NoEndpointsService(), dataplane.IPv4,
			decisions{usesCluster: true},
		},
		{
			"eTP Local", dptest.ETPLocal(true), dataplane.IPv4,
			decisions{usesCluster: true, usesLocal: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, cluster: 2, local: 1},
		},
		{
			"eTP Local, no local endpoint: external traffic still handled", dptest.ETPLocal(false), dataplane.IPv4,
			decisions{usesCluster: true, usesLocal: true, has: true, hasInternal: true, usesExternal: true, cluster: 2},
		},
		{
			"iTP Local without external traffic: no Cluster set", dptest.ITPLocal(true), dataplane.IPv4,
			decisions{usesLocal: true, has: true, hasInternal: true, hasExternal: true, local: 1},
		},
		{
			"iTP Local, no local endpoint: DROP, not REJECT", dptest.ITPLocal(false), dataplane.IPv4,
			decisions{usesLocal: true, has: true, hasExternal: true},
		},
		{
			"dual stack, IPv6 endpoints only", dptest.DualStackService(), dataplane.IPv6,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, cluster: 2},
		},
		{
			"source ranges", dptest.LBSourceRanges(), dataplane.IPv4,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, firewall: true, cluster: 1},
		},
		{
			"source ranges of the other family", lbNoRanges, dataplane.IPv4,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, firewall: true, cluster: 1},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, ok := plan.Of(dptest.Entry(tt.svc), tt.family)
			if !ok {
				t.Fatal("not planned")
			}
			p := s.Ports[0]
			got := decisions{
				p.UsesClusterEndpoints, p.UsesLocalEndpoints, p.HasEndpoints, p.HasInternalEndpoints, p.HasExternalEndpoints,
				p.UsesExternal, p.UsesFirewall, len(p.Cluster), len(p.Local),
			}
			if got != tt.want {
				t.Errorf("decisions %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestDualStackWithoutEndpointsOfTheFamily checks that has_endpoints,
// which covers both families, gives way to an empty Cluster set: no
// endpoint of this family means REJECT here.
func TestDualStackWithoutEndpointsOfTheFamily(t *testing.T) {
	svc := dptest.DualStackService()
	svc.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", "[fd00:244:1::10]:8080")}
	s, ok := plan.Of(dptest.Entry(svc), dataplane.IPv4)
	if !ok || s.ClusterIP != netip.MustParseAddr("10.96.0.100") {
		t.Fatalf("plan %+v, %v", s, ok)
	}
	if p := s.Ports[0]; p.HasEndpoints || p.UsesExternal || p.Name != "ns/dual:http" {
		t.Errorf("port %+v, want no endpoints and no external handling", p)
	}
	if _, ok := plan.Of(dptest.Entry(dptest.ClusterIPTwoEndpoints()), dataplane.IPv6); ok {
		t.Errorf("an IPv4-only Service planned for IPv6")
	}
}
