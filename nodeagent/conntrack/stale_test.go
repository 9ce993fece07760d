package conntrack

import (
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// staleServices is the table the decision is tested against.
func staleServices() []*pb.Service {
	// A dual-stack DNS Service reachable every way, with the Local
	// external policy so that it has local endpoints: 10.244.1.11 is only
	// in local_endpoints (the control plane sends it there when the node
	// uses it only for external traffic).
	dns := svc("dns", "10.96.0.10", "fd00:96::10")
	dns.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	dns.ExternalIps = []string{"203.0.113.10", "2001:db8::10"}
	dns.LoadBalancerIps = []string{"198.51.100.10", "2001:db8:1::10"}
	dns.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	dns.Ports = []*pb.ServicePort{port("dns", udp, 53, 30053), port("dns-tcp", tcp, 53, 30054)}
	dns.ClusterEndpoints = []*pb.PortEndpoints{
		eps("dns", "10.244.1.10:5353", "10.244.2.10:5353", "[fd00:244:1::10]:5353"),
		eps("dns-tcp", "10.244.1.10:5353"),
	}
	dns.LocalEndpoints = []*pb.PortEndpoints{eps("dns", "10.244.1.11:5353")}

	// Two UDP ports with different endpoints.
	multi := svc("multi", "10.96.0.20")
	multi.Ports = []*pb.ServicePort{port("a", udp, 53, 0), port("b", udp, 54, 0)}
	multi.ClusterEndpoints = []*pb.PortEndpoints{eps("a", "10.244.1.20:53"), eps("b", "10.244.1.21:54")}

	// No endpoints at all.
	empty := svc("empty", "10.96.0.30")
	empty.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	empty.Ports = []*pb.ServicePort{port("dns", udp, 53, 30055)}
	empty.Ports[0].HasEndpoints = false

	// internalTrafficPolicy Local with no endpoint on this node: the
	// control plane sends neither list, and new flows are dropped; it
	// sends the serving endpoints elsewhere for the cleanup.
	itp := svc("itp-local", "10.96.0.60")
	itp.InternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	itp.Ports = []*pb.ServicePort{port("dns", udp, 53, 0)}
	itp.UdpServingEndpoints = []*pb.PortEndpoints{eps("dns", "10.244.2.60:53")}

	// Zone hints: the node uses 10.244.1.80 only; 10.244.2.80 (another
	// zone) and 10.244.1.81 (terminating, still serving) serve too.
	hinted := svc("hinted", "10.96.0.80")
	hinted.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	hinted.Ports = []*pb.ServicePort{port("dns", udp, 53, 30080)}
	hinted.ClusterEndpoints = []*pb.PortEndpoints{eps("dns", "10.244.1.80:53")}
	hinted.UdpServingEndpoints = []*pb.PortEndpoints{eps("dns", "10.244.1.80:53", "10.244.1.81:53", "10.244.2.80:53")}

	// IPv6 only: nothing of it exists for the IPv4 table.
	v6 := svc("v6only", "fd00:96::40")
	v6.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	v6.ExternalIps = []string{"203.0.113.40"} // of the other family: ignored, as the dataplane does
	v6.Ports = []*pb.ServicePort{port("dns", udp, 53, 30056)}
	v6.ClusterEndpoints = []*pb.PortEndpoints{eps("dns", "[fd00:244:1::40]:53", "10.244.1.40:53")}

	// SCTP is never cleaned.
	sc := svc("sctp", "10.96.0.50")
	sc.Ports = []*pb.ServicePort{port("s", sctp, 53, 0)}
	sc.ClusterEndpoints = []*pb.PortEndpoints{eps("s", "10.244.1.50:53")}

	// Two Services claiming one external IP and port.
	shareA, shareB := svc("share-a", "10.96.0.70"), svc("share-b", "10.96.0.71")
	for i, s := range []*pb.Service{shareA, shareB} {
		s.ExternalIps = []string{"203.0.113.77"}
		s.Ports = []*pb.ServicePort{port("dns", udp, 53, 0)}
		s.ClusterEndpoints = []*pb.PortEndpoints{eps("dns", []string{"10.244.1.70:53", "10.244.1.71:53"}[i])}
	}
	return []*pb.Service{dns, multi, empty, itp, hinted, v6, sc, shareA, shareB}
}

func udp4(origDst, replySrc string) *netlink.ConntrackFlow {
	return ctFlow(unix.IPPROTO_UDP, "192.168.100.100:40000", origDst, replySrc)
}

func udp6(origDst, replySrc string) *netlink.ConntrackFlow {
	return ctFlow(unix.IPPROTO_UDP, "[fd00:100::100]:40000", origDst, replySrc)
}

func TestStale(t *testing.T) {
	tbl := newTable(t, staleServices()...)
	indexes := map[dataplane.Family]*index{dataplane.IPv4: newIndex(tbl, dataplane.IPv4), dataplane.IPv6: newIndex(tbl, dataplane.IPv6)}
	cases := []struct {
		name   string
		family dataplane.Family
		flow   *netlink.ConntrackFlow
		stale  bool
	}{
		{"ClusterIP to a live endpoint", dataplane.IPv4, udp4("10.96.0.10:53", "10.244.1.10:5353"), false},
		{"ClusterIP to another live endpoint", dataplane.IPv4, udp4("10.96.0.10:53", "10.244.2.10:5353"), false},
		{"ClusterIP to a removed endpoint", dataplane.IPv4, udp4("10.96.0.10:53", "10.244.1.99:5353"), true},
		{"ClusterIP to a live IP at an old target port", dataplane.IPv4, udp4("10.96.0.10:53", "10.244.1.10:5354"), true},
		{"ClusterIP never DNATed", dataplane.IPv4, udp4("10.96.0.10:53", "10.96.0.10:53"), true},
		{"ClusterIP at a port that is not the service's", dataplane.IPv4, udp4("10.96.0.10:54", "10.244.1.99:54"), false},
		{"ClusterIP to a local endpoint", dataplane.IPv4, udp4("10.96.0.10:53", "10.244.1.11:5353"), false},
		{"externalIP to a live endpoint", dataplane.IPv4, udp4("203.0.113.10:53", "10.244.2.10:5353"), false},
		{"externalIP to a local endpoint", dataplane.IPv4, udp4("203.0.113.10:53", "10.244.1.11:5353"), false},
		{"externalIP to a removed endpoint", dataplane.IPv4, udp4("203.0.113.10:53", "10.244.1.99:5353"), true},
		{"externalIP never DNATed", dataplane.IPv4, udp4("203.0.113.10:53", "203.0.113.10:53"), true},
		{"LB IP to a live endpoint", dataplane.IPv4, udp4("198.51.100.10:53", "10.244.1.10:5353"), false},
		{"LB IP to a removed endpoint", dataplane.IPv4, udp4("198.51.100.10:53", "10.244.1.99:5353"), true},
		{"NodePort to a live endpoint", dataplane.IPv4, udp4("192.168.100.1:30053", "10.244.1.10:5353"), false},
		{"NodePort to a local endpoint", dataplane.IPv4, udp4("192.168.100.1:30053", "10.244.1.11:5353"), false},
		{"NodePort to a removed endpoint", dataplane.IPv4, udp4("192.168.100.1:30053", "10.244.1.99:5353"), true},
		{"NodePort port at any address, never DNATed", dataplane.IPv4, udp4("10.0.0.1:30053", "10.0.0.1:30053"), true},
		{"TCP to a removed endpoint", dataplane.IPv4, ctFlow(unix.IPPROTO_TCP, "192.168.100.100:40000", "10.96.0.10:53", "10.244.1.99:5353"), false},
		{"TCP NodePort to a removed endpoint", dataplane.IPv4, ctFlow(unix.IPPROTO_TCP, "192.168.100.100:40000", "192.168.100.1:30054", "10.244.1.99:5353"), false},
		{"SCTP to a removed endpoint", dataplane.IPv4, ctFlow(unix.IPPROTO_SCTP, "192.168.100.100:40000", "10.96.0.50:53", "10.244.1.99:53"), false},
		{"UDP to the SCTP service's IP and port", dataplane.IPv4, udp4("10.96.0.50:53", "10.96.0.50:53"), false},
		{"port DNATed to another port's endpoint", dataplane.IPv4, udp4("10.96.0.20:53", "10.244.1.21:54"), true},
		{"port DNATed to its own endpoint", dataplane.IPv4, udp4("10.96.0.20:54", "10.244.1.21:54"), false},
		{"service without endpoints, never DNATed", dataplane.IPv4, udp4("10.96.0.30:53", "10.96.0.30:53"), true},
		{"service without endpoints, old endpoint", dataplane.IPv4, udp4("10.96.0.30:53", "10.244.1.99:53"), true},
		{"NodePort of a service without endpoints", dataplane.IPv4, udp4("192.168.100.1:30055", "10.244.1.99:53"), true},
		{"policy Local without a local endpoint, to a remote serving one", dataplane.IPv4, udp4("10.96.0.60:53", "10.244.2.60:53"), false},
		{"policy Local without a local endpoint, to a removed one", dataplane.IPv4, udp4("10.96.0.60:53", "10.244.2.99:53"), true},
		{"topology: to the endpoint the node uses", dataplane.IPv4, udp4("10.96.0.80:53", "10.244.1.80:53"), false},
		{"topology: to another zone's serving endpoint", dataplane.IPv4, udp4("10.96.0.80:53", "10.244.2.80:53"), false},
		{"topology: to a serving terminating endpoint", dataplane.IPv4, udp4("10.96.0.80:53", "10.244.1.81:53"), false},
		{"topology: NodePort to another zone's serving endpoint", dataplane.IPv4, udp4("192.168.100.1:30080", "10.244.2.80:53"), false},
		{"topology: to a removed endpoint", dataplane.IPv4, udp4("10.96.0.80:53", "10.244.2.99:53"), true},
		{"topology: never DNATed", dataplane.IPv4, udp4("10.96.0.80:53", "10.96.0.80:53"), true},
		{"unknown address", dataplane.IPv4, udp4("10.96.0.99:53", "10.96.0.99:53"), false},
		{"shared externalIP to one Service's endpoint", dataplane.IPv4, udp4("203.0.113.77:53", "10.244.1.70:53"), false},
		{"shared externalIP to the other's", dataplane.IPv4, udp4("203.0.113.77:53", "10.244.1.71:53"), false},
		{"shared externalIP to neither", dataplane.IPv4, udp4("203.0.113.77:53", "10.244.1.99:53"), true},
		{"IPv6-only service's NodePort in IPv4", dataplane.IPv4, udp4("192.168.100.1:30056", "10.244.1.99:53"), false},
		{"IPv6-only service's IPv4 externalIP", dataplane.IPv4, udp4("203.0.113.40:53", "10.244.1.99:53"), false},

		{"IPv6 ClusterIP to a live endpoint", dataplane.IPv6, udp6("[fd00:96::10]:53", "[fd00:244:1::10]:5353"), false},
		{"IPv6 ClusterIP to a removed endpoint", dataplane.IPv6, udp6("[fd00:96::10]:53", "[fd00:244:1::99]:5353"), true},
		{"IPv6 ClusterIP never DNATed", dataplane.IPv6, udp6("[fd00:96::10]:53", "[fd00:96::10]:53"), true},
		{"IPv6 ClusterIP to an IPv4 endpoint", dataplane.IPv6, udp6("[fd00:96::10]:53", "[::ffff:10.244.1.10]:5353"), true},
		{"IPv6 externalIP to a removed endpoint", dataplane.IPv6, udp6("[2001:db8::10]:53", "[fd00:244:1::99]:5353"), true},
		{"IPv6 LB IP to a live endpoint", dataplane.IPv6, udp6("[2001:db8:1::10]:53", "[fd00:244:1::10]:5353"), false},
		{"IPv6 LB IP to a removed endpoint", dataplane.IPv6, udp6("[2001:db8:1::10]:53", "[fd00:244:1::99]:5353"), true},
		{"IPv6 NodePort to a removed endpoint", dataplane.IPv6, udp6("[fd00:100::1]:30053", "[fd00:244:1::99]:5353"), true},
		{"IPv6-only service to its endpoint", dataplane.IPv6, udp6("[fd00:96::40]:53", "[fd00:244:1::40]:53"), false},
		{"IPv6-only service's NodePort to a removed endpoint", dataplane.IPv6, udp6("[fd00:100::1]:30056", "[fd00:244:1::99]:53"), true},
		{"IPv4 flow in the IPv6 table", dataplane.IPv6, udp4("10.96.0.10:53", "10.244.1.99:5353"), false},
		{"IPv4 flow at a NodePort in the IPv6 table", dataplane.IPv6, udp4("192.168.100.1:30053", "10.244.1.99:5353"), false},
		{"IPv6 flow at a NodePort in the IPv4 table", dataplane.IPv4, udp6("[fd00:100::1]:30053", "[fd00:244:1::99]:5353"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := indexes[tc.family].stale(flowOf(tc.flow)); got != tc.stale {
				t.Errorf("stale(%s) in %v = %v, want %v", flowString(tc.flow), tc.family, got, tc.stale)
			}
		})
	}
}

func TestIndexEmpty(t *testing.T) {
	web := svc("web", "10.96.0.10")
	web.Ports = []*pb.ServicePort{port("http", tcp, 80, 30080)}
	web.ClusterEndpoints = []*pb.PortEndpoints{eps("http", "10.244.1.10:8080")}
	noEndpoints := svc("dns", "10.96.0.53")
	noEndpoints.Ports = []*pb.ServicePort{port("dns", udp, 53, 0)}
	noEndpoints.Ports[0].HasEndpoints = false
	v6 := svc("dns6", "fd00:96::53")
	v6.Ports = []*pb.ServicePort{port("dns", udp, 53, 0)}
	v6.ClusterEndpoints = []*pb.PortEndpoints{eps("dns", "[fd00:244:1::10]:53")}

	if !newIndex(nil, dataplane.IPv4).empty() {
		t.Error("nil table: index not empty")
	}
	if ix := newIndex(newTable(t, web, v6), dataplane.IPv4); !ix.empty() {
		t.Errorf("IPv4 index of TCP and IPv6-only services: %+v, want empty", ix)
	}
	if ix := newIndex(newTable(t, web, v6), dataplane.IPv6); ix.empty() {
		t.Error("IPv6 index of an IPv6 UDP service is empty")
	}
	if ix := newIndex(newTable(t, web, noEndpoints), dataplane.IPv4); ix.empty() {
		t.Error("IPv4 index of a UDP service without endpoints is empty: its flows must be cleaned")
	}
}
