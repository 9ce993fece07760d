package healthcheck

import (
	"errors"
	"net"
	"net/netip"
	"reflect"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// ep is a local endpoint; conds is "r" for ready, "st" for serving and
// terminating (what the control plane sends when a port has no ready
// local endpoint).
func ep(ip string, port int32, conds string) *pb.Endpoint {
	e := &pb.Endpoint{Ip: ip, Port: port}
	switch conds {
	case "r":
		e.Ready, e.Serving = true, true
	case "st":
		e.Serving, e.Terminating = true, true
	}
	return e
}

// lbService is a LoadBalancer Service with externalTrafficPolicy Local on
// hcPort, IPv4 only, with no local endpoints; edits adjust it.
func lbService(name string, hcPort int32, edits ...func(*pb.Service)) *pb.ServiceEntry {
	s := &pb.Service{
		Namespace: "default", Name: name, Type: pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER,
		ClusterIps:            []string{"10.96.0.10"},
		LoadBalancerIps:       []string{"192.0.2.10"},
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		HealthCheckNodePort:   hcPort,
		Ports: []*pb.ServicePort{
			{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, NodePort: 30080, HasEndpoints: true},
			{Name: "https", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 443, NodePort: 30443, HasEndpoints: true},
		},
	}
	for _, e := range edits {
		e(s)
	}
	return &pb.ServiceEntry{Key: s.Namespace + "/" + s.Name, Service: s}
}

// local sets the Service's local endpoints of port name.
func local(port string, eps ...*pb.Endpoint) func(*pb.Service) {
	return func(s *pb.Service) {
		s.LocalEndpoints = append(s.LocalEndpoints, &pb.PortEndpoints{PortName: port, Endpoints: eps})
	}
}

// tableOf builds a table of entries. Sync does not validate (the agent
// has), so the version is arbitrary.
func tableOf(entries ...*pb.ServiceEntry) *proxytable.Table {
	t := &proxytable.Table{Version: "0000000000000001", Node: &pb.NodeInfo{Name: "node-1"}, Entries: map[string]*pb.ServiceEntry{}}
	for _, e := range entries {
		t.Entries[e.GetKey()] = e
	}
	return t
}

func svc(name string, counts map[family]int) service {
	return service{namespace: "default", name: name, endpoints: counts}
}

func TestDesired(t *testing.T) {
	dualStack := func(s *pb.Service) { s.ClusterIps = []string{"10.96.0.10", "fd00:96::10"} }
	cases := []struct {
		name      string
		table     *proxytable.Table
		want      map[int32]service
		conflicts int
	}{
		{"no table", nil, map[int32]service{}, 0},
		{"ready local endpoints are counted", tableOf(lbService("web", 32000,
			local("http", ep("10.244.1.5", 8080, "r"), ep("10.244.1.6", 8080, "r"))),
		), map[int32]service{32000: svc("web", map[family]int{ipv4: 2})}, 0},
		{
			"no local endpoints: the port is open with 0", tableOf(lbService("web", 32000)),
			map[int32]service{32000: svc("web", map[family]int{ipv4: 0})},
			0,
		},
		{"an address on two ports counts once", tableOf(lbService("web", 32000,
			local("http", ep("10.244.1.5", 8080, "r")),
			local("https", ep("10.244.1.5", 8443, "r"), ep("10.244.1.7", 8443, "r"))),
		), map[int32]service{32000: svc("web", map[family]int{ipv4: 2})}, 0},
		{"an address on two target ports of one port counts once", tableOf(lbService("web", 32000,
			local("http", ep("10.244.1.5", 8080, "r"), ep("10.244.1.5", 8081, "r"))),
		), map[int32]service{32000: svc("web", map[family]int{ipv4: 1})}, 0},
		{"serving-terminating endpoints are not counted", tableOf(lbService("web", 32000,
			local("http", ep("10.244.1.5", 8080, "st"), ep("10.244.1.6", 8080, "st"))),
		), map[int32]service{32000: svc("web", map[family]int{ipv4: 0})}, 0},
		{"only the ready one of a mixed port", tableOf(lbService("web", 32000,
			local("http", ep("10.244.1.5", 8080, "r")),
			local("https", ep("10.244.1.6", 8443, "st"))),
		), map[int32]service{32000: svc("web", map[family]int{ipv4: 1})}, 0},
		{"cluster endpoints are not local", tableOf(lbService("web", 32000, func(s *pb.Service) {
			s.ClusterEndpoints = []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{ep("10.244.2.5", 8080, "r")}}}
		})), map[int32]service{32000: svc("web", map[family]int{ipv4: 0})}, 0},
		{"dual-stack counts by family", tableOf(lbService("web", 32000, dualStack,
			local("http", ep("10.244.1.5", 8080, "r"), ep("10.244.1.6", 8080, "r"), ep("fd00:244::5", 8080, "r"))),
		), map[int32]service{32000: svc("web", map[family]int{ipv4: 2, ipv6: 1})}, 0},
		{"IPv6 only", tableOf(lbService("web", 32000, func(s *pb.Service) { s.ClusterIps = []string{"fd00:96::10"} },
			local("http", ep("fd00:244::5", 8080, "r"))),
		), map[int32]service{32000: svc("web", map[family]int{ipv6: 1})}, 0},
		{"externalTrafficPolicy Cluster has no health check", tableOf(lbService("web", 32000, func(s *pb.Service) {
			s.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
		})), map[int32]service{}, 0},
		{"no healthCheckNodePort", tableOf(lbService("web", 0)), map[int32]service{}, 0},
		{"two services", tableOf(
			lbService("a", 32000, local("http", ep("10.244.1.5", 8080, "r"))),
			lbService("b", 32001),
		), map[int32]service{
			32000: svc("a", map[family]int{ipv4: 1}),
			32001: svc("b", map[family]int{ipv4: 0}),
		}, 0},
		{"two services on one port: the first by key keeps it", tableOf(
			lbService("b", 32000, local("http", ep("10.244.1.5", 8080, "r"))),
			lbService("a", 32000),
		), map[int32]service{32000: svc("a", map[family]int{ipv4: 0})}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := desired(tc.table)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("desired = %+v, want %+v", got, tc.want)
			}
			if len(errs) != tc.conflicts {
				t.Fatalf("errors = %v, want %d conflicts", errs, tc.conflicts)
			}
			for _, err := range errs {
				if !errors.Is(err, ErrPortConflict) {
					t.Errorf("error %v does not wrap ErrPortConflict", err)
				}
			}
		})
	}
}

func TestAddresses(t *testing.T) {
	ipnet := func(s string) net.Addr {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	node := []net.Addr{
		ipnet("127.0.0.1/8"), ipnet("10.0.0.5/24"), ipnet("10.0.1.5/24"), ipnet("192.168.1.5/24"),
		ipnet("::1/128"), ipnet("2001:db8::5/64"), ipnet("fe80::5/64"),
		&net.IPAddr{IP: net.ParseIP("10.0.0.6")}, // a 16-byte IPv4 address, as on some platforms
	}
	all4, all6 := []netip.Addr{netip.IPv4Unspecified()}, []netip.Addr{netip.IPv6Unspecified()}
	addrs := func(ss ...string) []netip.Addr {
		out := make([]netip.Addr, len(ss))
		for i, s := range ss {
			out[i] = netip.MustParseAddr(s)
		}
		return out
	}
	prefixes := func(ss ...string) []netip.Prefix {
		out := make([]netip.Prefix, len(ss))
		for i, s := range ss {
			out[i] = netip.MustParsePrefix(s)
		}
		return out
	}
	cases := []struct {
		name       string
		cidrs      []netip.Prefix
		interfaces bool
		want4      []netip.Addr
		want6      []netip.Addr
	}{
		{"no CIDRs: all addresses of both families", nil, false, all4, all6},
		{"IPv4 CIDRs restrict IPv4 only", prefixes("10.0.0.0/16"), true, addrs("10.0.0.5", "10.0.0.6", "10.0.1.5"), all6},
		{"IPv6 CIDRs restrict IPv6 only", prefixes("2001:db8::/32"), true, all4, addrs("2001:db8::5")},
		{"a /0 matches all", prefixes("10.0.0.0/24", "0.0.0.0/0", "2001:db8::/32"), true, all4, addrs("2001:db8::5")},
		{"both /0", prefixes("0.0.0.0/0", "::/0"), false, all4, all6},
		{"overlapping CIDRs list an address once", prefixes("10.0.0.0/8", "10.0.0.0/24"), true, addrs("10.0.0.5", "10.0.0.6", "10.0.1.5"), all6},
		{"no match: no listener", prefixes("172.16.0.0/12", "2001:db9::/32"), true, nil, nil},
		{"loopback when asked", prefixes("127.0.0.0/8"), true, addrs("127.0.0.1"), all6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newAddressPolicy(tc.cidrs)
			if got := p.needsInterfaces(); got != tc.interfaces {
				t.Errorf("needsInterfaces = %v, want %v", got, tc.interfaces)
			}
			got := p.addresses(node)
			if !reflect.DeepEqual(got[ipv4], tc.want4) || !reflect.DeepEqual(got[ipv6], tc.want6) {
				t.Errorf("addresses = %v %v, want %v %v", got[ipv4], got[ipv6], tc.want4, tc.want6)
			}
		})
	}
}
