package ipvs

import (
	"net/netip"
	"slices"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// TestNodePortPrimary checks that nodePortAddresses "primary" makes
// NodePort virtual servers on the node's primary IP alone, from the
// table's NodeInfo, and on every node address when the Node has none, as
// upstream.
func TestNodePortPrimary(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("192.168.100.7"), netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("fd00:100::7")}
	cfg := DefaultConfig(dataplane.IPv4)
	cfg.NodePortPrimary = true
	p := newParams(&cfg, &pb.NodeInfo{Name: "node-a", NodeIps: []string{"192.168.100.7", "fd00:100::7"}}, addrs)
	if want := addrs[:1]; !slices.Equal(p.nodePortAddrs, want) {
		t.Errorf("NodePort addresses %v, want %v", p.nodePortAddrs, want)
	}
	if !slices.Equal(p.nodeIPs, addrs[:1]) {
		t.Errorf("node IPs %v, want the Node's", p.nodeIPs)
	}
	p = newParams(&cfg, &pb.NodeInfo{Name: "node-a"}, addrs)
	if want := []netip.Addr{addrs[1], addrs[0]}; !slices.Equal(p.nodePortAddrs, want) {
		t.Errorf("without node IPs: NodePort addresses %v, want every IPv4 address %v", p.nodePortAddrs, want)
	}
}
