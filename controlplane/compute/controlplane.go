package compute

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// ControlPlanePortName is the name of the control plane Service's port on
// which agents connect (deploy/controlplane.yaml).
const ControlPlanePortName = "grpc"

// MaxControlPlaneAddresses bounds the addresses every NodeInfo carries: a
// few replicas, of two families, fit many times over, and a Service
// wrongly selecting a thousand pods must not grow every node's table.
const MaxControlPlaneAddresses = 32

// ControlPlaneAddresses are the control plane's current replica addresses,
// as every NodeInfo carries them for agents to dial. It is immutable; the
// nil value is the empty list (unknown).
type ControlPlaneAddresses struct {
	addrs []string // "host:port", sorted by address then port, unique
}

// BuildControlPlaneAddresses returns the addresses on which the ready
// endpoints of svc, the control plane's own Service, serve its port named
// portName, from svc's EndpointSlices. The replicas use host networking,
// so the endpoints are node addresses: exactly what agents must dial,
// without depending on the Service rules the agents program. svc nil (the
// Service does not exist) gives the empty list, as does a Service without
// ready endpoints: agents then keep to their configured addresses.
//
// Like kube-proxy, it reads the first address of each endpoint, takes a
// nil ready condition as ready, and reads a port's number from the slice
// that lists the endpoint, so a rollout changing the port is followed
// slice by slice. IPv4 and IPv6 slices both count; FQDN slices, and
// addresses that are not unicast IPs, do not. At most
// MaxControlPlaneAddresses are kept, the lowest.
func BuildControlPlaneAddresses(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice, portName string) *ControlPlaneAddresses {
	if svc == nil {
		return nil
	}
	var found []netip.AddrPort
	for _, s := range epSlices {
		if s == nil || (s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		port, ok := namedTCPPort(s, portName)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 || (ep.Conditions.Ready != nil && !*ep.Conditions.Ready) {
				continue
			}
			a, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() || a.IsMulticast() ||
				a.Is4() != (s.AddressType == discoveryv1.AddressTypeIPv4) {
				continue
			}
			found = append(found, netip.AddrPortFrom(a, port))
		}
	}
	if len(found) == 0 {
		return nil
	}
	slices.SortFunc(found, netip.AddrPort.Compare)
	found = slices.Compact(found)
	found = found[:min(len(found), MaxControlPlaneAddresses)]
	c := &ControlPlaneAddresses{addrs: make([]string, len(found))}
	for i, ap := range found {
		c.addrs[i] = ap.String()
	}
	return c
}

// namedTCPPort returns the number of s's TCP port called name.
func namedTCPPort(s *discoveryv1.EndpointSlice, name string) (uint16, bool) {
	for _, p := range s.Ports {
		if p.Name == nil || *p.Name != name || p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			continue
		}
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		return uint16(*p.Port), true
	}
	return 0, false
}

// List returns the addresses, sorted. The slice is shared: do not modify
// it.
func (c *ControlPlaneAddresses) List() []string {
	if c == nil {
		return nil
	}
	return c.addrs
}

// Equal reports whether c and o hold the same addresses.
func (c *ControlPlaneAddresses) Equal(o *ControlPlaneAddresses) bool {
	return slices.Equal(c.List(), o.List())
}
