package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

const (
	tcp  = pb.Protocol_PROTOCOL_TCP
	udp  = pb.Protocol_PROTOCOL_UDP
	sctp = pb.Protocol_PROTOCOL_SCTP
)

var testNode = &pb.NodeInfo{Name: "node-0", Hash: 1}

// newTable builds a validated table holding services, as the agent would
// receive it.
func newTable(tb testing.TB, services ...*pb.Service) *proxytable.Table {
	tb.Helper()
	entries := make([]*pb.ServiceEntry, 0, len(services))
	sum := testNode.GetHash()
	for _, s := range services {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
		if err != nil {
			tb.Fatalf("encoding %s: %v", s.GetName(), err)
		}
		e := &pb.ServiceEntry{Key: s.GetNamespace() + "/" + s.GetName(), Hash: xxhash.Sum64(b), Service: s}
		entries = append(entries, e)
		sum += e.GetHash()
	}
	t, err := proxytable.FromEntries(fmt.Sprintf("%016x", sum), testNode, entries)
	if err != nil {
		tb.Fatalf("building table: %v", err)
	}
	return t
}

// svc is a ClusterIP Service in namespace "ns"; mutate the result.
func svc(name string, clusterIPs ...string) *pb.Service {
	return &pb.Service{
		Namespace: "ns", Name: name, Type: pb.ServiceType_SERVICE_TYPE_CLUSTER_IP, ClusterIps: clusterIPs,
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
	}
}

// port is a ServicePort with endpoints somewhere.
func port(name string, proto pb.Protocol, p, nodePort int32) *pb.ServicePort {
	return &pb.ServicePort{Name: name, Protocol: proto, Port: p, NodePort: nodePort, HasEndpoints: true}
}

// eps lists the endpoints ("ip:port", "[ip6]:port") of a port.
func eps(portName string, addrs ...string) *pb.PortEndpoints {
	pe := &pb.PortEndpoints{PortName: portName}
	for _, a := range addrs {
		ap := netip.MustParseAddrPort(a)
		pe.Endpoints = append(pe.Endpoints, &pb.Endpoint{Ip: ap.Addr().String(), Port: int32(ap.Port()), Ready: true, Serving: true})
	}
	return pe
}

// ctFlow is a conntrack flow as netlink reports it: from client to origDst,
// answered from replySrc (the endpoint when DNATed) to the client, or to
// the node when masqueraded, which the decision ignores.
func ctFlow(proto uint8, client, origDst, replySrc string) *netlink.ConntrackFlow {
	c, d, r := netip.MustParseAddrPort(client), netip.MustParseAddrPort(origDst), netip.MustParseAddrPort(replySrc)
	family := uint8(unix.AF_INET)
	if d.Addr().Is6() {
		family = unix.AF_INET6
	}
	return &netlink.ConntrackFlow{
		FamilyType: family,
		Forward:    netlink.IPTuple{Protocol: proto, SrcIP: ipOf(c), SrcPort: c.Port(), DstIP: ipOf(d), DstPort: d.Port()},
		Reverse:    netlink.IPTuple{Protocol: proto, SrcIP: ipOf(r), SrcPort: r.Port(), DstIP: ipOf(c), DstPort: c.Port()},
	}
}

// ipOf returns ap's address in the 16-byte form net.ParseIP gives even
// for IPv4, so the tests also cover unmapping.
func ipOf(ap netip.AddrPort) net.IP { return net.ParseIP(ap.Addr().String()) }

// flowString names a flow in failure messages.
func flowString(f *netlink.ConntrackFlow) string {
	return fmt.Sprintf("%d %s -> %s reply from %s", f.Forward.Protocol,
		net.JoinHostPort(f.Forward.SrcIP.String(), strconv.Itoa(int(f.Forward.SrcPort))),
		net.JoinHostPort(f.Forward.DstIP.String(), strconv.Itoa(int(f.Forward.DstPort))),
		net.JoinHostPort(f.Reverse.SrcIP.String(), strconv.Itoa(int(f.Reverse.SrcPort))))
}
