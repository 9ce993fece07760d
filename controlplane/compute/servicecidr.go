package compute

import (
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
)

// ServiceCIDRs is the cluster's set of service CIDRs, as every NodeInfo
// carries it. It is immutable; the nil value is the empty set.
type ServiceCIDRs struct {
	cidrs []string // canonical, sorted (IPv4 first), unique
}

// BuildServiceCIDRs returns the union of spec.cidrs of objs. Like upstream
// kube-proxy's ServiceCIDRConfig, it takes every object whatever its
// status: a ServiceCIDR being deleted, or not yet Ready, may still hold
// allocated ClusterIPs, and traffic to the others in its range must not
// leave the node either. Unlike upstream's, which deletes an object's
// CIDRs from a running set, it recomputes the union, so two objects with
// the same CIDR (an allowed migration step) keep it until both are gone.
// CIDRs that do not parse are left out; the API server validates them.
func BuildServiceCIDRs(objs []*networkingv1.ServiceCIDR) *ServiceCIDRs {
	var prefixes []netip.Prefix
	for _, o := range objs {
		for _, s := range o.Spec.CIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				prefixes = append(prefixes, p.Masked())
			}
		}
	}
	if len(prefixes) == 0 {
		return nil
	}
	slices.SortFunc(prefixes, comparePrefix)
	prefixes = slices.Compact(prefixes)
	c := &ServiceCIDRs{cidrs: make([]string, len(prefixes))}
	for i, p := range prefixes {
		c.cidrs[i] = p.String()
	}
	return c
}

// comparePrefix orders prefixes by address, then by length.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// List returns the CIDRs, sorted. The slice is shared: do not modify it.
func (c *ServiceCIDRs) List() []string {
	if c == nil {
		return nil
	}
	return c.cidrs
}

// Equal reports whether c and o hold the same CIDRs.
func (c *ServiceCIDRs) Equal(o *ServiceCIDRs) bool { return slices.Equal(c.List(), o.List()) }
