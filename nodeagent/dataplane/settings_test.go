package dataplane_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

func TestSettings(t *testing.T) {
	s := dataplane.Settings{
		Family: dataplane.IPv4, LocalMode: dataplane.LocalNodeCIDR,
		ClusterCIDRs:      []string{"10.244.0.0/16", "fd00:244::/32"},
		NodePortAddresses: []string{"192.168.100.0/24", "fd00:100::/64"},
		NodeIPs:           []string{"192.168.100.2", "fd00:100::1", "192.168.100.1", "192.168.100.2"},
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	node := &pb.NodeInfo{PodCidrs: []string{"fd00:244:1::/64", "10.244.1.7/24"}}
	if got := s.LocalCIDR(node); got != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("NodeCIDR LocalCIDR = %v", got)
	}
	s.LocalMode = dataplane.LocalClusterCIDR
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

	bad := dataplane.Settings{
		Family: dataplane.IPv6, MasqueradeBit: 32, LocalMode: dataplane.LocalClusterCIDR, ClusterCIDRs: []string{"10.0.0.0/8"},
		NodePortAddresses: []string{"127.0.0.0/8", "nope"}, NodeIPs: []string{"::x"},
	}
	var msgs []string
	var joined interface{ Unwrap() []error }
	if err := bad.Validate(); !errors.As(err, &joined) {
		t.Fatalf("Validate = %v, want the errors joined", err)
	}
	for _, err := range joined.Unwrap() {
		msgs = append(msgs, err.Error())
	}
	bad.Family = 5
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "family Family(5)") {
		t.Errorf("Validate with family 5 = %v, want it named", err)
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
