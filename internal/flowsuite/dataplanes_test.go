package flowsuite

import (
	"os/exec"
	"testing"

	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
)

// dataplaneKinds lists the dataplanes the suite runs against: each
// iptables backend whose tools are installed. A new dataplane joins the
// suite here, and nowhere else.
func dataplaneKinds(t *testing.T) []dataplaneKind {
	t.Helper()
	var out []dataplaneKind
	for _, b := range []iptables.Backend{iptables.BackendNFT, iptables.BackendLegacy} {
		tool := map[iptables.Backend]string{iptables.BackendNFT: "iptables-nft-restore", iptables.BackendLegacy: "iptables-legacy-restore"}[b]
		if _, err := exec.LookPath(tool); err != nil {
			t.Logf("%s not installed: iptables-%s not tested (apt-get install -y iptables)", tool, b)
			continue
		}
		out = append(out, dataplaneKind{name: "iptables-" + string(b), new: newIPTables(b)})
	}
	if len(out) == 0 {
		t.Fatal("no dataplane to test: apt-get install -y iptables")
	}
	return out
}

// newIPTables programs a node's namespace with both families of iptables,
// configured as the agent's defaults would on that node.
func newIPTables(b iptables.Backend) func(t *testing.T, tp *nstest.Topology, n *nstest.Node) dataplane.Dataplane {
	return func(t *testing.T, tp *nstest.Topology, n *nstest.Node) dataplane.Dataplane {
		t.Helper()
		var dps []dataplane.Dataplane
		for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
			cfg := iptables.DefaultConfig(fam)
			cfg.Backend = b
			cfg.LocalMode = iptables.LocalClusterCIDR
			cfg.ClusterCIDRs = []string{clusterCIDR[0]}
			if fam == iptables.IPv6 {
				cfg.ClusterCIDRs = []string{clusterCIDR[1]}
			}
			cfg.NodeIPs = []string{n.IP().String(), n.IPv6().String()}
			cfg.CommandPrefix = []string{"ip", "netns", "exec", n.NS()}
			dp, err := iptables.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			dps = append(dps, dp)
		}
		return dataplane.Join(dps...)
	}
}
