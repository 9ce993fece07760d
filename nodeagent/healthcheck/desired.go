package healthcheck

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// family is an IP family. Upstream runs one proxier, and so one health
// check server, per family; this package keeps the split in its data.
type family int

const (
	ipv4 family = iota
	ipv6
	numFamilies
)

func familyOf(a netip.Addr) family {
	if a.Unmap().Is4() {
		return ipv4
	}
	return ipv6
}

func (f family) String() string { return [...]string{"IPv4", "IPv6"}[f] }

// network is the listen network of f: "tcp4" or "tcp6", never "tcp", so
// that the two families' sockets on one port do not collide (a "tcp"
// wildcard socket would take both).
func (f family) network() string { return [...]string{"tcp4", "tcp6"}[f] }

func (f family) unspecified() netip.Addr {
	if f == ipv4 {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// service is what one health check node port answers for.
type service struct {
	namespace, name string
	// endpoints holds, for each IP family of the Service's cluster IPs,
	// the number of distinct ready local endpoint addresses of that
	// family. A family missing here gets no listener, as the upstream
	// proxier of that family does not know the Service.
	endpoints map[family]int
}

func (s service) key() string { return s.namespace + "/" + s.name }

// desired computes the health check node ports t asks for: every Service
// with externalTrafficPolicy Local and a healthCheckNodePort, by port. It
// counts what upstream's LocalReadyEndpoints counts: local endpoints that
// are ready (serving-terminating ones are left out, so that a node with
// only those fails the check and the load balancer drains it), each
// address once however many ports it serves on. Two Services on one port
// are a conflict, returned as errors wrapping ErrPortConflict; the Service
// first by key keeps the port. A nil t asks for nothing.
func desired(t *proxytable.Table) (map[int32]service, []error) {
	want := map[int32]service{}
	if t == nil {
		return want, nil
	}
	var errs []error
	for _, key := range t.Keys() {
		s := t.Entries[key].GetService()
		port := s.GetHealthCheckNodePort()
		if s.GetExternalTrafficPolicy() != pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL || port == 0 {
			continue
		}
		if other, taken := want[port]; taken {
			errs = append(errs, fmt.Errorf("%w: port %d of %s is taken by %s", ErrPortConflict, port, key, other.key()))
			continue
		}
		want[port] = service{namespace: s.GetNamespace(), name: s.GetName(), endpoints: localReady(s)}
	}
	return want, errs
}

// localReady counts the distinct ready local endpoint addresses of s by
// family, for the families of its cluster IPs.
func localReady(s *pb.Service) map[family]int {
	counts := map[family]int{}
	for _, ip := range s.GetClusterIps() {
		if a, err := netip.ParseAddr(ip); err == nil {
			counts[familyOf(a)] = 0
		}
	}
	seen := map[netip.Addr]bool{}
	for _, pe := range s.GetLocalEndpoints() {
		for _, ep := range pe.GetEndpoints() {
			a, err := netip.ParseAddr(ep.GetIp())
			if err != nil || !ep.GetReady() || seen[a.Unmap()] {
				continue
			}
			seen[a.Unmap()] = true
			if _, ok := counts[familyOf(a)]; ok {
				counts[familyOf(a)]++
			}
		}
	}
	return counts
}

// addressPolicy is --nodeport-addresses split by family, as upstream
// splits it between its per-family proxiers: a nil list means every
// address of the family.
type addressPolicy [numFamilies][]netip.Prefix

// newAddressPolicy splits cidrs by family. A family without a prefix, or
// with a /0 among them, matches all its addresses, as upstream's
// NodePortAddresses.MatchAll.
func newAddressPolicy(cidrs []netip.Prefix) addressPolicy {
	var p addressPolicy
	var all [numFamilies]bool
	for _, c := range cidrs {
		if !c.IsValid() {
			continue
		}
		f := familyOf(c.Addr())
		if c.Bits() == 0 {
			all[f] = true
		}
		p[f] = append(p[f], c)
	}
	for f := range numFamilies {
		if all[f] {
			p[f] = nil
		}
	}
	return p
}

// needsInterfaces reports whether some family is restricted to node
// addresses, which must then be listed.
func (p addressPolicy) needsInterfaces() bool { return p[ipv4] != nil || p[ipv6] != nil }

// addresses returns, by family, the hosts a health check port listens on:
// the family's unspecified address when it matches all, else the node's
// addresses (ifaddrs, from net.InterfaceAddrs) inside its prefixes, each
// once, sorted. A restricted family with no matching address gets no
// listener, as upstream.
func (p addressPolicy) addresses(ifaddrs []net.Addr) [numFamilies][]netip.Addr {
	var out [numFamilies][]netip.Addr
	for f := range numFamilies {
		if p[f] == nil {
			out[f] = []netip.Addr{f.unspecified()}
			continue
		}
		for _, ia := range ifaddrs {
			var ip net.IP
			switch v := ia.(type) {
			case *net.IPNet:
				ip = v.IP
			case *net.IPAddr:
				ip = v.IP
			default:
				continue
			}
			a, ok := netip.AddrFromSlice(ip)
			if !ok {
				continue
			}
			a = a.Unmap()
			if familyOf(a) != f || slices.Contains(out[f], a) {
				continue
			}
			if slices.ContainsFunc(p[f], func(c netip.Prefix) bool { return c.Contains(a) }) {
				out[f] = append(out[f], a)
			}
		}
		slices.SortFunc(out[f], netip.Addr.Compare)
	}
	return out
}
