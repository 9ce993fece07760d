package flowsuite

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/nftables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// dataplaneKinds lists the dataplanes the suite runs against: each
// iptables backend whose tools are installed, nftables (netlink only, no
// tools needed), and IPVS when the kernel has it. A new dataplane joins the
// suite here, and nowhere else.
func dataplaneKinds(t *testing.T) []dataplaneKind {
	t.Helper()
	var out []dataplaneKind
	for _, b := range []xtables.Backend{xtables.BackendNFT, xtables.BackendLegacy} {
		tool := map[xtables.Backend]string{xtables.BackendNFT: "iptables-nft-restore", xtables.BackendLegacy: "iptables-legacy-restore"}[b]
		if _, err := exec.LookPath(tool); err != nil {
			t.Logf("%s not installed: iptables-%s not tested (apt-get install -y iptables)", tool, b)
			continue
		}
		out = append(out, dataplaneKind{name: "iptables-" + string(b), new: newIPTables(b)})
	}
	if len(out) == 0 {
		t.Fatal("no dataplane to test: apt-get install -y iptables")
	}
	// Like upstream's nftables mode, it rejects a ClusterIP's unknown ports.
	out = append(out, dataplaneKind{name: "nftables", new: newNFTables, rejectsUnknownPorts: true})
	// IPVS is decided here, before any cluster is built: a constructor
	// that skipped (or failed) would leave newCluster's cleanup waiting for
	// agents it never started. Its subtest still shows the skip and why.
	if err := ipvs.CheckKernel(); err != nil {
		t.Run("ipvs", func(t *testing.T) {
			t.Skipf("IPVS dataplane not tested: %v; run the suite as root on a kernel with CONFIG_IP_VS and the dummy link type (see nodeagent/dataplane/ipvs/README.md)", err)
		})
	} else {
		// Like upstream's IPVS mode (KUBE-IPVS-FILTER), PP-IPVS-FILTER
		// rejects a service address's unknown ports.
		out = append(out, dataplaneKind{name: "ipvs", new: newIPVS, rejectsUnknownPorts: true})
	}
	return out
}

// newIPTables programs a node's namespace with both families of iptables,
// configured as the agent's defaults would on that node.
func newIPTables(b xtables.Backend) func(t *testing.T, tp *nstest.Topology, n *nstest.Node) dataplane.Dataplane {
	return func(t *testing.T, tp *nstest.Topology, n *nstest.Node) dataplane.Dataplane {
		t.Helper()
		var dps []dataplane.Dataplane
		for _, fam := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			cfg := iptables.DefaultConfig(fam)
			cfg.Backend = b
			cfg.LocalMode = dataplane.LocalClusterCIDR
			cfg.ClusterCIDRs = []string{clusterCIDR[0]}
			if fam == dataplane.IPv6 {
				cfg.ClusterCIDRs = []string{clusterCIDR[1]}
			}
			cfg.NodeIPs = []string{n.IP().String(), n.IPv6().String()}
			cfg.CommandPrefix = []string{"ip", "netns", "exec", n.NS()}
			dp, err := iptables.New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			dps = append(dps, dp)
		}
		return dataplane.Join(dps...)
	}
}

// newNFTables programs a node's namespace with both families of nftables,
// configured as the agent's defaults would on that node.
func newNFTables(t *testing.T, _ *nstest.Topology, n *nstest.Node) dataplane.Dataplane {
	t.Helper()
	var dps []dataplane.Dataplane
	for i, fam := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		cfg := nftables.DefaultConfig(fam)
		cfg.LocalMode = dataplane.LocalClusterCIDR
		cfg.ClusterCIDRs = []string{clusterCIDR[i]}
		cfg.NodeIPs = []string{n.IP().String(), n.IPv6().String()}
		cfg.NetNS = filepath.Join("/run/netns", n.NS())
		dp, err := nftables.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		dps = append(dps, dp)
	}
	return dataplane.Join(dps...)
}

// newIPVS programs a node's namespace with both families of the IPVS
// dataplane, configured as the agent's defaults would on that node.
func newIPVS(t *testing.T, _ *nstest.Topology, n *nstest.Node) dataplane.Dataplane {
	t.Helper()
	var dps []dataplane.Dataplane
	for i, fam := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		cfg := ipvs.DefaultConfig(fam)
		cfg.LocalMode = dataplane.LocalClusterCIDR
		cfg.ClusterCIDRs = []string{clusterCIDR[i]}
		cfg.NodeIPs = []string{n.IP().String(), n.IPv6().String()}
		// Netlink and sysctls in the node's namespace; the tools run
		// under nsenter.
		cfg.NetNS = filepath.Join("/run/netns", n.NS())
		dp, err := ipvs.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		dps = append(dps, dp)
	}
	return dataplane.Join(dps...)
}
