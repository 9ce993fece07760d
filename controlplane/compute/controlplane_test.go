package compute

import (
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func controlPlaneService() *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "proxyplane-system", Name: "proxyplane-controlplane"}}
}

// controlPlaneSlice is a slice of the control plane's Service with its
// grpc port at grpcPort and a metrics port beside it.
func controlPlaneSlice(family discoveryv1.AddressType, grpcPort int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "proxyplane-system", Name: "proxyplane-controlplane-" + strconv.Itoa(int(grpcPort)) + string(family)},
		AddressType: family,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("metrics"), Port: ptr(int32(9641)), Protocol: ptr(corev1.ProtocolTCP)},
			{Name: ptr(ControlPlanePortName), Port: ptr(grpcPort), Protocol: ptr(corev1.ProtocolTCP)},
		},
		Endpoints: eps,
	}
}

func readyEndpoint(ip string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready)}}
}

func TestBuildControlPlaneAddresses(t *testing.T) {
	nilReady := discoveryv1.Endpoint{Addresses: []string{"10.0.0.7"}}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   []string
	}{{
		name: "ready endpoints only, sorted",
		svc:  controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640,
			readyEndpoint("10.0.0.3", true), readyEndpoint("10.0.0.2", false), readyEndpoint("10.0.0.1", true))},
		want: []string{"10.0.0.1:9640", "10.0.0.3:9640"},
	}, {
		name:   "a nil ready condition counts as ready",
		svc:    controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, nilReady)},
		want:   []string{"10.0.0.7:9640"},
	}, {
		name: "the port by name, from each slice",
		svc:  controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{
			controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("10.0.0.1", true)),
			controlPlaneSlice(discoveryv1.AddressTypeIPv4, 19640, readyEndpoint("10.0.0.2", true)),
		},
		want: []string{"10.0.0.1:9640", "10.0.0.2:19640"},
	}, {
		name: "both families, IPv6 in brackets",
		svc:  controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{
			controlPlaneSlice(discoveryv1.AddressTypeIPv6, 9640, readyEndpoint("fd00::1", true)),
			controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("10.0.0.1", true)),
		},
		want: []string{"10.0.0.1:9640", "[fd00::1]:9640"},
	}, {
		name: "duplicates across slices once",
		svc:  controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{
			controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("10.0.0.1", true)),
			controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("10.0.0.1", true)),
		},
		want: []string{"10.0.0.1:9640"},
	}, {
		name: "no port called grpc",
		svc:  controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{{
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9641))}},
			Endpoints:   []discoveryv1.Endpoint{readyEndpoint("10.0.0.1", true)},
		}},
	}, {
		name: "a UDP port called grpc does not count",
		svc:  controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{{
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr(ControlPlanePortName), Port: ptr(int32(9640)), Protocol: ptr(corev1.ProtocolUDP)}},
			Endpoints:   []discoveryv1.Endpoint{readyEndpoint("10.0.0.1", true)},
		}},
	}, {
		name: "garbage and FQDN left out",
		svc:  controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{
			controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("not-an-ip", true),
				readyEndpoint("0.0.0.0", true), readyEndpoint("fd00::9", true), readyEndpoint("10.0.0.4", true)),
			controlPlaneSlice(discoveryv1.AddressTypeFQDN, 9640, readyEndpoint("cp.example.com", true)),
		},
		want: []string{"10.0.0.4:9640"},
	}, {
		name:   "the Service missing",
		slices: []*discoveryv1.EndpointSlice{controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("10.0.0.1", true))},
	}, {
		name: "no slices",
		svc:  controlPlaneService(),
	}, {
		name:   "no replica ready",
		svc:    controlPlaneService(),
		slices: []*discoveryv1.EndpointSlice{controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("10.0.0.1", false))},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := BuildControlPlaneAddresses(tc.svc, tc.slices, ControlPlanePortName)
			if !slices.Equal(got.List(), tc.want) {
				t.Errorf("got %q, want %q", got.List(), tc.want)
			}
			if (got == nil) != (len(tc.want) == 0) {
				t.Errorf("got %#v: want nil exactly when empty", got)
			}
		})
	}
}

func TestBuildControlPlaneAddressesBounded(t *testing.T) {
	var eps []discoveryv1.Endpoint
	for i := range 2 * MaxControlPlaneAddresses {
		eps = append(eps, readyEndpoint("10.0.1."+strconv.Itoa(i+1), true))
	}
	got := BuildControlPlaneAddresses(controlPlaneService(),
		[]*discoveryv1.EndpointSlice{controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, eps...)}, ControlPlanePortName).List()
	if len(got) != MaxControlPlaneAddresses || got[0] != "10.0.1.1:9640" {
		t.Errorf("got %d addresses starting %q, want the %d lowest", len(got), got[:1], MaxControlPlaneAddresses)
	}
}

func TestNodeCarriesControlPlaneAddresses(t *testing.T) {
	a := BuildControlPlaneAddresses(controlPlaneService(), []*discoveryv1.EndpointSlice{
		controlPlaneSlice(discoveryv1.AddressTypeIPv4, 9640, readyEndpoint("10.0.0.1", true)),
	}, ControlPlanePortName)
	n := BuildNode("node-a", nil)
	with := n.WithControlPlaneAddresses(a)
	if with.Hash == n.Hash {
		t.Fatal("control plane addresses leave the node hash unchanged")
	}
	if !with.ControlPlaneAddresses().Equal(a) || with.WithControlPlaneAddresses(a) != with {
		t.Error("WithControlPlaneAddresses is not idempotent")
	}
	// Service CIDRs and control plane addresses replace each other's
	// nothing.
	cidrs := BuildServiceCIDRs(nil)
	if got := with.WithServiceCIDRs(cidrs).ControlPlaneAddresses(); !got.Equal(a) {
		t.Errorf("WithServiceCIDRs dropped the control plane addresses: %q", got.List())
	}
	if back := with.WithControlPlaneAddresses(nil); back.Hash != n.Hash {
		t.Error("removing the addresses does not restore the node")
	}
}
