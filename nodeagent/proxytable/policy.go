package proxytable

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/capture"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// PortRange is an inclusive range of ports, as the API server's
// --service-node-port-range.
type PortRange = capture.PortRange

// DefaultNodePortRange is the API server's default --service-node-port-range.
var DefaultNodePortRange = capture.DefaultNodePortRange

// ParsePortRange parses "min-max" (or a single port), as the API server
// parses --service-node-port-range.
func ParsePortRange(s string) (PortRange, error) { return capture.ParsePortRange(s) }

// Policy is what the node agent requires of a table beyond the API
// server's rules (ValidateEntry): that every hash is its content's, and
// that nothing in it can capture what the node needs for itself. The
// control plane cannot be trusted with those: a rogue or buggy replica
// could otherwise cut the node off from every replica for good (the table
// is cached and programmed again at boot) or take a host port.
//
// A nil *Policy checks nothing; the agent always has one. Check is safe
// for concurrent use if NodeAddresses is.
type Policy struct {
	// NodePorts is the range every nodePort and healthCheckNodePort must
	// be in: the API server's --service-node-port-range. Zero means
	// DefaultNodePortRange.
	NodePorts PortRange
	// ControlPlanes are the control plane addresses the agent is
	// configured with (--control-plane); those the checked table names
	// itself, the replicas it learns, count too. No
	// service address may be one of them, nor may a service CIDR hold
	// one, and no node port may be one of their ports (a NodePort
	// answers on every local address, and a replica's address is local
	// on its own node).
	ControlPlanes []netip.AddrPort
	// BindsServiceAddresses is set when the dataplane makes every service
	// address local to the node (IPVS binds them to its dummy link): a
	// service address then captures its address on every port.
	BindsServiceAddresses bool
	// NodeAddresses returns the node's own addresses. A service address
	// equal to one may use only ports of the node port range (it then
	// behaves as a NodePort would), a cluster IP none, and no service
	// CIDR may hold one. Nil for none.
	NodeAddresses func() ([]netip.Addr, error)
	// NodeAddressesAnyPort lets external and load balancer IPs that are
	// the node's own addresses use any port, as kube-proxy does: for
	// clusters whose load balancers hand out node addresses (k3s's
	// ServiceLB) or whose Services list node addresses as external IPs
	// on ports such as 80. Cluster IPs stay refused.
	NodeAddressesAnyPort bool
}

// Check checks t against p: its node, and the entries of keys (all of
// them when keys is nil; keys t does not hold are removals, and skipped).
// A caller passing keys must pass nil when t's control plane addresses
// changed: every entry is then checked against the new ones.
// The error is a *ValidationError, pinned to entries where it can be.
func (p *Policy) Check(t *Table, keys []string) error { return p.check(t, keys, true) }

// CheckVerified is Check of every entry of a table whose hashes are
// known to be their content's already: the cache verifies them when it
// loads a table (VerifyHashes), and the client computes or checks them
// from the bytes of a snapshot with runs without hashes. They are not
// recomputed, which is most of Check's cost.
func (p *Policy) CheckVerified(t *Table) error { return p.check(t, nil, false) }

// check is Check, recomputing the hashes when hashes is set.
func (p *Policy) check(t *Table, keys []string, hashes bool) error {
	if p == nil {
		return nil
	}
	ve := &ValidationError{}
	if hashes {
		if err := checkNodeHash(t.Node); err != nil {
			ve.Table = append(ve.Table, err)
		}
	}
	var node []netip.Addr
	if p.NodeAddresses != nil {
		var err error
		if node, err = p.NodeAddresses(); err != nil {
			// Failing closed: without the node's addresses nothing says
			// the table leaves them alone.
			ve.Table = append(ve.Table, fmt.Errorf("listing the node's addresses: %w", err))
		}
	}
	for i := range node {
		node[i] = node[i].Unmap().WithZone("")
	}
	cps := p.controlPlanes(t.Node)
	if err := p.checkServiceCIDRs(t.Node.GetServiceCidrs(), cps, node); err != nil {
		ve.Table = append(ve.Table, err)
	}
	check := func(e *pb.ServiceEntry) {
		var err error
		if hashes {
			err = checkEntryHash(e)
		}
		if err == nil {
			err = p.checkService(e.GetService(), cps, node)
		}
		if err != nil {
			ve.Entries = append(ve.Entries, &EntryError{Key: e.GetKey(), Err: err})
		}
	}
	if keys == nil {
		// In the map's order, and the errors sorted: sorting every key
		// of a large table costs more than the checks of most entries.
		for _, e := range t.Entries {
			check(e)
		}
		slices.SortFunc(ve.Entries, func(a, b *EntryError) int { return strings.Compare(a.Key, b.Key) })
	} else {
		for _, k := range keys {
			if e, ok := t.Entries[k]; ok {
				check(e)
			}
		}
	}
	if len(ve.Entries)+len(ve.Table) > 0 {
		return ve
	}
	return nil
}

// VerifyHashes checks that the node's and every entry's hash is the one
// their content gives (package tablehash), as the agent does on receipt
// and on loading its cache: a forged entry under the hash of the honest
// one would otherwise look current to every honest replica and never be
// replaced. The error is a *ValidationError.
func VerifyHashes(t *Table) error {
	ve := &ValidationError{}
	if err := checkNodeHash(t.Node); err != nil {
		ve.Table = append(ve.Table, err)
	}
	for _, k := range t.Keys() {
		if err := checkEntryHash(t.Entries[k]); err != nil {
			ve.Entries = append(ve.Entries, &EntryError{Key: k, Err: err})
		}
	}
	if len(ve.Entries)+len(ve.Table) > 0 {
		return ve
	}
	return nil
}

func checkEntryHash(e *pb.ServiceEntry) error {
	h, err := tablehash.Entry(e.GetKey(), e.GetService())
	if err != nil {
		return err
	}
	if h != e.GetHash() {
		return fmt.Errorf("hash %016x is not its content's, %016x", e.GetHash(), h)
	}
	return nil
}

func checkNodeHash(n *pb.NodeInfo) error {
	h, err := tablehash.Node(n)
	if err != nil {
		return err
	}
	if h != n.GetHash() {
		return fmt.Errorf("node info hash %016x is not its content's, %016x", n.GetHash(), h)
	}
	return nil
}

// controlPlanes is every control plane address the agent may dial: the
// configured ones and those the table itself names (the replicas the
// agent learns, NodeInfo.control_plane_addresses). A Service may capture
// neither, or the agent could lose its way back to every replica.
func (p *Policy) controlPlanes(n *pb.NodeInfo) []netip.AddrPort {
	learned := n.GetControlPlaneAddresses()
	if len(learned) == 0 {
		return p.ControlPlanes
	}
	cps := slices.Clone(p.ControlPlanes)
	for _, a := range learned {
		if ap, err := netip.ParseAddrPort(a); err == nil && !slices.Contains(cps, ap) {
			cps = append(cps, ap) // a bad one is validateControlPlaneAddresses' to report
		}
	}
	return cps
}

// rules is p's settings as package capture takes them.
func (p *Policy) rules() capture.Rules {
	return capture.Rules{
		NodePorts:             p.NodePorts,
		BindsServiceAddresses: p.BindsServiceAddresses,
		NodeAddressesAnyPort:  p.NodeAddressesAnyPort,
	}
}

// checkServiceCIDRs refuses service CIDRs holding an address the node
// needs: nftables drops new connections to addresses of the service CIDRs
// that no cluster IP holds, the agent's own to the control plane
// included.
func (p *Policy) checkServiceCIDRs(cidrs []string, cps []netip.AddrPort, node []netip.Addr) error {
	for _, c := range cidrs {
		prefix, err := netip.ParsePrefix(c)
		if err != nil {
			continue // validateServiceCIDRs reports it
		}
		for _, cp := range cps {
			if prefix.Contains(cp.Addr().Unmap()) {
				return fmt.Errorf("service CIDR %s holds control plane address %s", c, cp)
			}
		}
		for _, a := range node {
			if prefix.Contains(a) {
				return fmt.Errorf("service CIDR %s holds the node's address %s", c, a)
			}
		}
	}
	return nil
}

// checkService applies the policy to one Service.
func (p *Policy) checkService(s *pb.Service, cps []netip.AddrPort, node []netip.Addr) error {
	rules := p.rules()
	r := rules.NodePortRange()
	if hc := s.GetHealthCheckNodePort(); hc != 0 && !r.Contains(hc) {
		return fmt.Errorf("healthCheckNodePort %d outside the node port range %s", hc, r)
	}
	for _, cp := range cps {
		if hc := s.GetHealthCheckNodePort(); hc != 0 && hc == int32(cp.Port()) {
			return fmt.Errorf("healthCheckNodePort %d is control plane port %d", hc, cp.Port())
		}
	}
	for _, sp := range s.GetPorts() {
		np := sp.GetNodePort()
		if np == 0 {
			continue
		}
		if !r.Contains(np) {
			return fmt.Errorf("port %q: nodePort %d outside the node port range %s", sp.GetName(), np, r)
		}
		for _, cp := range cps {
			if np == int32(cp.Port()) {
				return fmt.Errorf("port %q: nodePort %d is control plane port %d", sp.GetName(), np, cp.Port())
			}
		}
	}
	var buf [8]int32 // on the stack for most Services: Check runs per entry
	ports := buf[:0]
	for _, sp := range s.GetPorts() {
		ports = append(ports, sp.GetPort())
	}
	for _, f := range []struct {
		kind capture.Kind
		list []string
	}{
		{capture.ClusterIP, s.GetClusterIps()},
		{capture.ExternalIP, s.GetExternalIps()},
		{capture.LoadBalancerIP, s.GetLoadBalancerIps()},
	} {
		for _, ip := range f.list {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				continue // ValidateEntry reports it
			}
			if err := rules.Address(f.kind, a.Unmap(), ports, cps, node); err != nil {
				return err
			}
		}
	}
	return nil
}
