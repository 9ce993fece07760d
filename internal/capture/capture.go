// Package capture says when a Service address would capture what a node
// needs for itself: a control plane address its agent dials, or one of the
// node's own addresses on a host port.
//
// The node agent refuses a table holding such an address (NACKs it, and
// keeps the last good one: nodeagent/proxytable's Policy), as the defence
// against a rogue replica. The control plane drops such values from
// Services before they reach any table (controlplane/compute's Guard),
// with the same predicates, so that a tenant who may set a Service's
// externalIPs cannot make every agent refuse every later table.
package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// PortRange is an inclusive range of ports, as the API server's
// --service-node-port-range.
type PortRange struct {
	// Base is the first port, Size how many there are.
	Base, Size int32
}

// DefaultNodePortRange is the API server's default --service-node-port-range.
var DefaultNodePortRange = PortRange{Base: 30000, Size: 2768}

// ParsePortRange parses "min-max" (or a single port), as the API server
// parses --service-node-port-range.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, found := strings.Cut(strings.TrimSpace(s), "-")
	if !found {
		hi = lo
	}
	a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err := errors.Join(err1, err2); err != nil || a < 1 || b < a {
		return PortRange{}, fmt.Errorf("port range %q: want min-max within 1-65535", s)
	}
	return PortRange{Base: int32(a), Size: int32(b - a + 1)}, nil
}

// Contains reports whether p is in r.
func (r PortRange) Contains(p int32) bool { return p >= r.Base && p < r.Base+r.Size }

// String renders r as ParsePortRange reads it.
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Base, r.Base+r.Size-1) }

// Kind is the kind of a Service address.
type Kind int

// Kinds of Service address.
const (
	ClusterIP Kind = iota
	ExternalIP
	LoadBalancerIP
)

// String names k as messages do.
func (k Kind) String() string {
	switch k {
	case ClusterIP:
		return "cluster IP"
	case ExternalIP:
		return "external IP"
	case LoadBalancerIP:
		return "load balancer IP"
	}
	return "address"
}

// Rules are the settings the predicates depend on, the agent's flags.
type Rules struct {
	// NodePorts is the API server's --service-node-port-range; zero
	// means DefaultNodePortRange.
	NodePorts PortRange
	// BindsServiceAddresses is set when the dataplane makes every
	// service address local to the node (IPVS binds them to its dummy
	// link): a service address then captures its address on every port.
	BindsServiceAddresses bool
	// NodeAddressesAnyPort lets external and load balancer IPs that are
	// the node's own addresses use any port, as kube-proxy does
	// (--allow-node-address-service-ports). Cluster IPs stay refused.
	NodeAddressesAnyPort bool
}

// NodePortRange returns r.NodePorts, or DefaultNodePortRange when unset.
func (r Rules) NodePortRange() PortRange {
	if r.NodePorts.Size == 0 {
		return DefaultNodePortRange
	}
	return r.NodePorts
}

// Address returns why a, a Service address of kind k serving ports,
// captures one of the control plane addresses cps or the node's own
// addresses node, or nil when it captures neither. a must be unmapped and
// without zone, as node's addresses.
//
// A control plane address may be none of the Service's addresses on the
// control plane's port; nor on any port when it is a cluster IP (nftables
// rejects traffic to a cluster IP on ports no Service serves) or when the
// dataplane binds service addresses. The node's own address may be no
// cluster IP, and an external or load balancer IP only on ports of the
// node port range (it then behaves as a NodePort would), unless
// NodeAddressesAnyPort.
func (r Rules) Address(k Kind, a netip.Addr, ports []int32, cps []netip.AddrPort, node []netip.Addr) error {
	cpAnyPort := k == ClusterIP || r.BindsServiceAddresses
	for _, cp := range cps {
		if a != cp.Addr().Unmap() {
			continue
		}
		if cpAnyPort {
			return fmt.Errorf("%s %s is control plane address %s", k, a, cp)
		}
		for _, p := range ports {
			if p == int32(cp.Port()) {
				return fmt.Errorf("%s %s port %d captures control plane address %s", k, a, p, cp)
			}
		}
	}
	nr := r.NodePortRange()
	for _, n := range node {
		if a != n {
			continue
		}
		if k == ClusterIP {
			return fmt.Errorf("%s %s is an address of the node", k, a)
		}
		if r.NodeAddressesAnyPort {
			continue
		}
		for _, p := range ports {
			if !nr.Contains(p) {
				return fmt.Errorf("%s %s is an address of the node, and port %d is outside the node port range %s", k, a, p, nr)
			}
		}
	}
	return nil
}

// resolveTimeout bounds the lookup of control plane names in Resolve.
const resolveTimeout = 5 * time.Second

// Resolve turns control plane addresses as the agents' --control-plane
// lists them (host:port, the host an IP or a name) into addresses. Names
// are resolved once, here, within a few seconds: the addresses they have
// now are protected, those they take later are not. An entry that cannot
// be read or resolved is logged and skipped.
func Resolve(ctx context.Context, addrs []string, log *slog.Logger) []netip.AddrPort {
	var out []netip.AddrPort
	for _, cp := range addrs {
		host, port, err := net.SplitHostPort(cp)
		if err != nil {
			log.Warn("control plane address is not host:port; tables are not checked against it", "controlPlane", cp, "err", err)
			continue
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			log.Warn("control plane port is not a number; tables are not checked against it", "controlPlane", cp)
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			out = append(out, netip.AddrPortFrom(a.WithZone(""), uint16(n)))
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		ips, err := net.DefaultResolver.LookupNetIP(lctx, "ip", host)
		cancel()
		if err != nil {
			log.Warn("cannot resolve the control plane's name; tables are not checked against its addresses", "controlPlane", cp, "err", err)
			continue
		}
		for _, a := range ips {
			out = append(out, netip.AddrPortFrom(a.Unmap(), uint16(n)))
		}
	}
	return out
}
