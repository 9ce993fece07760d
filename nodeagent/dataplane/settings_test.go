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
	if all, cidrs := s.NodePorts(nil); all || len(cidrs) != 1 || cidrs[0] != netip.MustParsePrefix("192.168.100.0/24") {
		t.Errorf("NodePorts = %v, %v", all, cidrs)
	}
	s.NodePortAddresses = append(s.NodePortAddresses, "0.0.0.0/0")
	if all, cidrs := s.NodePorts(nil); !all || cidrs != nil {
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
	want := []string{"masquerade bit 32", "none of family IPv6", "loopback NodePorts need localhostNodePorts", "nodePortAddresses: ", "nodeIPs: "}
	if len(msgs) != len(want) {
		t.Fatalf("Validate = %q, want %d errors", msgs, len(want))
	}
	for i, w := range want {
		if !strings.Contains(msgs[i], w) {
			t.Errorf("error %d = %q, want it to say %q", i, msgs[i], w)
		}
	}
}

// TestNodePortsPrimary checks where NodePorts answer with
// nodePortAddresses "primary", as upstream turns it into CIDRs: the
// node's primary address of the family from the table, --bind-address
// first; every address for a family without one, or with a loopback one.
func TestNodePortsPrimary(t *testing.T) {
	tests := []struct {
		name    string
		family  dataplane.Family
		bind    []string // Settings.NodeIPs
		node    *pb.NodeInfo
		wantAll bool
		want    []string
	}{
		{name: "IPv4 from the Node", family: dataplane.IPv4, node: &pb.NodeInfo{NodeIps: []string{"192.168.0.2", "fd00::2"}}, want: []string{"192.168.0.2/32"}},
		{name: "IPv6 from the Node", family: dataplane.IPv6, node: &pb.NodeInfo{NodeIps: []string{"192.168.0.2", "fd00::2"}}, want: []string{"fd00::2/128"}},
		{name: "no IPv6 on the Node: every IPv6 address", family: dataplane.IPv6, node: &pb.NodeInfo{NodeIps: []string{"192.168.0.2"}}, wantAll: true},
		{name: "no table yet: every address", family: dataplane.IPv4, wantAll: true},
		{name: "--bind-address wins", family: dataplane.IPv4, bind: []string{"192.168.0.9"}, node: &pb.NodeInfo{NodeIps: []string{"192.168.0.2"}}, want: []string{"192.168.0.9/32"}},
		{name: "loopback: every address", family: dataplane.IPv4, bind: []string{"127.0.0.1"}, node: &pb.NodeInfo{NodeIps: []string{"192.168.0.2"}}, wantAll: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := dataplane.DefaultSettings(tt.family)
			s.NodePortPrimary, s.NodeIPs = true, tt.bind
			if err := s.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			all, cidrs := s.NodePorts(s.PrimaryIPs(tt.node))
			var got []string
			for _, c := range cidrs {
				got = append(got, c.String())
			}
			if all != tt.wantAll || strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("NodePorts = %v, %v; want %v, %v", all, got, tt.wantAll, tt.want)
			}
		})
	}
	s := dataplane.DefaultSettings(dataplane.IPv4)
	s.NodePortPrimary, s.NodePortAddresses = true, []string{"10.0.0.0/8"}
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "NodePortPrimary") {
		t.Errorf("Validate with primary and CIDRs = %v, want an error", err)
	}
}

// TestLocalhostNodePorts checks when NodePorts answer on 127.0.0.1, as
// upstream's iptables proxier decides, and which loopback
// nodePortAddresses Validate accepts.
func TestLocalhostNodePorts(t *testing.T) {
	tests := []struct {
		name      string
		family    dataplane.Family
		on        bool
		addresses []string
		primary   bool
		nodeIPs   []string // the table's NodeInfo.node_ips; 192.168.0.2 when nil
		want      bool
		wantErr   string
	}{
		{name: "off", family: dataplane.IPv4, want: false},
		{name: "every address", family: dataplane.IPv4, on: true, want: true},
		{name: "0.0.0.0/0", family: dataplane.IPv4, on: true, addresses: []string{"0.0.0.0/0"}, want: true},
		{name: "a loopback CIDR", family: dataplane.IPv4, on: true, addresses: []string{"10.0.0.0/8", "127.0.0.1/32"}, want: true},
		{name: "no loopback CIDR", family: dataplane.IPv4, on: true, addresses: []string{"10.0.0.0/8"}, want: false},
		{name: "IPv6 never", family: dataplane.IPv6, on: true, want: false},
		{name: "primary", family: dataplane.IPv4, on: true, primary: true, want: false},
		{name: "primary without a node IP of the family", family: dataplane.IPv4, on: true, primary: true, nodeIPs: []string{"fd00::2"}, want: true},
		{name: "loopback CIDR without the setting", family: dataplane.IPv4, addresses: []string{"127.0.0.0/8"}, wantErr: "need localhostNodePorts"},
		{name: "IPv6 loopback CIDR even with it", family: dataplane.IPv4, on: true, addresses: []string{"::1/128"}, wantErr: "not supported on IPv6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := dataplane.DefaultSettings(tt.family)
			s.LocalhostNodePorts, s.NodePortAddresses, s.NodePortPrimary = tt.on, tt.addresses, tt.primary
			node := &pb.NodeInfo{NodeIps: tt.nodeIPs}
			if tt.nodeIPs == nil {
				node.NodeIps = []string{"192.168.0.2"}
			}
			err := s.Validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Validate = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if got := s.LocalhostNodePortsOn(s.PrimaryIPs(node)); got != tt.want {
				t.Errorf("LocalhostNodePortsOn = %v, want %v", got, tt.want)
			}
		})
	}
	s := dataplane.DefaultSettings(dataplane.IPv4)
	s.NodePortAddresses = []string{"0.0.0.0/0", "127.0.0.0/8", "10.0.0.0/8", "::1/128"}
	if got := s.LoopbackNodePortAddresses(); len(got) != 2 || got[0] != "127.0.0.0/8" || got[1] != "::1/128" {
		t.Errorf("LoopbackNodePortAddresses = %v, want 127.0.0.0/8 and ::1/128", got)
	}
}
