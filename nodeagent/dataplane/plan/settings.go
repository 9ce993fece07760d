package plan

import (
	"fmt"
	"net/netip"
	"slices"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Family is an IP family. Every dataplane programs one family: kube-proxy
// runs one proxier per family, and iptables, nf_tables, ipsets and the
// rules around IPVS keep the two families apart.
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
// to the rules is the dataplane's (see its README).
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

// Settings are the Config fields every dataplane has, with the same
// meaning in each: see the dataplanes' Config for their documentation.
type Settings struct {
	Family            Family
	MasqueradeBit     int
	LocalMode         LocalMode
	ClusterCIDRs      []string
	NodePortAddresses []string
	NodeIPs           []string
}

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

// Validate returns what is wrong with s, in field order; the Family
// itself is the caller's to check.
func (s Settings) Validate() []error {
	var errs []error
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
		// to plug with an anti-martian rule (kubernetes#90259); no
		// dataplane offers them.
		if p.Bits() != 0 && (p.Overlaps(loopback4) || p.Overlaps(loopback6)) {
			errs = append(errs, fmt.Errorf("nodePortAddresses %s: loopback NodePorts are not supported", a))
		}
	}
	for _, a := range s.NodeIPs {
		if _, err := netip.ParseAddr(a); err != nil {
			errs = append(errs, fmt.Errorf("nodeIPs: %w", err))
		}
	}
	return errs
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

// NodePorts returns where NodePorts answer: on every local address (all),
// or on the local addresses inside cidrs, the NodePortAddresses of the
// family. A 0.0.0.0/0 or ::/0 among them means all.
func (s Settings) NodePorts() (all bool, cidrs []netip.Prefix) {
	if len(s.NodePortAddresses) == 0 {
		return true, nil
	}
	cidrs = s.Family.Prefixes(s.NodePortAddresses)
	if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return true, nil
	}
	return false, cidrs
}

// NodeIPAddrs returns the node addresses of the family, sorted and unique.
func (s Settings) NodeIPAddrs() []netip.Addr {
	out := s.Family.Addrs(s.NodeIPs)
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
