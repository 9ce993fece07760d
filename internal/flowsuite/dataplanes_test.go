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
)

// dataplaneKinds lists the dataplanes the suite runs against: each
// iptables backend whose tools are installed, nftables (netlink only, no
// tools needed), and IPVS when the kernel has it. A new dataplane joins the
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

// newNFTables programs a node's namespace with both families of nftables,
// configured as the agent's defaults would on that node.
func newNFTables(t *testing.T, _ *nstest.Topology, n *nstest.Node) dataplane.Dataplane {
	t.Helper()
	var dps []dataplane.Dataplane
	for i, fam := range []nftables.Family{nftables.IPv4, nftables.IPv6} {
		cfg := nftables.DefaultConfig(fam)
		cfg.LocalMode = nftables.LocalClusterCIDR
		cfg.ClusterCIDRs = []string{clusterCIDR[i]}
		cfg.NodeIPs = []string{n.IP().String(), n.IPv6().String()}
		cfg.NetNS = filepath.Join("/run/netns", n.NS())
		dp, err := nftables.New(cfg)
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
	for i, fam := range []ipvs.Family{ipvs.IPv4, ipvs.IPv6} {
		cfg := ipvs.DefaultConfig(fam)
		cfg.LocalMode = ipvs.LocalClusterCIDR
		cfg.ClusterCIDRs = []string{clusterCIDR[i]}
		cfg.NodeIPs = []string{n.IP().String(), n.IPv6().String()}
		// Netlink and sysctls in the node's namespace; the tools run
		// under nsenter.
		cfg.NetNS = filepath.Join("/run/netns", n.NS())
		dp, err := ipvs.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		dps = append(dps, dp)
	}
	return dataplane.Join(dps...)
}
