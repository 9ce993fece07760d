package iptables

import (
	"slices"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// TestNodePortPrimary checks that nodePortAddresses "primary" renders as
// upstream's conversion of it does: the /32 of the node's primary IP, from
// the table's NodeInfo unless --bind-address names one; every address
// when the Node has none. The primary IP is also the node IP that source
// ranges let through.
func TestNodePortPrimary(t *testing.T) {
	node := &pb.NodeInfo{Name: "node-a", NodeIps: []string{"192.168.100.7", "fd00:100::7"}}
	cfg := testConfig(dataplane.IPv4)
	cfg.NodeIPs, cfg.NodePortPrimary = nil, true
	p := newParams(&cfg, node)
	if p.nodePortAll || !slices.Equal(p.nodePortCIDRs, []string{"192.168.100.7/32"}) {
		t.Errorf("primary: all %v, CIDRs %v; want 192.168.100.7/32 only", p.nodePortAll, p.nodePortCIDRs)
	}
	if len(p.nodeIPs) != 1 || p.nodeIPs[0].String() != "192.168.100.7" {
		t.Errorf("node IPs %v, want the Node's", p.nodeIPs)
	}
	byCIDR := testConfig(dataplane.IPv4)
	byCIDR.NodePortAddresses = []string{"192.168.100.7/32"}
	tbl := dptest.Table(t, node, dptest.NodePortService())
	if got, want := string(renderFull(tbl, cfg).data), string(renderFull(tbl, byCIDR).data); got != want {
		t.Errorf("primary renders differently from its /32:\n%s", dptest.LineDiff(want, got))
	}
	if p := newParams(&cfg, &pb.NodeInfo{Name: "node-a"}); !p.nodePortAll || p.localhostNodePorts {
		t.Errorf("primary without node IPs: all %v, localhost %v; want every address but loopback", p.nodePortAll, p.localhostNodePorts)
	}
	cfg.NodeIPs = []string{"192.168.100.9"}
	if p := newParams(&cfg, node); !slices.Equal(p.nodePortCIDRs, []string{"192.168.100.9/32"}) {
		t.Errorf("primary with --bind-address: CIDRs %v, want the bind address's", p.nodePortCIDRs)
	}
}
