package compute

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	netutils "k8s.io/utils/net"

	"github.com/proxyplane/proxyplane/internal/capture"
)

// Guard is what no Service's external or load balancer IP may capture:
// the control plane addresses agents dial, and the nodes' own addresses
// (their Nodes' and those their agents report) on ports outside the node
// port range. Every agent refuses a table holding
// such a value (its proxytable.Policy, with the same predicates, package
// capture), so one Service listing one would freeze every node's table;
// BuildGuarded drops the value alone instead, as an invalid one, and the
// agents' check is left for a rogue replica's tables. It is immutable;
// nil guards nothing.
type Guard struct {
	controlPlanes []netip.AddrPort // sorted, unique, unmapped
	nodes         []netip.Addr     // sorted, unique, unmapped, no zone
	rules         capture.Rules
}

// NewGuard returns the guard of the control plane addresses controlPlanes
// (the agents' configured ones and the replicas' learned ones) and the
// nodes' addresses nodes. nodePorts is the API server's
// --service-node-port-range (zero for its default) and nodeAddressesAnyPort
// the agents' --allow-node-address-service-ports.
//
// A control plane address is guarded on every port, as an agent whose
// dataplane binds service addresses (IPVS) guards it: the control plane
// serves agents of any mode, and an entry is the same for all of them.
func NewGuard(controlPlanes []netip.AddrPort, nodes []netip.Addr, nodePorts capture.PortRange, nodeAddressesAnyPort bool) *Guard {
	g := &Guard{rules: capture.Rules{NodePorts: nodePorts, BindsServiceAddresses: true, NodeAddressesAnyPort: nodeAddressesAnyPort}}
	for _, cp := range controlPlanes {
		g.controlPlanes = append(g.controlPlanes, netip.AddrPortFrom(cp.Addr().Unmap().WithZone(""), cp.Port()))
	}
	slices.SortFunc(g.controlPlanes, netip.AddrPort.Compare)
	g.controlPlanes = slices.Compact(g.controlPlanes)
	for _, a := range nodes {
		g.nodes = append(g.nodes, a.Unmap().WithZone(""))
	}
	slices.SortFunc(g.nodes, netip.Addr.Compare)
	g.nodes = slices.Compact(g.nodes)
	return g
}

// Equal reports whether g and o guard the same addresses alike.
func (g *Guard) Equal(o *Guard) bool {
	if g == nil || o == nil {
		return g == o
	}
	return g.rules == o.rules && slices.Equal(g.controlPlanes, o.controlPlanes) && slices.Equal(g.nodes, o.nodes)
}

// Affects reports whether a Service address a may be guarded differently
// by g and o: then a Service listing it must be built again when the
// guard changes from one to the other, and only then.
func (g *Guard) Affects(o *Guard, a netip.Addr) bool {
	if g == nil || o == nil || g.rules != o.rules {
		return true
	}
	return !slices.Equal(g.controlPlanesAt(a), o.controlPlanesAt(a)) || g.guardsNode(a) != o.guardsNode(a)
}

// controlPlanesAt returns the control plane addresses on a: those a
// Problem names.
func (g *Guard) controlPlanesAt(a netip.Addr) []netip.AddrPort {
	var out []netip.AddrPort
	for _, cp := range g.controlPlanes {
		if cp.Addr() == a {
			out = append(out, cp)
		}
	}
	return out
}

func (g *Guard) guardsNode(a netip.Addr) bool {
	_, found := slices.BinarySearchFunc(g.nodes, a, netip.Addr.Compare)
	return found
}

// check returns why a, a Service address of kind k serving ports, may not
// be proxied, or nil.
func (g *Guard) check(k capture.Kind, a netip.Addr, ports []int32) error {
	if g == nil {
		return nil
	}
	// Only the nodes' address equal to a matters: thousands of nodes are
	// searched, not scanned.
	var node []netip.Addr
	if g.guardsNode(a) {
		node = []netip.Addr{a}
	}
	return g.rules.Address(k, a, ports, g.controlPlanes, node)
}

// NodeAddresses returns the addresses obj's status lists (internal and
// external IPs, parsed as upstream parses them), which an external or load
// balancer IP must not capture.
func NodeAddresses(obj *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range obj.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, ok := netip.AddrFromSlice(netutils.ParseIPSloppy(a.Address)); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// Exposed returns the addresses of svc that BuildGuarded checks against
// a Guard, its external and load balancer IPs: a Service needs building
// again when the guard changes for one of them (Guard.Affects).
func Exposed(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, s := range svc.Spec.ExternalIPs {
		if a, ok := parseAddrSloppy(s); ok {
			out = append(out, a)
		}
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if a, ok := parseAddrSloppy(ing.IP); ok {
			out = append(out, a)
		}
	}
	return out
}
