package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Family is an IP family. Every dataplane programs one family: kube-proxy
// runs one proxier per family, and iptables, nf_tables, ipsets, conntrack
// and the rules around IPVS keep the two families apart.
type Family int

const (
	// IPv4 is the IPv4 family.
	IPv4 Family = 4
	// IPv6 is the IPv6 family.
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// Has reports whether a belongs to the family. An IPv4-mapped IPv6
// address is IPv6: unmap it first where the table may hold one.
func (f Family) Has(a netip.Addr) bool { return a.Is4() == (f == IPv4) }

// Loopback returns the family's loopback prefix: 127.0.0.0/8 or ::1/128.
func (f Family) Loopback() netip.Prefix {
	if f == IPv6 {
		return loopback6
	}
	return loopback4
}

// Addrs returns the addresses of the family in ss, unmapped, in order;
// strings that do not parse are left out.
func (f Family) Addrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil && f.Has(a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// Prefixes returns the CIDRs of the family in ss, masked, in order;
// strings that do not parse are left out.
func (f Family) Prefixes(ss []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil && f.Has(p.Addr()) {
			out = append(out, p.Masked())
		}
	}
	return out
}

// LocalMode says how a dataplane's rules tell traffic from local pods from
// other traffic, as kube-proxy's --detect-local-mode. What each mode does
// to the rules is the dataplane's (see its README): with LocalNone,
// ClusterIP traffic is not masqueraded (unless MasqueradeAll) and eTP
// Local Services do not short-circuit pod traffic.
type LocalMode string

const (
	// LocalNone cannot tell pod traffic apart.
	LocalNone LocalMode = "None"
	// LocalClusterCIDR treats sources in the cluster CIDR of the family
	// (Settings.ClusterCIDRs) as pods.
	LocalClusterCIDR LocalMode = "ClusterCIDR"
	// LocalNodeCIDR treats sources in the node's pod CIDR of the family
	// (the table's NodeInfo.pod_cidrs) as pods.
	LocalNodeCIDR LocalMode = "NodeCIDR"
)

// DefaultMasqueradeBit is kube-proxy's default: bit 14 (0x4000) of the
// packet mark. Other components (kubelet's old KUBE-MARK-DROP used bit 15,
// Calico and Cilium use high bits) avoid it by convention.
const DefaultMasqueradeBit = 14

// Settings are what every dataplane takes from the agent's configuration,
// with the same meaning in each. A backend's Config embeds them beside its
// own fields.
type Settings struct {
	// Family is the IP family programmed; addresses of the other family in
	// the table are ignored.
	Family Family
	// MasqueradeBit is the packet-mark bit (0-31) that flags traffic for
	// SNAT. Taken literally: 0 is bit 0.
	MasqueradeBit int
	// MasqueradeAll masquerades all ClusterIP traffic, as kube-proxy's
	// --masquerade-all.
	MasqueradeAll bool
	// LocalMode says how pod traffic is recognised; "" means LocalNone.
	LocalMode LocalMode
	// ClusterCIDRs are the cluster's pod CIDRs (at most one per family),
	// used with LocalClusterCIDR.
	ClusterCIDRs []string
	// NodePortAddresses limits NodePorts to the node's local addresses in
	// these CIDRs; empty means every local address but loopback (unless
	// NodePortPrimary).
	NodePortAddresses []string
	// NodePortPrimary limits NodePorts to the node's primary address of
	// Family (see PrimaryIPs), as kube-proxy's nodePortAddresses
	// "primary", upstream's default in nftables mode. A family without a
	// primary address, or with a loopback one, takes NodePorts on every
	// address, as upstream then does. NodePortAddresses must be empty.
	NodePortPrimary bool
	// NodeIPs are the node's primary addresses when set by hand
	// (--bind-address): they override those of the table's NodeInfo, as
	// kube-proxy's bindAddress overrides the Node's addresses. Optional.
	NodeIPs []string
	// ConntrackTCPBeLiberal must be set when the node sets
	// net.netfilter.nf_conntrack_tcp_be_liberal: then INVALID packets need
	// not be dropped on forwarding (kube-proxy checks the same sysctl).
	// The nftables dataplane never drops them, as upstream's nftables
	// mode, and ignores it.
	ConntrackTCPBeLiberal bool
	// LocalhostNodePorts accepts NodePorts on the node's IPv4 loopback
	// addresses, as kube-proxy's iptables.localhostNodePorts: the iptables
	// dataplane then sets route_localnet=1 and drops the martians it lets
	// in. Other dataplanes and IPv6 have no localhost NodePorts. Off by
	// default, unlike upstream (docs/semantics.md says why); with it, an
	// IPv4 loopback CIDR in NodePortAddresses is allowed, as upstream.
	LocalhostNodePorts bool
	// NoRandomFully masquerades without fully-random source ports, for
	// iptables older than 1.6.2 or kernels without
	// NF_NAT_RANGE_PROTO_RANDOM_FULLY.
	NoRandomFully bool
}

// DefaultSettings returns the defaults for family, each with its reason.
func DefaultSettings(family Family) Settings {
	return Settings{
		Family:        family,
		MasqueradeBit: DefaultMasqueradeBit,
		// Without a CIDR nothing can be recognised; the agent's options
		// choose ClusterCIDR or NodeCIDR when they have one.
		LocalMode: LocalNone,
	}
}

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

// Validate returns what is wrong with s, in field order, joined; nil when
// nothing is. A backend's Config.Validate joins these with its own and
// wraps them in ErrInvalidConfig.
func (s Settings) Validate() error {
	var errs []error
	if s.Family != IPv4 && s.Family != IPv6 {
		errs = append(errs, fmt.Errorf("family %v: want IPv4 or IPv6", s.Family))
	}
	if s.MasqueradeBit < 0 || s.MasqueradeBit > 31 {
		errs = append(errs, fmt.Errorf("masquerade bit %d: want 0 to 31", s.MasqueradeBit))
	}
	switch s.LocalMode {
	case "", LocalNone, LocalNodeCIDR:
	case LocalClusterCIDR:
		if s.Family == IPv4 || s.Family == IPv6 {
			if _, err := s.ClusterCIDR(); err != nil {
				errs = append(errs, err)
			}
		}
	default:
		errs = append(errs, fmt.Errorf("local mode %q: want ClusterCIDR, NodeCIDR or None", s.LocalMode))
	}
	for _, a := range s.NodePortAddresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("nodePortAddresses: %w", err))
			continue
		}
		// Localhost NodePorts need route_localnet, a hole kube-proxy has
		// to plug with an anti-martian rule (kubernetes#90259): only
		// IPv4 has them, and only with LocalhostNodePorts.
		switch {
		case p.Bits() == 0:
		case p.Overlaps(loopback6):
			errs = append(errs, fmt.Errorf("nodePortAddresses %s: loopback NodePorts are not supported on IPv6", a))
		case p.Overlaps(loopback4) && !s.LocalhostNodePorts:
			errs = append(errs, fmt.Errorf("nodePortAddresses %s: loopback NodePorts need localhostNodePorts", a))
		}
	}
	for _, a := range s.NodeIPs {
		if _, err := netip.ParseAddr(a); err != nil {
			errs = append(errs, fmt.Errorf("nodeIPs: %w", err))
		}
	}
	if s.NodePortPrimary && len(s.NodePortAddresses) > 0 {
		errs = append(errs, fmt.Errorf("nodePortAddresses %v: want none with NodePortPrimary", s.NodePortAddresses))
	}
	return errors.Join(errs...)
}

// ClusterCIDR returns the cluster CIDR of the family. One per family, as
// kube-proxy's ClusterCIDR detector: iptables cannot negate a list of
// sources, and in nf_tables it would take a set per rule (anonymous sets
// are what makes large commits slow).
func (s Settings) ClusterCIDR() (netip.Prefix, error) {
	var found []netip.Prefix
	for _, c := range s.ClusterCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("clusterCIDRs: %w", err)
		}
		if s.Family.Has(p.Addr()) {
			found = append(found, p.Masked())
		}
	}
	switch len(found) {
	case 0:
		return netip.Prefix{}, fmt.Errorf("clusterCIDRs %v: none of family %v for ClusterCIDR mode", s.ClusterCIDRs, s.Family)
	case 1:
		return found[0], nil
	}
	return netip.Prefix{}, fmt.Errorf("clusterCIDRs %v: more than one of family %v", s.ClusterCIDRs, s.Family)
}

// LocalCIDR returns the pod CIDR the LocalMode recognises on node: the
// cluster CIDR, or the node's first pod CIDR of the family (as upstream);
// an invalid prefix when pod traffic cannot be recognised.
func (s Settings) LocalCIDR(node *pb.NodeInfo) netip.Prefix {
	switch s.LocalMode {
	case LocalClusterCIDR:
		if cidr, err := s.ClusterCIDR(); err == nil {
			return cidr
		}
	case LocalNodeCIDR:
		if cidrs := s.Family.Prefixes(node.GetPodCidrs()); len(cidrs) > 0 {
			return cidrs[0]
		}
	}
	return netip.Prefix{}
}

// NodePorts returns where NodePorts answer on the node whose primary
// addresses are primary (PrimaryIPs, which a render computes once): on
// every local address (all), or on the local addresses inside cidrs. With
// NodePortPrimary the cidrs are the node's primary address of the family
// as a /32 or /128, or all when it has none but loopback (upstream turns
// "primary" into such CIDRs, and a family left without any matches all).
// Otherwise they are the NodePortAddresses of the family, where a
// 0.0.0.0/0 or ::/0 means all.
func (s Settings) NodePorts(primary []netip.Addr) (all bool, cidrs []netip.Prefix) {
	if s.NodePortPrimary {
		for _, a := range primary {
			if !a.IsLoopback() {
				cidrs = append(cidrs, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		return len(cidrs) == 0, cidrs
	}
	if len(s.NodePortAddresses) == 0 {
		return true, nil
	}
	cidrs = s.Family.Prefixes(s.NodePortAddresses)
	if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return true, nil
	}
	return false, cidrs
}

// LocalhostNodePortsOn reports whether NodePorts answer on the IPv4
// loopback addresses, as kube-proxy's iptables proxier decides: with
// LocalhostNodePorts, in the IPv4 family, when NodePortAddresses take
// 127.0.0.1 in (none of the family, a /0, or a CIDR holding 127.0.0.0 or
// a loopback address) on the node whose primary addresses are primary.
// Only the iptables dataplane honours it.
func (s Settings) LocalhostNodePortsOn(primary []netip.Addr) bool {
	if !s.LocalhostNodePorts || s.Family != IPv4 {
		return false
	}
	all, cidrs := s.NodePorts(primary)
	return all || slices.ContainsFunc(cidrs, func(p netip.Prefix) bool {
		return p.Overlaps(loopback4)
	})
}

// LoopbackNodePortAddresses returns the NodePortAddresses that hold a
// loopback address, other than a /0: what a dataplane without localhost
// NodePorts must refuse.
func (s Settings) LoopbackNodePortAddresses() []string {
	var out []string
	for _, a := range s.NodePortAddresses {
		if p, err := netip.ParsePrefix(a); err == nil && p.Bits() != 0 && (p.Overlaps(loopback4) || p.Overlaps(loopback6)) {
			out = append(out, a)
		}
	}
	return out
}

// NodeIPAddrs returns the NodeIPs of the family, sorted and unique.
func (s Settings) NodeIPAddrs() []netip.Addr {
	out := s.Family.Addrs(s.NodeIPs)
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// PrimaryIPs returns the node's primary addresses of the family, as
// kube-proxy's detectNodeIPs finds its node IP: the NodeIPs of the family
// (--bind-address) when there are any, else those the control plane read
// from the Node (NodeInfo.node_ips, at most one per family); sorted and
// unique. An address of the family inside a Service's
// loadBalancerSourceRanges lets the node itself reach the load balancer
// IP, as kube-proxy's nodeIP does. node may be nil.
func (s Settings) PrimaryIPs(node *pb.NodeInfo) []netip.Addr {
	if out := s.NodeIPAddrs(); len(out) > 0 {
		return out
	}
	out := s.Family.Addrs(node.GetNodeIps())
	for i := range out {
		out[i] = out[i].WithZone("")
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
