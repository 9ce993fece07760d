package app

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// resolveTimeout bounds the start-up lookup of control plane names: the
// agent programs its cached table only after it, and a name that does not
// resolve in time is dialled (and resolved) later anyway.
const resolveTimeout = 5 * time.Second

// policy returns what the agent requires of a table (proxytable.Policy):
// node ports in --service-node-port-range, and nothing that captures the
// control plane addresses it dials or the node's own addresses. Names in
// --control-plane are resolved once, here: the addresses they have now
// are protected, those they take later are not (the README says so).
func (o *Options) policy(ctx context.Context, log *slog.Logger) *proxytable.Policy {
	r, _ := proxytable.ParsePortRange(o.NodePortRange) // Validate parsed it
	p := &proxytable.Policy{
		NodePorts:             r,
		BindsServiceAddresses: o.ProxyMode == "ipvs",
		NodeAddresses:         interfaceAddrs,
		NodeAddressesAnyPort:  o.NodeAddressServicePorts,
	}
	for _, cp := range o.ControlPlanes {
		host, port, err := net.SplitHostPort(cp)
		if err != nil {
			continue // Validate refused it
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			log.Warn("control plane port is not a number; tables are not checked against it", "controlPlane", cp)
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			p.ControlPlanes = append(p.ControlPlanes, netip.AddrPortFrom(a.WithZone(""), uint16(n)))
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		addrs, err := net.DefaultResolver.LookupNetIP(lctx, "ip", host)
		cancel()
		if err != nil {
			log.Warn("cannot resolve the control plane's name; tables are not checked against its addresses", "controlPlane", cp, "err", err)
			continue
		}
		for _, a := range addrs {
			p.ControlPlanes = append(p.ControlPlanes, netip.AddrPortFrom(a.Unmap(), uint16(n)))
		}
	}
	return p
}

// interfaceAddrs lists the addresses of the network namespace the agent
// runs in: with host networking, the node's.
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
