package compute

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// FuzzBuild computes views of a Service with arbitrary fields and two
// EndpointSlices with arbitrary endpoints, ports, conditions and hints, for
// nodes inside and outside the hinted zone and node. Nothing may panic; a
// Service Build accepts is deterministic (built again, it is Equal and every
// view has the same hash), and every view decodes into a Service an agent
// would accept: endpoints with valid addresses and ports, listed under
// ports the Service has.
func FuzzBuild(f *testing.F) {
	f.Add(uint8(1), "10.96.0.10", int32(80), int32(30080), uint8(0), "10.244.1.5", int32(8080), uint8(0), "node-a", "zone-a", "node-a", uint8(0), false)
	f.Add(uint8(3), "fd00::10", int32(53), int32(0), uint8(1), "fd00:244::5", int32(53), uint8(3), "node-b", "zone-b", "node-c", uint8(3), true)
	f.Add(uint8(0), "None", int32(0), int32(-1), uint8(2), "not-an-ip", int32(70000), uint8(7), "", "", "", uint8(2), false)
	f.Fuzz(func(t *testing.T, svcType uint8, clusterIP string, port, nodePort int32, protoIdx uint8,
		epIP string, epPort int32, cond uint8, nodeName, hintZone, hintNode string, policies uint8, ipv6 bool,
	) {
		protos := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, "ICMP"}
		types := []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName}
		proto := protos[int(protoIdx)%len(protos)]
		opts := []svcOpt{
			withType(types[int(svcType)%len(types)]),
			withClusterIPs(clusterIP),
			withPorts(svcPort("http", proto, port, nodePort), svcPort("dns", corev1.ProtocolUDP, 53, 0)),
		}
		if policies&1 != 0 {
			opts = append(opts, withExternalLocal())
		}
		if policies&2 != 0 {
			opts = append(opts, withInternalLocal())
		}
		svc := newService(opts...)
		if SkipReason(svc) != "" {
			return
		}

		epOpts := []epOpt{onNode(nodeName), forZones(hintZone), forNodes(hintNode)}
		switch cond % 4 {
		case 1:
			epOpts = append(epOpts, notReady())
		case 2:
			epOpts = append(epOpts, terminating(cond&4 != 0))
		case 3:
			epOpts = append(epOpts, noConditions())
		}
		family := discoveryv1.AddressTypeIPv4
		if ipv6 {
			family = discoveryv1.AddressTypeIPv6
		}
		slices := []*discoveryv1.EndpointSlice{
			newSlice("a", family, []discoveryv1.EndpointPort{slicePort(ptr("http"), &proto, epPort)}, ep(epIP, epOpts...)),
			httpSlice("b", ep("10.244.2.7", onNode("node-z"), forZones("zone-z"))),
		}

		s, err := Build(svc, slices)
		if err != nil {
			return
		}
		again, err := Build(svc, slices)
		if err != nil || !s.Equal(again) {
			t.Fatalf("built twice: equal %v, error %v", s.Equal(again), err)
		}
		for _, n := range []*Node{testNode(nodeName, hintZone), testNode(hintNode, "zone-z"), testNode("elsewhere", "")} {
			e := s.EntryFor(n)
			if h := again.EntryFor(n).Hash; h != e.Hash {
				t.Fatalf("node %s: view hash %x, then %x", n.Name, e.Hash, h)
			}
			view := decode(t, e)
			ports := map[string]bool{}
			for _, p := range view.GetPorts() {
				ports[p.GetName()] = true
			}
			for _, list := range [][]*pb.PortEndpoints{view.GetClusterEndpoints(), view.GetLocalEndpoints()} {
				for _, pe := range list {
					if !ports[pe.GetPortName()] {
						t.Fatalf("node %s: endpoints for port %q, which the Service lacks", n.Name, pe.GetPortName())
					}
					for _, e := range pe.GetEndpoints() {
						if _, err := netip.ParseAddr(e.GetIp()); err != nil || e.GetPort() < 1 || e.GetPort() > 65535 {
							t.Fatalf("node %s: endpoint %s port %d", n.Name, e.GetIp(), e.GetPort())
						}
					}
				}
			}
		}
	})
}
