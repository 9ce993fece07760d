package proxytable

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

var node = &pb.NodeInfo{Name: "node-1", Hash: 100}

func entry(name string, hash uint64, edit ...func(*pb.Service)) *pb.ServiceEntry {
	s := &pb.Service{
		Namespace: "default", Name: name, ClusterIps: []string{"10.96.0.10", "fd00:96::10"},
		Ports:            []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, NodePort: 30080}},
		ClusterEndpoints: []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{{Ip: "10.244.1.10", Port: 8080, Ready: true}}}},
	}
	for _, f := range edit {
		f(s)
	}
	return &pb.ServiceEntry{Key: "default/" + name, Hash: hash, Service: s}
}

func sum(entries ...*pb.ServiceEntry) string {
	v := node.GetHash()
	for _, e := range entries {
		v += e.GetHash()
	}
	return fmt.Sprintf("%016x", v)
}

func snap(entries ...*pb.ServiceEntry) *pb.Snapshot {
	return &pb.Snapshot{Version: sum(entries...), Node: node, Entries: entries}
}

// withNode edits a copy of s's node.
func withNode(s *pb.Snapshot, edit func(*pb.NodeInfo)) *pb.Snapshot {
	n := proto.CloneOf(s.GetNode())
	edit(n)
	s.Node = n
	return s
}

func TestFromSnapshot(t *testing.T) {
	cases := []struct {
		name      string
		snap      *pb.Snapshot
		wantEntry string // key named in an entry error; "" for a table error
		valid     bool
	}{
		{"valid", snap(entry("a", 1), entry("b", 2)), "", true},
		{"empty table", snap(), "", true},
		{"version does not add up", &pb.Snapshot{Version: "0000000000000001", Node: node, Entries: []*pb.ServiceEntry{entry("a", 1)}}, "", false},
		{"version not hex", &pb.Snapshot{Version: "zzzzzzzzzzzzzzzz", Node: node}, "", false},
		// The client inflates compressed entries before decoding; ones left
		// over are refused even where what is plain adds up.
		{"compressed entries not inflated", &pb.Snapshot{Version: sum(entry("a", 1)), Node: node, Entries: []*pb.ServiceEntry{entry("a", 1)}, ZstdEntries: [][]byte{{0x28, 0xb5, 0x2f, 0xfd}}}, "", false},
		{"no node", &pb.Snapshot{Version: sum()}, "", false},
		{"service CIDRs", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"10.96.0.0/16", "fd00:96::/112"} }), "", true},
		{"service CIDR not a prefix", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"10.96.0.1"} }), "", false},
		{"service CIDR with host bits", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"10.96.0.1/16"} }), "", false},
		{"node IPs", withNode(snap(), func(n *pb.NodeInfo) { n.NodeIps = []string{"192.168.0.2", "fd00::2"} }), "", true},
		{"node IP not an address", withNode(snap(), func(n *pb.NodeInfo) { n.NodeIps = []string{"node-a"} }), "", false},
		{"node IP not canonical", withNode(snap(), func(n *pb.NodeInfo) { n.NodeIps = []string{"FD00::2"} }), "", false},
		{"two node IPs of a family", withNode(snap(), func(n *pb.NodeInfo) { n.NodeIps = []string{"192.168.0.2", "192.168.0.3"} }), "", false},
		{"duplicate key", snap(entry("a", 1), entry("a", 1)), "default/a", false},
		{"key does not match", func() *pb.Snapshot { e := entry("a", 1); e.Key = "default/b"; return snap(e) }(), "default/b", false},
		{"no service", func() *pb.Snapshot { e := entry("a", 1); e.Service = nil; return snap(e) }(), "default/a", false},
		{"no cluster IP", snap(entry("a", 1, func(s *pb.Service) { s.ClusterIps = nil })), "default/a", false},
		{"bad cluster IP", snap(entry("a", 1, func(s *pb.Service) { s.ClusterIps = []string{"10.96.0.300"} })), "default/a", false},
		{"bad external IP", snap(entry("a", 1, func(s *pb.Service) { s.ExternalIps = []string{"x"} })), "default/a", false},
		{"bad source range", snap(entry("a", 1, func(s *pb.Service) { s.LoadBalancerSourceRanges = []string{"10.0.0.0/40"} })), "default/a", false},
		{"port 0", snap(entry("a", 1, func(s *pb.Service) { s.Ports[0].Port = 0 })), "default/a", false},
		{"node port too big", snap(entry("a", 1, func(s *pb.Service) { s.Ports[0].NodePort = 70000 })), "default/a", false},
		{"unknown protocol", snap(entry("a", 1, func(s *pb.Service) { s.Ports[0].Protocol = 9 })), "default/a", false},
		{"unset protocol", snap(entry("a", 1, func(s *pb.Service) { s.Ports[0].Protocol = 0 })), "default/a", false},
		{"duplicate port", snap(entry("a", 1, func(s *pb.Service) { s.Ports = append(s.Ports, s.Ports[0]) })), "default/a", false},
		{"endpoints of an unknown port", snap(entry("a", 1, func(s *pb.Service) { s.ClusterEndpoints[0].PortName = "grpc" })), "default/a", false},
		{"bad endpoint IP", snap(entry("a", 1, func(s *pb.Service) { s.ClusterEndpoints[0].Endpoints[0].Ip = "pod" })), "default/a", false},
		{"bad endpoint port", snap(entry("a", 1, func(s *pb.Service) { s.ClusterEndpoints[0].Endpoints[0].Port = 0 })), "default/a", false},
		{"bad local endpoint", snap(entry("a", 1, func(s *pb.Service) {
			s.LocalEndpoints = []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{{Ip: "", Port: 1}}}}
		})), "default/a", false},
		{"affinity timeout", snap(entry("a", 1, func(s *pb.Service) { s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 0} })), "default/a", false},
		{"health check port", snap(entry("a", 1, func(s *pb.Service) { s.HealthCheckNodePort = -1 })), "default/a", false},

		// The API server's own rules (issue 21): what it would never have
		// let a Service hold, a rogue replica must not either.
		{"port name that injects a rule", snap(entry("a", 1, func(s *pb.Service) {
			s.Ports[0].Name = "\"\n-I INPUT 1 -j ACCEPT\n"
			s.ClusterEndpoints[0].PortName = s.Ports[0].Name
		})), "default/a", false},
		{"port name too long", snap(entry("a", 1, func(s *pb.Service) {
			s.Ports[0].Name = strings.Repeat("p", 64)
			s.ClusterEndpoints[0].PortName = s.Ports[0].Name
		})), "default/a", false},
		{"unnamed port among several", snap(entry("a", 1, func(s *pb.Service) {
			s.Ports = append(s.Ports, &pb.ServicePort{Protocol: pb.Protocol_PROTOCOL_UDP, Port: 53})
		})), "default/a", false},
		{"same protocol and port twice", snap(entry("a", 1, func(s *pb.Service) {
			s.Ports = append(s.Ports, &pb.ServicePort{Name: "alt", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80})
		})), "default/a", false},
		{"same port on two protocols", snap(entry("a", 1, func(s *pb.Service) {
			s.Ports = append(s.Ports, &pb.ServicePort{Name: "dns", Protocol: pb.Protocol_PROTOCOL_UDP, Port: 80, NodePort: 30080})
		})), "", true},
		{"namespace not a DNS label", func() *pb.Snapshot {
			e := entry("a", 1, func(s *pb.Service) { s.Namespace = "De fault" })
			e.Key = "De fault/a"
			return snap(e)
		}(), "De fault/a", false},
		{"name not a DNS-1035 label", func() *pb.Snapshot {
			e := entry("1a", 1)
			return snap(e)
		}(), "default/1a", false},
		{"name with a newline", func() *pb.Snapshot {
			e := entry("a\n-A", 1)
			return snap(e)
		}(), "default/a\n-A", false},
		{"three cluster IPs", snap(entry("a", 1, func(s *pb.Service) { s.ClusterIps = append(s.ClusterIps, "10.96.0.11") })), "default/a", false},
		{"two cluster IPs of a family", snap(entry("a", 1, func(s *pb.Service) { s.ClusterIps = []string{"10.96.0.10", "10.96.0.11"} })), "default/a", false},
		{"loopback cluster IP", snap(entry("a", 1, func(s *pb.Service) { s.ClusterIps = []string{"127.0.0.1"} })), "default/a", false},
		{"IPv4-mapped cluster IP", snap(entry("a", 1, func(s *pb.Service) { s.ClusterIps = []string{"::ffff:10.96.0.10"} })), "default/a", false},
		{"unspecified external IP", snap(entry("a", 1, func(s *pb.Service) { s.ExternalIps = []string{"0.0.0.0"} })), "default/a", false},
		{"link-local external IP", snap(entry("a", 1, func(s *pb.Service) { s.ExternalIps = []string{"fe80::1"} })), "default/a", false},
		{"metadata load balancer IP", snap(entry("a", 1, func(s *pb.Service) { s.LoadBalancerIps = []string{"169.254.169.254"} })), "default/a", false},
		{"multicast load balancer IP", snap(entry("a", 1, func(s *pb.Service) { s.LoadBalancerIps = []string{"239.1.1.1"} })), "default/a", false},
		{"link-local multicast external IP", snap(entry("a", 1, func(s *pb.Service) { s.ExternalIps = []string{"224.0.0.251"} })), "default/a", false},
		// The API server takes it, so a Service author could otherwise
		// make every agent NACK.
		{"multicast external IP", snap(entry("a", 1, func(s *pb.Service) { s.ExternalIps = []string{"239.1.1.1"} })), "", true},
		{"cluster IP with leading zeros", snap(entry("a", 1, func(s *pb.Service) { s.ClusterIps = []string{"10.96.0.010"} })), "default/a", false},
		{"loopback endpoint", snap(entry("a", 1, func(s *pb.Service) { s.ClusterEndpoints[0].Endpoints[0].Ip = "127.0.0.1" })), "default/a", false},
		{"metadata endpoint", snap(entry("a", 1, func(s *pb.Service) { s.ClusterEndpoints[0].Endpoints[0].Ip = "169.254.169.254" })), "default/a", false},
		{"service CIDR 0.0.0.0/0", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"0.0.0.0/0"} }), "", false},
		{"service CIDR ::/0", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"::/0"} }), "", false},
		{"service CIDR wider than /8", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"10.0.0.0/7"} }), "", false},
		{"service CIDR wider than /64", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"fd00::/48"} }), "", false},
		{"service CIDR of loopback", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"127.0.0.0/8"} }), "", false},
		{"service CIDR of link-local", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"169.254.0.0/16"} }), "", false},
		{"service CIDRs as large as allowed", withNode(snap(), func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"10.0.0.0/8", "fd00::/64"} }), "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			table, err := FromSnapshot(tc.snap)
			if tc.valid {
				if err != nil {
					t.Fatalf("rejected a valid snapshot: %v", err)
				}
				if table.Version != tc.snap.GetVersion() || len(table.Entries) != len(tc.snap.GetEntries()) {
					t.Errorf("table %s with %d entries, want %s with %d", table.Version, len(table.Entries), tc.snap.GetVersion(), len(tc.snap.GetEntries()))
				}
				return
			}
			if !errors.Is(err, ErrInvalidTable) {
				t.Fatalf("error %v, want one matching ErrInvalidTable", err)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %T, want *ValidationError", err)
			}
			if tc.wantEntry != "" && (len(ve.Entries) == 0 || ve.Entries[0].Key != tc.wantEntry) {
				t.Errorf("entry errors %v, want one for %s", ve.Entries, tc.wantEntry)
			}
		})
	}
}

func TestApply(t *testing.T) {
	base, err := FromSnapshot(snap(entry("a", 1), entry("b", 2)))
	if err != nil {
		t.Fatal(err)
	}
	a2, c3 := entry("a", 5, func(s *pb.Service) { s.Ports[0].Port = 81 }), entry("c", 3)
	newNode := &pb.NodeInfo{Name: "node-1", Zone: "z", Hash: 200}

	t.Run("upserts, removals and node", func(t *testing.T) {
		version := fmt.Sprintf("%016x", newNode.GetHash()+a2.GetHash()+c3.GetHash())
		next, changed, err := base.Apply(&pb.Delta{
			BaseVersion: base.Version, Version: version, Node: newNode,
			Upserts: []*pb.ServiceEntry{a2, c3}, Removals: []string{"default/b"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(changed, []string{"default/a", "default/b", "default/c"}) {
			t.Errorf("changed %v", changed)
		}
		if !slices.Equal(next.Keys(), []string{"default/a", "default/c"}) || !proto.Equal(next.Entries["default/a"], a2) || next.Node.GetZone() != "z" {
			t.Errorf("next table %v", next.Keys())
		}
		if len(base.Entries) != 2 || base.Entries["default/a"].GetHash() != 1 {
			t.Error("Apply modified the table it was called on")
		}
	})
	t.Run("resource version never falls", func(t *testing.T) {
		s := snap(entry("a", 1))
		s.ResourceVersion = 50
		held, err := FromSnapshot(s)
		if err != nil || held.ResourceVersion != 50 {
			t.Fatalf("snapshot of resource version 50: %d, %v", held.ResourceVersion, err)
		}
		for _, tc := range []struct{ sent, want uint64 }{{40, 50}, {0, 50}, {60, 60}} {
			next, _, err := held.Apply(&pb.Delta{BaseVersion: held.Version, Version: held.Version, ResourceVersion: tc.sent})
			if err != nil || next.ResourceVersion != tc.want {
				t.Errorf("delta of resource version %d onto 50: %d, %v; want %d", tc.sent, next.ResourceVersion, err, tc.want)
			}
		}
	})
	bad := []struct {
		name  string
		delta *pb.Delta
		want  string
	}{
		{"another base", &pb.Delta{BaseVersion: "0000000000000000", Version: base.Version}, "holds"},
		{"removal of an unknown key", &pb.Delta{BaseVersion: base.Version, Version: sum(entry("a", 1), entry("b", 2)), Removals: []string{"default/z"}}, "default/z"},
		{"version does not add up", &pb.Delta{BaseVersion: base.Version, Version: base.Version, Upserts: []*pb.ServiceEntry{c3}}, "add up"},
		{"invalid upsert", &pb.Delta{
			BaseVersion: base.Version, Version: sum(entry("a", 1), entry("b", 2), entry("c", 3)),
			Upserts: []*pb.ServiceEntry{entry("c", 3, func(s *pb.Service) { s.Ports[0].Port = 0 })},
		}, "default/c"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := base.Apply(tc.delta); !errors.Is(err, ErrInvalidTable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrInvalidTable mentioning %q", err, tc.want)
			}
		})
	}
}

func TestHashes(t *testing.T) {
	table, err := FromSnapshot(snap(entry("a", 1), entry("b", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if h := table.Hashes(); len(h) != 2 || h["default/a"] != 1 || h["default/b"] != 2 {
		t.Errorf("hashes %v", h)
	}
}

func TestResponseVersion(t *testing.T) {
	for _, tc := range []struct {
		resp *pb.SyncResponse
		want string
	}{
		{&pb.SyncResponse{Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: "s1"}}}, "s1"},
		{&pb.SyncResponse{Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{Version: "d1"}}}, "d1"},
		{&pb.SyncResponse{}, ""},
		{nil, ""},
	} {
		if got := ResponseVersion(tc.resp); got != tc.want {
			t.Errorf("ResponseVersion(%v) = %q, want %q", tc.resp, got, tc.want)
		}
	}
}

func TestEntryErrors(t *testing.T) {
	bad := &pb.ServiceEntry{Key: "ns/a", Service: &pb.Service{Namespace: "ns", Name: "b"}}
	_, err := FromEntries("v1", &pb.NodeInfo{}, []*pb.ServiceEntry{bad})
	got := EntryErrors(fmt.Errorf("applying: %w", err))
	if len(got) != 1 || got[0].GetKey() != "ns/a" || got[0].GetError() == "" {
		t.Errorf("EntryErrors = %v, want one for ns/a", got)
	}
	if got := EntryErrors(errors.New("disk full")); got != nil {
		t.Errorf("EntryErrors of a plain error = %v, want nil", got)
	}
}
