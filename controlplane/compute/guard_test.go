package compute

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyplane/proxyplane/internal/capture"
)

// TestBuildGuardedDropsCaptures checks that an external or load balancer
// IP that every agent would refuse (it captures a control plane address,
// or a node's own address on a host port) is left out alone, as an
// invalid value is, with a ReasonInvalidValue Problem naming it, and that
// the rest of the Service is proxied: the tenant's Service must not make
// every agent refuse every later table.
func TestBuildGuardedDropsCaptures(t *testing.T) {
	cp := netip.MustParseAddrPort("192.168.0.10:9640")
	node := netip.MustParseAddr("192.168.0.21")
	guard := NewGuard([]netip.AddrPort{cp}, []netip.Addr{node, netip.MustParseAddr("fd00::21")}, capture.PortRange{}, false)
	anyPort := NewGuard([]netip.AddrPort{cp}, []netip.Addr{node}, capture.PortRange{}, true)
	http := svcPort("http", corev1.ProtocolTCP, 80, 0)
	nodePortRange := svcPort("np", corev1.ProtocolTCP, 30080, 0)
	for _, tc := range []struct {
		name      string
		svc       *corev1.Service
		guard     *Guard
		wantExt   []string
		wantLB    []string
		wantProbs []string // substrings of each Problem's message, in order
	}{
		{
			name:      "external IP on the control plane's port",
			svc:       newService(withPorts(svcPort("grpc", corev1.ProtocolTCP, 9640, 0)), withExternalIPs("192.168.0.10", "203.0.113.1")),
			guard:     guard,
			wantExt:   []string{"203.0.113.1"},
			wantProbs: []string{`externalIPs[0] "192.168.0.10": external IP 192.168.0.10 is control plane address 192.168.0.10:9640: left out`},
		},
		{
			// An agent whose dataplane binds service addresses (IPVS)
			// refuses it on any port, and entries are the same for all.
			name:      "external IP on another port of a control plane address",
			svc:       newService(withExternalIPs("192.168.0.10")),
			guard:     anyPort,
			wantProbs: []string{"is control plane address 192.168.0.10:9640"},
		},
		{
			name: "load balancer IP of a control plane address",
			svc: newService(withType(corev1.ServiceTypeLoadBalancer),
				withIngress(corev1.LoadBalancerIngress{IP: "198.51.100.7"}, corev1.LoadBalancerIngress{IP: "192.168.0.10"})),
			guard:     guard,
			wantLB:    []string{"198.51.100.7"},
			wantProbs: []string{`status.loadBalancer.ingress[1].ip "192.168.0.10": load balancer IP 192.168.0.10 is control plane address`},
		},
		{
			name:      "a node's address on a host port",
			svc:       newService(withPorts(http), withExternalIPs("192.168.0.21")),
			guard:     guard,
			wantProbs: []string{"external IP 192.168.0.21 is an address of the node, and port 80 is outside the node port range 30000-32767"},
		},
		{
			name:    "a node's address on a node port range port",
			svc:     newService(withPorts(nodePortRange), withExternalIPs("192.168.0.21")),
			guard:   guard,
			wantExt: []string{"192.168.0.21"},
		},
		{
			name:    "a node's address on a host port, allowed",
			svc:     newService(withPorts(http), withExternalIPs("192.168.0.21")),
			guard:   anyPort,
			wantExt: []string{"192.168.0.21"},
		},
		{
			name:      "a node's IPv6 address, written sloppily",
			svc:       newService(withPorts(http), withExternalIPs("FD00:0::21")),
			guard:     guard,
			wantProbs: []string{"external IP fd00::21 is an address of the node"},
		},
		{
			name:    "no guard",
			svc:     newService(withPorts(http), withExternalIPs("192.168.0.10", "192.168.0.21")),
			wantExt: []string{"192.168.0.10", "192.168.0.21"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, problems := BuildGuarded(tc.svc, nil, tc.guard)
			if s == nil {
				t.Fatalf("Service left out: %+v", problems)
			}
			if got := s.base.GetExternalIps(); !slices.Equal(got, tc.wantExt) {
				t.Errorf("external IPs %q, want %q", got, tc.wantExt)
			}
			if got := s.base.GetLoadBalancerIps(); !slices.Equal(got, tc.wantLB) {
				t.Errorf("load balancer IPs %q, want %q", got, tc.wantLB)
			}
			if len(problems) != len(tc.wantProbs) {
				t.Fatalf("problems %+v, want %d", problems, len(tc.wantProbs))
			}
			for i, p := range problems {
				if p.Reason != ReasonInvalidValue || p.Kind != KindService || !strings.Contains(p.Message, tc.wantProbs[i]) {
					t.Errorf("problem %d = %+v, want an %s containing %q", i, p, ReasonInvalidValue, tc.wantProbs[i])
				}
			}
		})
	}
}

// TestGuardEqual checks that guards built from the same addresses in any
// order, mapped or not, are equal, and that any difference counts: the
// watcher rebuilds Services only when the guard changes.
func TestGuardEqual(t *testing.T) {
	cps := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:9640"), netip.MustParseAddrPort("10.0.0.1:9640")}
	nodes := []netip.Addr{netip.MustParseAddr("10.0.1.2"), netip.MustParseAddr("::ffff:10.0.1.1"), netip.MustParseAddr("10.0.1.2")}
	g := NewGuard(cps, nodes, capture.PortRange{}, false)
	same := NewGuard([]netip.AddrPort{cps[1], cps[0]}, []netip.Addr{netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.1.2")}, capture.PortRange{}, false)
	if !g.Equal(same) {
		t.Error("equal guards differ")
	}
	for name, o := range map[string]*Guard{
		"nil":           nil,
		"another node":  NewGuard(cps, nodes[:1], capture.PortRange{}, false),
		"another port":  NewGuard(cps[:1], nodes, capture.PortRange{}, false),
		"any port":      NewGuard(cps, nodes, capture.PortRange{}, true),
		"another range": NewGuard(cps, nodes, capture.PortRange{Base: 1, Size: 10}, false),
	} {
		if g.Equal(o) {
			t.Errorf("%s: guards equal", name)
		}
	}
	if !(*Guard)(nil).Equal(nil) {
		t.Error("nil guards differ")
	}
}

// TestGuardAffects checks that a change of guard concerns exactly the
// addresses it guards differently: the watcher rebuilds only the Services
// listing one.
func TestGuardAffects(t *testing.T) {
	cp, node, other := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.2.1")
	old := NewGuard([]netip.AddrPort{netip.AddrPortFrom(cp, 9640)}, nil, capture.PortRange{}, false)
	g := NewGuard([]netip.AddrPort{netip.AddrPortFrom(cp, 9650)}, []netip.Addr{node}, capture.PortRange{}, false)
	// The control plane's port changed: the Problem names it.
	for a, want := range map[netip.Addr]bool{cp: true, node: true, other: false} {
		if got := g.Affects(old, a); got != want {
			t.Errorf("Affects(%s) = %t, want %t", a, got, want)
		}
	}
	if !g.Affects(nil, other) || !g.Affects(NewGuard(nil, []netip.Addr{node}, capture.PortRange{}, true), other) {
		t.Error("a guard from nothing, or with other rules, must concern every address")
	}
}
