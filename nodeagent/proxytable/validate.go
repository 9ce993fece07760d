package proxytable

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// ErrInvalidTable is wrapped by every validation failure; the agent NACKs
// such a response and keeps its table.
var ErrInvalidTable = errors.New("invalid table")

// EntryError is a validation failure pinned to one entry, reported in the
// NACK's entry_errors.
type EntryError struct {
	// Key of the entry.
	Key string
	// Err says what is wrong.
	Err error
}

func (e *EntryError) Error() string { return clipText(e.Key) + ": " + clipText(e.Err.Error()) }

// Unwrap returns the underlying error.
func (e *EntryError) Unwrap() error { return e.Err }

// ValidationError lists everything wrong with a table response. It
// matches ErrInvalidTable with errors.Is.
type ValidationError struct {
	// Entries are the failures pinned to entries.
	Entries []*EntryError
	// Table are the failures of the table as a whole.
	Table []error
}

func (e *ValidationError) Error() string {
	errs := make([]error, 0, len(e.Entries)+len(e.Table))
	for _, ee := range e.Entries {
		errs = append(errs, ee)
	}
	return ErrInvalidTable.Error() + ": " + errors.Join(append(errs, e.Table...)...).Error()
}

// Is reports whether target is ErrInvalidTable.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidTable }

// EntryErrors returns the failures pinned to entries of the
// ValidationError in err's chain, as a NACK carries them; nil when err
// holds none.
func EntryErrors(err error) []*pb.EntryError {
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Entries) == 0 {
		return nil
	}
	out := make([]*pb.EntryError, 0, len(ve.Entries))
	for _, e := range ve.Entries {
		out = append(out, &pb.EntryError{Key: e.Key, Error: clipText(e.Err.Error())})
	}
	return out
}

// ValidateEntry checks an entry against the API server's own rules for
// what it carries (a kube-proxy trusts no less, because the API server
// enforced them): names are DNS labels, addresses parse strictly and are
// not special, ports and protocols are in range and unique, and every
// endpoint list names a port of the Service. It needs nothing but the
// entry; the agent's own rules, which need to know the node, are Policy's.
func ValidateEntry(e *pb.ServiceEntry) *EntryError {
	if err := validateService(e.GetKey(), e.GetService()); err != nil {
		return &EntryError{Key: e.GetKey(), Err: err}
	}
	return nil
}

func validateService(key string, s *pb.Service) error {
	if s == nil {
		return errors.New("no service")
	}
	if s.GetNamespace() == "" || s.GetName() == "" || key != s.GetNamespace()+"/"+s.GetName() {
		return fmt.Errorf("key does not match service %s/%s", clip(s.GetNamespace()), clip(s.GetName()))
	}
	// As the API server's ValidateObjectMeta for a Service: the namespace
	// is a DNS-1123 label, the name a DNS-1035 label. Every dataplane
	// writes them into rule comments and object names.
	if msgs := dns1123Label(s.GetNamespace()); len(msgs) > 0 {
		return fmt.Errorf("namespace %s: %s", clip(s.GetNamespace()), clipMsgs(msgs))
	}
	if msgs := dns1035Label(s.GetName()); len(msgs) > 0 {
		return fmt.Errorf("name %s: %s", clip(s.GetName()), clipMsgs(msgs))
	}
	if n := len(s.GetClusterIps()); n == 0 || n > 2 {
		return fmt.Errorf("%d cluster IPs, want 1 or 2", n)
	}
	var families [2]bool
	for i, ip := range s.GetClusterIps() {
		a, err := serviceAddr("clusterIPs", i, ip)
		if err != nil {
			return err
		}
		if families[boolIndex(a.Is6())] {
			return fmt.Errorf("cluster IPs %v: two of one family", s.GetClusterIps())
		}
		families[boolIndex(a.Is6())] = true
	}
	for _, f := range []struct {
		name string
		list []string
	}{{"externalIPs", s.GetExternalIps()}, {"loadBalancerIPs", s.GetLoadBalancerIps()}} {
		for i, ip := range f.list {
			if _, err := serviceAddr(f.name, i, ip); err != nil {
				return err
			}
		}
	}
	// Source ranges only narrow who reaches a load balancer IP: any
	// prefix is safe (netip refuses zones).
	for _, r := range s.GetLoadBalancerSourceRanges() {
		if _, err := netip.ParsePrefix(r); err != nil {
			return fmt.Errorf("source range: %w", err)
		}
	}
	if p := s.GetHealthCheckNodePort(); p < 0 || p > 65535 {
		return fmt.Errorf("healthCheckNodePort %d out of range", p)
	}
	if a := s.GetSessionAffinity(); a != nil && (a.GetTimeoutSeconds() < 1 || a.GetTimeoutSeconds() > 86400) {
		return fmt.Errorf("affinity timeout %d out of range", a.GetTimeoutSeconds())
	}
	if err := validatePorts(s.GetPorts()); err != nil {
		return err
	}
	ports := make(map[string]bool, len(s.GetPorts()))
	for _, p := range s.GetPorts() {
		ports[p.GetName()] = true
	}
	for _, set := range [][]*pb.PortEndpoints{s.GetClusterEndpoints(), s.GetLocalEndpoints()} {
		for _, pe := range set {
			if !ports[pe.GetPortName()] {
				return fmt.Errorf("endpoints for unknown port %s", clip(pe.GetPortName()))
			}
			for _, ep := range pe.GetEndpoints() {
				if err := endpointAddr(ep.GetIp()); err != nil {
					return err
				}
				if ep.GetPort() < 1 || ep.GetPort() > 65535 {
					return fmt.Errorf("endpoint %s: port %d out of range", ep.GetIp(), ep.GetPort())
				}
			}
		}
	}
	return nil
}

// validatePorts applies the API server's validateServicePort and its
// uniqueness checks: a name is required of every port of a multi-port
// Service and is a DNS-1123 label; names, protocol and port pairs, and
// protocol and node port pairs are unique.
func validatePorts(ports []*pb.ServicePort) error {
	names := make(map[string]bool, len(ports))
	type protoPort struct {
		proto pb.Protocol
		port  int32
	}
	seen, nodePorts := map[protoPort]bool{}, map[protoPort]bool{}
	for _, p := range ports {
		if p.GetName() != "" {
			if msgs := dns1123Label(p.GetName()); len(msgs) > 0 {
				return fmt.Errorf("port name %s: %s", clip(p.GetName()), clipMsgs(msgs))
			}
		}
		switch {
		case names[p.GetName()]:
			return fmt.Errorf("duplicate port %q", p.GetName())
		case p.GetName() == "" && len(ports) > 1:
			return errors.New("a port without a name in a Service of several")
		case p.GetProtocol() == pb.Protocol_PROTOCOL_UNSPECIFIED || pb.Protocol_name[int32(p.GetProtocol())] == "":
			return fmt.Errorf("port %q: unknown protocol %d", p.GetName(), p.GetProtocol())
		case p.GetPort() < 1 || p.GetPort() > 65535:
			return fmt.Errorf("port %q: port %d out of range", p.GetName(), p.GetPort())
		case p.GetNodePort() < 0 || p.GetNodePort() > 65535:
			return fmt.Errorf("port %q: nodePort %d out of range", p.GetName(), p.GetNodePort())
		case seen[protoPort{p.GetProtocol(), p.GetPort()}]:
			return fmt.Errorf("port %q: %s port %d used twice", p.GetName(), p.GetProtocol(), p.GetPort())
		case p.GetNodePort() != 0 && nodePorts[protoPort{p.GetProtocol(), p.GetNodePort()}]:
			return fmt.Errorf("port %q: %s nodePort %d used twice", p.GetName(), p.GetProtocol(), p.GetNodePort())
		}
		names[p.GetName()] = true
		seen[protoPort{p.GetProtocol(), p.GetPort()}] = true
		if p.GetNodePort() != 0 {
			nodePorts[protoPort{p.GetProtocol(), p.GetNodePort()}] = true
		}
	}
	return nil
}

// serviceAddr parses a cluster, external or load balancer IP as the API
// server's strict validation of those fields does, and refuses the
// addresses that no Service may take: a dataplane captures traffic to
// them, and the unspecified, loopback, link-local and multicast addresses
// are the node's own business. For external IPs, which any Service
// author sets, the set is exactly what the API server refuses
// (ValidateEndpointIP: multicast only link-local): refusing more would let
// any of them make every agent NACK every table. Cluster IPs come from
// the service CIDRs and load balancer IPs from privileged controllers
// (the API server checks only their syntax): for them every multicast
// address and the broadcast address are refused too, and the control
// plane is expected to leave such values out rather than send them.
func serviceAddr(fieldName string, i int, s string) (netip.Addr, error) {
	a, err := strictAddr(fieldName, i, s)
	if err != nil {
		return netip.Addr{}, err
	}
	why := special(a, fieldName != "externalIPs")
	if a.Zone() != "" {
		why = "an address with a zone"
	}
	if why != "" {
		return netip.Addr{}, fmt.Errorf("%s[%d] %s: %s", fieldName, i, clip(s), why)
	}
	return a, nil
}

// special says why no Service may take a; "" when it may. Without
// strict, only what the API server refuses for external IPs.
func special(a netip.Addr, strict bool) string {
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	case a.IsLinkLocalMulticast():
		return "a link-local multicast address"
	case strict && a.IsMulticast():
		return "a multicast address"
	case strict && a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	return ""
}

// endpointAddr applies the API server's ValidateEndpointIP: an endpoint
// may not be unspecified, loopback or link-local (the node's own
// services, and cloud metadata at 169.254.169.254, would become reachable
// through every Service).
func endpointAddr(s string) error {
	a, err := strictAddr("endpoint", -1, s)
	if err != nil {
		return err
	}
	switch {
	case a.Zone() != "":
		return fmt.Errorf("endpoint %q: an address with a zone", s)
	case a.IsUnspecified(), a.IsLoopback(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return fmt.Errorf("endpoint %q: unspecified, loopback or link-local", s)
	}
	return nil
}

// clipLen bounds what a NACK quotes of a value: the control plane stores
// and shows the text, and a hostile value may be megabytes.
const clipLen = 80

// clip quotes s, cut to clipLen bytes.
func clip(s string) string {
	if len(s) > clipLen {
		return strconv.Quote(s[:clipLen]) + "..."
	}
	return strconv.Quote(s)
}

// CutUTF8 returns s cut to at most max bytes on a rune boundary, so that
// text quoted from a rogue table stays valid UTF-8: a NACK carrying a
// string field that is not cannot even be encoded.
func CutUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// clipText cuts an error's text to 8*clipLen bytes: addresses and
// prefixes that fail to parse are quoted whole by the parsers.
func clipText(s string) string {
	if c := CutUTF8(s, 8*clipLen); len(c) < len(s) {
		return c + "..."
	}
	return s
}

// clipMsgs joins validation messages; those quote no value but are cut
// all the same.
func clipMsgs(msgs []string) string {
	out := strings.Join(msgs, "; ")
	if c := CutUTF8(out, 4*clipLen); len(c) < len(out) {
		return c + "..."
	}
	return out
}

// The checks below are what the apimachinery validators decide, done
// without their regular expressions and allocations on the way that
// succeeds: an agent validates every entry of every snapshot (and the
// fleet harness thousands of agents' worth). On failure the validator
// itself says why, in the API server's words.

// dns1123Label is validation.IsDNS1123Label.
func dns1123Label(s string) []string {
	if isLabel(s, false) {
		return nil
	}
	return validation.IsDNS1123Label(s)
}

// dns1035Label is validation.IsDNS1035Label.
func dns1035Label(s string) []string {
	if isLabel(s, true) {
		return nil
	}
	return validation.IsDNS1035Label(s)
}

// isLabel reports whether s is a DNS label: 1 to 63 of [a-z0-9-],
// starting and ending alphanumeric; with letterFirst (DNS-1035), starting
// with a letter.
func isLabel(s string, letterFirst bool) bool {
	if len(s) == 0 || len(s) > validation.DNS1123LabelMaxLength {
		return false
	}
	for i := range len(s) {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		switch {
		case i == 0 && letterFirst && (c < 'a' || c > 'z'):
			return false
		case (i == 0 || i == len(s)-1) && !alnum:
			return false
		case !alnum && c != '-':
			return false
		}
	}
	return true
}

// strictAddr parses s as validation.IsValidIPForLegacyField with strict
// validation does (no leading zeros, no IPv4-mapped IPv6; netip refuses
// the first), and refuses a zone, which the API server never accepts.
// The field path (index i, unless negative) is built only for an error.
func strictAddr(fieldName string, i int, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Is4In6() {
		path := field.NewPath(fieldName)
		if i >= 0 {
			path = path.Index(i)
		}
		if errs := validation.IsValidIPForLegacyField(path, s, true, nil); len(errs) > 0 {
			return netip.Addr{}, errs.ToAggregate()
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	return a, nil
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Service CIDR sizes: the shortest prefix accepted per family. IPv6 takes
// upstream's own bound (the ServiceCIDR allocator refuses prefixes shorter
// than /64). For IPv4 upstream set /12 on --service-cluster-ip-range and
// none since ServiceCIDR objects; /8 accepts every range either ever
// allowed many times over while refusing 0.0.0.0/0 and its kin, whose
// drop rule (nftables' cluster-ips check) would cut the node off.
const (
	minServiceCIDRBits4 = 8
	minServiceCIDRBits6 = 64
)

// validateServiceCIDRs checks that each service CIDR is a prefix in
// canonical form, as the control plane sends them, of a sane size, and
// clear of the addresses no Service may take: a dataplane drops traffic
// to them, so one it could not read would leave addresses routed off the
// node without a word, one with host bits set would be read differently
// by different dataplanes, and one covering loopback or link-local
// addresses, or half the Internet, would drop the node's own traffic.
func validateServiceCIDRs(cidrs []string) error {
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("service CIDR: %w", err)
		}
		shortest := minServiceCIDRBits4
		if p.Addr().Is6() {
			shortest = minServiceCIDRBits6
		}
		switch {
		case p.Masked() != p:
			return fmt.Errorf("service CIDR %q: host bits set, want %s", c, p.Masked())
		case p.Addr().Is4In6() || p.Addr().Zone() != "":
			return fmt.Errorf("service CIDR %q: an IPv4-mapped or zoned prefix", c)
		case p.Bits() < shortest:
			return fmt.Errorf("service CIDR %q: wider than /%d", c, shortest)
		}
		for _, r := range specialPrefixes {
			if p.Overlaps(r) {
				return fmt.Errorf("service CIDR %q overlaps %s", c, r)
			}
		}
	}
	return nil
}

// specialPrefixes are the ranges no service CIDR may overlap: "this
// network", loopback, link-local and multicast.
var specialPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("::/128"), netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("ff00::/8"),
}

// validateNodeIPs checks the node's primary IPs as the control plane
// renders them: addresses in canonical form (unmapped, no zone), at most
// one per family, since NodePorts with nodePortAddresses "primary" open
// on them.
func validateNodeIPs(ips []string) error {
	var seen [2]bool
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
			return fmt.Errorf("node IP: %w", err)
		case a.String() != s || a.Is4In6():
			return fmt.Errorf("node IP %q: not in canonical form", s)
		case a.IsUnspecified() || a.IsMulticast():
			return fmt.Errorf("node IP %q: not a unicast address", s)
		}
		f := 0
		if a.Is6() {
			f = 1
		}
		if seen[f] {
			return fmt.Errorf("node IPs %q: more than one of a family", ips)
		}
		seen[f] = true
	}
	return nil
}

// maxControlPlaneAddresses bounds the learned control plane addresses a
// table may carry: the control plane sends at most 32, and every one is
// dialled in turn.
const maxControlPlaneAddresses = 64

// validateControlPlaneAddresses checks the control plane's replica
// addresses as the control plane renders them: "ip:port" with the IP in
// canonical form (unmapped, no zone, IPv6 in brackets), unicast, a port
// from 1 to 65535, each once, and a bounded number. The agent dials them
// (TLS still verifies the control plane's name), so a table with one it
// could not dial, or a name it would resolve, is refused rather than
// partly used.
func validateControlPlaneAddresses(addrs []string) error {
	if len(addrs) > maxControlPlaneAddresses {
		return fmt.Errorf("%d control plane addresses, want at most %d", len(addrs), maxControlPlaneAddresses)
	}
	seen := make(map[netip.AddrPort]bool, len(addrs))
	for _, s := range addrs {
		ap, err := netip.ParseAddrPort(s)
		switch {
		case err != nil:
			return fmt.Errorf("control plane address: %w", err)
		case ap.String() != s || ap.Addr().Is4In6() || ap.Addr().Zone() != "":
			return fmt.Errorf("control plane address %q: not in canonical form", s)
		case ap.Addr().IsUnspecified() || ap.Addr().IsMulticast():
			return fmt.Errorf("control plane address %q: not a unicast address", s)
		case ap.Port() == 0:
			return fmt.Errorf("control plane address %q: port 0", s)
		case seen[ap]:
			return fmt.Errorf("control plane address %q listed twice", s)
		}
		seen[ap] = true
	}
	return nil
}
