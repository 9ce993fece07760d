package plan_test

import (
	"net/netip"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
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
		family plan.Family
		want   decisions
	}{
		{"ClusterIP", dptest.ClusterIPTwoEndpoints(), plan.IPv4,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, cluster: 2}},
		{"no endpoints", dptest.NoEndpointsService(), plan.IPv4,
			decisions{usesCluster: true}},
		{"eTP Local", dptest.ETPLocal(true), plan.IPv4,
			decisions{usesCluster: true, usesLocal: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, cluster: 2, local: 1}},
		{"eTP Local, no local endpoint: external traffic still handled", dptest.ETPLocal(false), plan.IPv4,
			decisions{usesCluster: true, usesLocal: true, has: true, hasInternal: true, usesExternal: true, cluster: 2}},
		{"iTP Local without external traffic: no Cluster set", dptest.ITPLocal(true), plan.IPv4,
			decisions{usesLocal: true, has: true, hasInternal: true, hasExternal: true, local: 1}},
		{"iTP Local, no local endpoint: DROP, not REJECT", dptest.ITPLocal(false), plan.IPv4,
			decisions{usesLocal: true, has: true, hasExternal: true}},
		{"dual stack, IPv6 endpoints only", dptest.DualStackService(), plan.IPv6,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, cluster: 2}},
		{"source ranges", dptest.LBSourceRanges(), plan.IPv4,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, firewall: true, cluster: 1}},
		{"source ranges of the other family", lbNoRanges, plan.IPv4,
			decisions{usesCluster: true, has: true, hasInternal: true, hasExternal: true, usesExternal: true, firewall: true, cluster: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, ok := plan.Of(dptest.Entry(tt.svc), tt.family)
			if !ok {
				t.Fatal("not planned")
			}
			p := s.Ports[0]
			got := decisions{p.UsesClusterEndpoints, p.UsesLocalEndpoints, p.HasEndpoints, p.HasInternalEndpoints, p.HasExternalEndpoints,
				p.UsesExternal, p.UsesFirewall, len(p.Cluster), len(p.Local)}
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
	s, ok := plan.Of(dptest.Entry(svc), plan.IPv4)
	if !ok || s.ClusterIP != netip.MustParseAddr("10.96.0.100") {
		t.Fatalf("plan %+v, %v", s, ok)
	}
	if p := s.Ports[0]; p.HasEndpoints || p.UsesExternal || p.Name != "ns/dual:http" {
		t.Errorf("port %+v, want no endpoints and no external handling", p)
	}
	if _, ok := plan.Of(dptest.Entry(dptest.ClusterIPTwoEndpoints()), plan.IPv6); ok {
		t.Errorf("an IPv4-only Service planned for IPv6")
	}
}

func TestSettings(t *testing.T) {
	s := plan.Settings{
		Family: plan.IPv4, LocalMode: plan.LocalNodeCIDR,
		ClusterCIDRs:      []string{"10.244.0.0/16", "fd00:244::/32"},
		NodePortAddresses: []string{"192.168.100.0/24", "fd00:100::/64"},
		NodeIPs:           []string{"192.168.100.2", "fd00:100::1", "192.168.100.1", "192.168.100.2"},
	}
	if errs := s.Validate(); len(errs) != 0 {
		t.Fatalf("Validate: %v", errs)
	}
	node := &pb.NodeInfo{PodCidrs: []string{"fd00:244:1::/64", "10.244.1.7/24"}}
	if got := s.LocalCIDR(node); got != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("NodeCIDR LocalCIDR = %v", got)
	}
	s.LocalMode = plan.LocalClusterCIDR
	if got := s.LocalCIDR(node); got != netip.MustParsePrefix("10.244.0.0/16") {
		t.Errorf("ClusterCIDR LocalCIDR = %v", got)
	}
	if all, cidrs := s.NodePorts(); all || len(cidrs) != 1 || cidrs[0] != netip.MustParsePrefix("192.168.100.0/24") {
		t.Errorf("NodePorts = %v, %v", all, cidrs)
	}
	s.NodePortAddresses = append(s.NodePortAddresses, "0.0.0.0/0")
	if all, cidrs := s.NodePorts(); !all || cidrs != nil {
		t.Errorf("NodePorts with 0.0.0.0/0 = %v, %v", all, cidrs)
	}
	if got := s.NodeIPAddrs(); len(got) != 2 || got[0].String() != "192.168.100.1" || got[1].String() != "192.168.100.2" {
		t.Errorf("NodeIPAddrs = %v, want sorted and unique", got)
	}

	bad := plan.Settings{
		Family: plan.IPv6, MasqueradeBit: 32, LocalMode: plan.LocalClusterCIDR, ClusterCIDRs: []string{"10.0.0.0/8"},
		NodePortAddresses: []string{"127.0.0.0/8", "nope"}, NodeIPs: []string{"::x"},
	}
	var msgs []string
	for _, err := range bad.Validate() {
		msgs = append(msgs, err.Error())
	}
	want := []string{"masquerade bit 32", "none of family IPv6", "loopback NodePorts", "nodePortAddresses: ", "nodeIPs: "}
	if len(msgs) != len(want) {
		t.Fatalf("Validate = %q, want %d errors", msgs, len(want))
	}
	for i, w := range want {
		if !strings.Contains(msgs[i], w) {
			t.Errorf("error %d = %q, want it to say %q", i, msgs[i], w)
		}
	}
}
