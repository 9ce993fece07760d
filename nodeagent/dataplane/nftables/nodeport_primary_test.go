package nftables

import (
	"slices"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// TestNodePortPrimary checks that nodePortAddresses "primary" builds the
// ruleset of upstream's conversion of it, the /32 or /128 of the node's
// primary IP of the family from the table's NodeInfo, and that a change
// of that IP changes the fingerprint, so that the Driver syncs in full.
func TestNodePortPrimary(t *testing.T) {
	node := &pb.NodeInfo{Name: "node-a", NodeIps: []string{"192.168.100.7", "fd00:100::7"}}
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			cfg := testConfig(f)
			cfg.NodeIPs, cfg.NodePortPrimary = nil, true
			byCIDR := testConfig(f)
			byCIDR.NodeIPs = nil
			byCIDR.NodePortAddresses = []string{"192.168.100.7/32", "fd00:100::7/128"}
			svc := dptest.NodePortService()
			svc.ClusterIps = append(svc.ClusterIps, "fd00:96::20")
			tbl := dptest.Table(t, node, svc)
			if got, want := rulesetText(fullState(tbl, cfg), f), rulesetText(fullState(tbl, byCIDR), f); got != want {
				t.Errorf("primary builds differently from its single-address CIDR:\n%s", dptest.LineDiff(want, got))
			}
			p := newParams(&cfg, node)
			if p.nodePortAll || len(p.nodePortCIDRs) != 1 || !slices.Contains(node.NodeIps, p.nodePortCIDRs[0].Addr().String()) {
				t.Errorf("primary: all %v, CIDRs %v", p.nodePortAll, p.nodePortCIDRs)
			}
			moved := newParams(&cfg, &pb.NodeInfo{Name: "node-a", NodeIps: []string{"192.168.100.8", "fd00:100::8"}})
			if moved.fingerprint() == p.fingerprint() {
				t.Error("a new primary IP leaves the fingerprint unchanged: the next sync would not be full")
			}
			if none := newParams(&cfg, &pb.NodeInfo{Name: "node-a"}); !none.nodePortAll {
				t.Error("primary without node IPs: want every address, as upstream")
			}
		})
	}
}
