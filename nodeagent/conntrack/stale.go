package conntrack

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// This file is the decision, kept pure (no I/O, no goroutines) so that it
// is tested flow by flow: newIndex reads a table, index.stale judges one
// flow against it.

// flow is what the decision reads from a conntrack flow.
type flow struct {
	// proto is the layer 4 protocol (unix.IPPROTO_*).
	proto uint8
	// origDst is where the client sent its first packet: a service
	// frontend (or any address at a NodePort) for the flows of interest.
	origDst netip.AddrPort
	// replySrc is where replies come from: the endpoint the flow was
	// DNATed to, or origDst itself when it was never DNATed.
	replySrc netip.AddrPort
}

// flowOf reads f. Addresses are unmapped so that an IPv4 address held in
// 16 bytes compares equal to the table's.
func flowOf(f *netlink.ConntrackFlow) flow {
	return flow{
		proto:    f.Forward.Protocol,
		origDst:  netip.AddrPortFrom(addrOf(f.Forward.DstIP), f.Forward.DstPort),
		replySrc: netip.AddrPortFrom(addrOf(f.Reverse.SrcIP), f.Reverse.SrcPort),
	}
}

// addrOf converts ip; a missing or malformed address becomes the invalid
// Addr, which matches no frontend and no endpoint.
func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// endpointSet holds the endpoint addresses (IP and target port) a UDP
// frontend may be DNATed to.
type endpointSet map[netip.AddrPort]struct{}

// union returns a new set holding a and b; neither is modified, since one
// set is shared by all frontends of a service port.
func union(a, b endpointSet) endpointSet {
	out := make(endpointSet, len(a)+len(b))
	for ep := range a {
		out[ep] = struct{}{}
	}
	for ep := range b {
		out[ep] = struct{}{}
	}
	return out
}

// index is one family's UDP frontends of a table, each with the endpoints
// its flows may be DNATed to. A service port without endpoints has an empty
// set, so every flow to it is stale: upstream skipped such ports until
// kubernetes #139629, which left flows pinned to the last endpoint after a
// scale to zero.
type index struct {
	family dataplane.Family
	// frontends maps each service IP and port (cluster IP, external IPs
	// and load balancer IPs) to its endpoints.
	frontends map[netip.AddrPort]endpointSet
	// nodePorts maps each UDP NodePort to its endpoints; it matches flows
	// to any address at that port, as upstream's --orig-port-dst filter.
	nodePorts map[uint16]endpointSet
}

// newIndex indexes t's UDP service ports of family. A nil table indexes
// nothing.
func newIndex(t *proxytable.Table, family dataplane.Family) *index {
	ix := &index{family: family, frontends: map[netip.AddrPort]endpointSet{}, nodePorts: map[uint16]endpointSet{}}
	if t == nil {
		return ix
	}
	for _, e := range t.Entries {
		ix.addService(e.GetService())
	}
	return ix
}

// empty reports whether no flow can be stale: the table has no UDP service
// port of the family.
func (ix *index) empty() bool { return len(ix.frontends) == 0 && len(ix.nodePorts) == 0 }

func (ix *index) addService(s *pb.Service) {
	// Upstream runs one proxier per family, which never sees a Service
	// without a cluster IP of its family, so its external and load
	// balancer IPs of the family are ignored too (as the dataplane does).
	clusterIP, ok := ix.firstOfFamily(s.GetClusterIps())
	if !ok {
		return
	}
	var vips []netip.Addr
	for _, list := range [][]string{s.GetExternalIps(), s.GetLoadBalancerIps()} {
		for _, ip := range list {
			if a, err := netip.ParseAddr(ip); err == nil && ix.family.Has(a.Unmap()) {
				vips = append(vips, a.Unmap())
			}
		}
	}
	// The endpoints a flow of each port may keep, as upstream: every
	// serving endpoint of the Service, whatever topology, traffic policies
	// and terminating state say, so that a UDP flow lives as long as a TCP
	// connection would. They are those the node uses (cluster and local
	// sets) and, when those leave some out, udp_serving_endpoints.
	keep := map[string]endpointSet{}
	for _, list := range [][]*pb.PortEndpoints{s.GetClusterEndpoints(), s.GetLocalEndpoints(), s.GetUdpServingEndpoints()} {
		for _, pe := range list {
			for _, ep := range pe.GetEndpoints() {
				a, err := netip.ParseAddr(ep.GetIp())
				if err != nil || !ix.family.Has(a.Unmap()) || ep.GetPort() <= 0 || ep.GetPort() > 65535 {
					continue
				}
				set := keep[pe.GetPortName()]
				if set == nil {
					set = endpointSet{}
					keep[pe.GetPortName()] = set
				}
				set[netip.AddrPortFrom(a.Unmap(), uint16(ep.GetPort()))] = struct{}{}
			}
		}
	}
	for _, sp := range s.GetPorts() {
		if sp.GetProtocol() != pb.Protocol_PROTOCOL_UDP || sp.GetPort() <= 0 || sp.GetPort() > 65535 {
			continue
		}
		eps := keep[sp.GetName()]
		if eps == nil {
			eps = endpointSet{}
		}
		port := uint16(sp.GetPort())
		ix.addFrontend(netip.AddrPortFrom(clusterIP, port), eps)
		for _, vip := range vips {
			ix.addFrontend(netip.AddrPortFrom(vip, port), eps)
		}
		if np := sp.GetNodePort(); np > 0 && np <= 65535 {
			ix.nodePorts[uint16(np)] = merge(ix.nodePorts[uint16(np)], eps)
		}
	}
}

// addFrontend records fe. Two Services can claim one frontend (the same
// externalIP and port, which the API allows); upstream then keeps one of
// them in map order, this keeps the endpoints of both, so no choice of
// order deletes a flow either would keep.
func (ix *index) addFrontend(fe netip.AddrPort, eps endpointSet) {
	ix.frontends[fe] = merge(ix.frontends[fe], eps)
}

// merge returns eps when prev is nil, else their union.
func merge(prev, eps endpointSet) endpointSet {
	if prev == nil {
		return eps
	}
	return union(prev, eps)
}

func (ix *index) firstOfFamily(ips []string) (netip.Addr, bool) {
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil && ix.family.Has(a.Unmap()) {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// stale reports whether f must be deleted: a UDP flow of the family whose
// original destination is a frontend (service IP and port) or whose
// original destination port is a NodePort, and whose reply source is not
// one of that frontend's or NodePort's endpoints (of which there may be
// none). A flow that was never DNATed replies from the frontend itself, so
// it is stale too. The two tests are independent, as upstream's: a flow
// kept by one is still deleted by the other.
func (ix *index) stale(f flow) bool {
	if f.proto != unix.IPPROTO_UDP || !f.origDst.Addr().IsValid() || !ix.family.Has(f.origDst.Addr()) {
		return false
	}
	if eps, ok := ix.frontends[f.origDst]; ok {
		if _, live := eps[f.replySrc]; !live {
			return true
		}
	}
	if eps, ok := ix.nodePorts[f.origDst.Port()]; ok {
		if _, live := eps[f.replySrc]; !live {
			return true
		}
	}
	return false
}
