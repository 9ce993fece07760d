package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/proxyplane/proxyplane/internal/capture"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// policy returns what the agent requires of a table (proxytable.Policy):
// node ports in --service-node-port-range, and nothing that captures the
// control plane addresses it dials or the node's own addresses. Names in
// --control-plane are resolved once, here: the addresses they have now
// are protected, those they take later are not (the README says so).
func (o *Options) policy(ctx context.Context, log *slog.Logger) *proxytable.Policy {
	r, _ := proxytable.ParsePortRange(o.NodePortRange) // Validate parsed it
	return &proxytable.Policy{
		NodePorts:             r,
		ControlPlanes:         capture.Resolve(ctx, o.ControlPlanes, log),
		BindsServiceAddresses: o.ProxyMode == "ipvs",
		NodeAddresses:         interfaceAddrs,
		NodeAddressesAnyPort:  o.NodeAddressServicePorts,
	}
}

// interfaceAddrs lists the addresses of the network namespace the agent
// runs in (with host networking, the node's), but those of the IPVS links:
// there IPVS binds the Services' own addresses, and counting them as the
// node's would make every cluster IP capture the node once programmed.
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	var skip []int
	for _, name := range ipvsLinks {
		if i, err := net.InterfaceByName(name); err == nil {
			skip = append(skip, i.Index)
		}
	}
	return nodeAddrs(addrs, skip), nil
}

// nodeAddrs returns the addresses of addrs but those on the links skip.
func nodeAddrs(addrs []netlink.Addr, skip []int) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IPNet == nil || slices.Contains(skip, a.LinkIndex) {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// maxReportedAddrs is the control plane's bound on Hello.node_addresses
// (server.MaxNodeAddresses): a hello listing more is refused.
const maxReportedAddrs = 64

// ipvsLinks hold the service addresses IPVS binds, ours and kube-proxy's
// (during a migration): the Services' addresses, not the node's.
var ipvsLinks = []string{ipvs.DefaultInterface, "kube-ipvs0"}

// reportedAddrs returns the node's addresses that each hello reports
// (client.Options.NodeAddresses): those of interfaceAddrs that a Service
// could name, its global unicast ones, with bridges such as cni0 or
// docker0 that no Node object lists. Without them, a Service naming one
// would be accepted by the control plane and refused by this agent, for
// every later table.
func reportedAddrs(log *slog.Logger) func() []string {
	return func() []string {
		addrs, err := interfaceAddrs()
		if err != nil {
			log.Warn("listing the node's addresses to report", "err", err)
			return nil
		}
		return globalAddrs(addrs, log)
	}
}

// globalAddrs returns the global unicast addresses of addrs: sorted,
// unique, at most maxReportedAddrs.
func globalAddrs(addrs []netip.Addr, log *slog.Logger) []string {
	var all []netip.Addr
	for _, a := range addrs {
		if a.IsGlobalUnicast() {
			all = append(all, a)
		}
	}
	slices.SortFunc(all, netip.Addr.Compare)
	all = slices.Compact(all)
	if len(all) > maxReportedAddrs {
		log.Warn("the node has more addresses than a hello may report; the others are not guarded by the control plane",
			"addresses", len(all), "reported", maxReportedAddrs)
		all = all[:maxReportedAddrs]
	}
	out := make([]string, len(all))
	for i, a := range all {
		out[i] = a.String()
	}
	return out
}
