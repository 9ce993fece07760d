package proxytable

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

func TestParsePortRange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PortRange
		ok   bool
	}{
		{"30000-32767", DefaultNodePortRange, true},
		{"30000-65535", PortRange{Base: 30000, Size: 35536}, true},
		{"8080", PortRange{Base: 8080, Size: 1}, true},
		{"0-100", PortRange{}, false},
		{"200-100", PortRange{}, false},
		{"1-65536", PortRange{}, false},
		{"a-b", PortRange{}, false},
	} {
		got, err := ParsePortRange(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && strings.Contains(tc.in, "-") && got.String() != tc.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
}

// honest gives e and n the hashes the control plane would.
func honest(t *testing.T, n *pb.NodeInfo, entries ...*pb.ServiceEntry) *Table {
	t.Helper()
	var err error
	if n.Hash, err = tablehash.Node(n); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Hash, err = tablehash.Entry(e.Key, e.Service); err != nil {
			t.Fatal(err)
		}
	}
	sum := n.GetHash()
	for _, e := range entries {
		sum += e.GetHash()
	}
	tb, err := FromSnapshot(&pb.Snapshot{Version: fmt.Sprintf("%016x", sum), Node: n, Entries: entries})
	if err != nil {
		t.Fatalf("building table: %v", err)
	}
	return tb
}

func TestPolicy(t *testing.T) {
	cp := netip.MustParseAddrPort("192.0.2.10:9640")
	nodeIP := netip.MustParseAddr("192.0.2.20")
	p := &Policy{
		ControlPlanes: []netip.AddrPort{cp},
		NodeAddresses: func() ([]netip.Addr, error) { return []netip.Addr{nodeIP}, nil },
	}
	ipvs := *p
	ipvs.BindsServiceAddresses = true
	failing := *p
	failing.NodeAddresses = func() ([]netip.Addr, error) { return nil, errors.New("netlink: no") }
	for _, tc := range []struct {
		name   string
		policy *Policy
		node   func(*pb.NodeInfo)
		svc    func(*pb.Service)
		want   string // "" for accepted
	}{
		{name: "honest", policy: p},
		{name: "nil policy", policy: nil, svc: func(s *pb.Service) { s.Ports[0].NodePort = 22 }},
		{name: "nodePort 22", policy: p, svc: func(s *pb.Service) { s.Ports[0].NodePort = 22 }, want: "node port range"},
		{name: "nodePort in a wider range", policy: &Policy{NodePorts: PortRange{Base: 20, Size: 100}}, svc: func(s *pb.Service) { s.Ports[0].NodePort = 22 }},
		{name: "healthCheckNodePort 2379", policy: p, svc: func(s *pb.Service) { s.HealthCheckNodePort = 2379 }, want: "node port range"},
		{name: "nodePort on the control plane's port", policy: &Policy{NodePorts: PortRange{Base: 9000, Size: 1000}, ControlPlanes: p.ControlPlanes}, svc: func(s *pb.Service) { s.Ports[0].NodePort = 9640 }, want: "control plane port"},
		{name: "external IP on the control plane", policy: p, svc: func(s *pb.Service) { s.ExternalIps = []string{"192.0.2.10"}; s.Ports[0].Port = 9640 }, want: "control plane"},
		{name: "external IP on the control plane address, other port", policy: p, svc: func(s *pb.Service) { s.ExternalIps = []string{"192.0.2.10"}; s.Ports[0].Port = 80 }},
		{name: "same in IPVS mode, which binds it", policy: &ipvs, svc: func(s *pb.Service) { s.ExternalIps = []string{"192.0.2.10"}; s.Ports[0].Port = 80 }, want: "control plane"},
		{name: "cluster IP on the control plane address", policy: p, svc: func(s *pb.Service) { s.ClusterIps = []string{"192.0.2.10"} }, want: "control plane"},
		{name: "cluster IP on the node", policy: p, svc: func(s *pb.Service) { s.ClusterIps = []string{"192.0.2.20"} }, want: "address of the node"},
		{name: "external IP on the node, port 22", policy: p, svc: func(s *pb.Service) { s.ExternalIps = []string{"192.0.2.20"}; s.Ports[0].Port = 22 }, want: "address of the node"},
		{name: "external IP on the node, a node port", policy: p, svc: func(s *pb.Service) { s.ExternalIps = []string{"192.0.2.20"}; s.Ports[0].Port = 30500 }},
		{name: "load balancer IP on the node, port 80, allowed", policy: &Policy{NodeAddresses: p.NodeAddresses, NodeAddressesAnyPort: true}, svc: func(s *pb.Service) { s.LoadBalancerIps = []string{"192.0.2.20"} }},
		{name: "cluster IP on the node, even so", policy: &Policy{NodeAddresses: p.NodeAddresses, NodeAddressesAnyPort: true}, svc: func(s *pb.Service) { s.ClusterIps = []string{"192.0.2.20"} }, want: "address of the node"},
		{name: "service CIDR holding the control plane", policy: p, node: func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"192.0.2.0/24"} }, want: "control plane"},
		{name: "service CIDR holding the node", policy: &Policy{NodeAddresses: p.NodeAddresses}, node: func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"192.0.2.0/24"} }, want: "the node's address"},
		{name: "node addresses unknown", policy: &failing, want: "listing the node's addresses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &pb.NodeInfo{Name: "node-1", ServiceCidrs: []string{"10.96.0.0/16"}}
			if tc.node != nil {
				tc.node(n)
			}
			e := entry("web", 0, func(s *pb.Service) { s.ClusterIps = []string{"10.96.0.10"} })
			if tc.svc != nil {
				tc.svc(e.Service)
			}
			err := tc.policy.Check(honest(t, n, e), nil)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrInvalidTable) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check = %v, want ErrInvalidTable mentioning %q", err, tc.want)
			}
		})
	}
}

func TestVerifyHashes(t *testing.T) {
	tb := honest(t, &pb.NodeInfo{Name: "node-1"}, entry("web", 0))
	if err := VerifyHashes(tb); err != nil {
		t.Fatalf("honest table: %v", err)
	}
	// The same table with a forged Service under the honest hash: its
	// version still adds up.
	forged := entry("web", tb.Entries["default/web"].GetHash(), func(s *pb.Service) { s.ClusterEndpoints[0].Endpoints[0].Ip = "203.0.113.66" })
	bad, err := FromEntries(tb.Version, tb.Node, []*pb.ServiceEntry{forged})
	if err != nil {
		t.Fatal(err)
	}
	err = VerifyHashes(bad)
	if ee := EntryErrors(err); len(ee) != 1 || ee[0].GetKey() != "default/web" {
		t.Errorf("VerifyHashes = %v, want an entry error for default/web", err)
	}
	// Check finds the forgery too; CheckVerified, for a table whose
	// hashes were verified already, applies the policy alone.
	p := &Policy{ControlPlanes: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.10:9640")}}
	if err := p.Check(bad, nil); err == nil {
		t.Error("Check accepted a forged entry")
	}
	if err := p.CheckVerified(bad); err != nil {
		t.Errorf("CheckVerified recomputed the hashes: %v", err)
	}
	capturing := entry("web", 0, func(s *pb.Service) { s.ClusterIps = []string{"192.0.2.10"} })
	if err := p.CheckVerified(honest(t, &pb.NodeInfo{Name: "node-1"}, capturing)); err == nil || !strings.Contains(err.Error(), "control plane") {
		t.Errorf("CheckVerified = %v, want the policy applied", err)
	}
}

// TestCheckNamesEntriesInKeyOrder checks that a whole table's refusal
// lists its entries' errors by key, whatever the order in which they were
// checked: a NACK names the same entries in the same order every time.
func TestCheckNamesEntriesInKeyOrder(t *testing.T) {
	var entries []*pb.ServiceEntry
	for i := range 20 {
		entries = append(entries, entry(fmt.Sprintf("web-%02d", i), 0, func(s *pb.Service) { s.Ports[0].NodePort = 22 }))
	}
	tb := honest(t, &pb.NodeInfo{Name: "node-1"}, entries...)
	for _, check := range []func(*Table) error{
		func(tb *Table) error { return (&Policy{}).Check(tb, nil) },
		(&Policy{}).CheckVerified,
	} {
		ee := EntryErrors(check(tb))
		if len(ee) != len(entries) {
			t.Fatalf("%d entry errors, want %d", len(ee), len(entries))
		}
		for i, e := range ee {
			if want := entries[i].GetKey(); e.GetKey() != want {
				t.Fatalf("entry error %d names %s, want %s", i, e.GetKey(), want)
			}
		}
	}
}
