package compute

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// explainCase is a Service and its slices, explained for every node of
// explainNodes.
type explainCase struct {
	name   string
	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
}

// explainNodes are nodes of every kind that topology and local policies
// tell apart: hinted by name, in a hinted zone, in another zone, without
// a zone, and without a Node object.
var explainNodes = []*Node{
	testNode("node-1", "zone-a"),
	testNode("node-2", "zone-b"),
	testNode("node-4", "zone-a"),
	testNode("node-5", ""),
	BuildNode("node-6", nil),
}

func explainCases() []explainCase {
	http := func(eps ...discoveryv1.Endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{httpSlice("web-a", eps...)}
	}
	lb := func(opts ...svcOpt) *corev1.Service {
		return nodePortService(append([]svcOpt{
			withType(corev1.ServiceTypeLoadBalancer),
			withIngress(corev1.LoadBalancerIngress{IP: "192.0.2.10"}),
		}, opts...)...)
	}
	spread := http(ep("10.0.1.1", onNode("node-1")), ep("10.0.2.1", onNode("node-2")), ep("10.0.1.2", onNode("node-4")))
	return []explainCase{
		{"no endpoints", newService(), nil},
		{"spread", newService(), spread},
		{"zone hints", newService(), http(ep("10.0.1.1", forZones("zone-a"), onNode("node-1")), ep("10.0.2.1", forZones("zone-b"), onNode("node-2")))},
		{"zone hint missing", newService(), http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1"))},
		{"node hints", newService(), http(ep("10.0.1.1", forZones("zone-a"), forNodes("node-1")), ep("10.0.1.2", forZones("zone-a"), forNodes("node-4")), ep("10.0.2.1", forZones("zone-b"), forNodes("node-2")))},
		{"node hints partial", newService(), http(ep("10.0.1.1", forZones("zone-a"), forNodes("node-1")), ep("10.0.2.1", forZones("zone-b")))},
		{"terminating fallback", newService(), http(ep("10.0.1.1", terminating(true), onNode("node-1")), ep("10.0.2.1", terminating(false), onNode("node-2")), ep("10.0.3.1", notReady()))},
		{"terminating beside ready", newService(), http(ep("10.0.1.1", terminating(true), onNode("node-1")), ep("10.0.2.1", onNode("node-2")))},
		{"internal Local", newService(withInternalLocal()), spread},
		{"internal Local terminating", newService(withInternalLocal()), http(ep("10.0.1.1", terminating(true), onNode("node-1")), ep("10.0.1.2", onNode("node-1")), ep("10.0.2.1", terminating(true), onNode("node-2")))},
		{"external Local", lb(withExternalLocal(), func(s *corev1.Service) { s.Spec.HealthCheckNodePort = 32000 }), spread},
		{"external Local and internal Local", lb(withExternalLocal(), withInternalLocal()), spread},
		{"external IPs, internal Local", newService(withExternalIPs("192.0.2.20"), withInternalLocal()), spread},
		{"affinity and ranges", lb(withAffinity(ptr(int32(60))), func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
		}), spread},
		{"dual stack", newService(withClusterIPs("10.96.0.10", "fd00::10"), withInternalLocal()), []*discoveryv1.EndpointSlice{
			httpSlice("web-4", ep("10.0.1.1", onNode("node-1"), forZones("zone-a")), ep("10.0.2.1", onNode("node-2"), forZones("zone-b"))),
			newSlice("web-6", discoveryv1.AddressTypeIPv6, httpPort(), ep("fd00:1::1", onNode("node-2"), terminating(true))),
		}},
		{"unnamed port", newService(withPorts(svcPort("", corev1.ProtocolTCP, 80, 0))), []*discoveryv1.EndpointSlice{
			newSlice("web-a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePort(ptr(""), ptr(corev1.ProtocolTCP), 8080)},
				ep("10.0.1.1", onNode("node-1")), ep("10.0.2.1", onNode("node-2"))),
		}},
		{"two ports", newService(withPorts(svcPort("http", corev1.ProtocolTCP, 80, 0), svcPort("dns", corev1.ProtocolUDP, 53, 0))), []*discoveryv1.EndpointSlice{
			newSlice("web-a", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8080), slicePort(ptr("dns"), ptr(corev1.ProtocolUDP), 5353),
			}, ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
		}},
	}
}

// TestExplainMatchesEntry is the guarantee Explain gives: for every case
// and every kind of node, the Service it returns is the one EntryFor
// encodes, and the endpoints of each set it explains, joined across
// families, are that entry's endpoints for the port.
func TestExplainMatchesEntry(t *testing.T) {
	for _, tc := range explainCases() {
		s := mustBuild(t, tc.svc, tc.slices...)
		for _, n := range explainNodes {
			t.Run(tc.name+"/"+n.Name, func(t *testing.T) {
				view, ex := s.Explain(n)
				want := viewFor(t, s, n)
				checkProto(t, "Explain's Service", view, want)
				if len(ex.GetPorts()) != len(want.GetPorts()) {
					t.Fatalf("%d ports explained, want %d", len(ex.GetPorts()), len(want.GetPorts()))
				}
				for _, pe := range ex.GetPorts() {
					cluster, local := ExplainedEndpoints(pe)
					checkEndpoints(t, pe.GetName(), "cluster", cluster, want.GetClusterEndpoints())
					checkEndpoints(t, pe.GetName(), "local", local, want.GetLocalEndpoints())
				}
			})
		}
	}
}

// checkEndpoints compares the endpoints explained for the port named name
// ("" for a Service's one unnamed port) in set ("cluster" or "local") with
// the entry's.
func checkEndpoints(t *testing.T, name, set string, got []*pb.PortEndpoints, want []*pb.PortEndpoints) {
	t.Helper()
	what := fmt.Sprintf("port %q %s endpoints", name, set)
	var w *pb.PortEndpoints
	for _, pe := range want {
		if pe.GetPortName() == name {
			w = pe
		}
	}
	var g *pb.PortEndpoints
	if len(got) > 0 {
		g = got[0]
	}
	if len(w.GetEndpoints()) == 0 && len(g.GetEndpoints()) == 0 {
		return
	}
	checkProto(t, what, g, w)
}

func TestExplainReasons(t *testing.T) {
	http := func(eps ...discoveryv1.Endpoint) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{httpSlice("web-a", eps...)}
	}
	for _, tc := range []struct {
		name     string
		svc      *corev1.Service
		slices   []*discoveryv1.EndpointSlice
		node     *Node
		local    bool // explain the local set, not the cluster set
		topology string
		fallback bool
		wants    []string // in the set's reason, topology reason and verdicts
	}{
		{
			name:   "zone hints used",
			slices: http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
			node:   testNode("node-1", "zone-a"), topology: "zone",
			wants: []string{"some name zone zone-a", "hinted for zone zone-a, of 2 ready", "ready, but hinted for zone zone-b, not zone-a"},
		},
		{
			name:   "a ready endpoint without a hint",
			slices: http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1")),
			node:   testNode("node-1", "zone-a"), topology: "none",
			wants: []string{"zone hints ignored: ready endpoint 10.0.2.1 has none", "every ready endpoint (2)"},
		},
		{
			name:   "a zone no hint names",
			slices: http(ep("10.0.1.1", forZones("zone-a")), ep("10.0.2.1", forZones("zone-b"))),
			node:   testNode("node-3", "zone-c"), topology: "none",
			wants: []string{"no ready endpoint's zone hints name zone zone-c"},
		},
		{
			name:   "a node without a zone",
			slices: http(ep("10.0.1.1", forZones("zone-a"))),
			node:   testNode("node-3", ""), topology: "none",
			wants: []string{"the node has no zone label"},
		},
		{
			name:   "node hints used",
			slices: http(ep("10.0.1.1", forZones("zone-a"), forNodes("node-1")), ep("10.0.1.2", forZones("zone-a"), forNodes("node-4"))),
			node:   testNode("node-1", "zone-a"), topology: "node",
			wants: []string{"some name node node-1", "ready, but hinted for node node-4, not node-1"},
		},
		{
			name:   "no hints",
			slices: http(ep("10.0.1.1"), ep("10.0.2.1", notReady())),
			node:   testNode("node-1", "zone-a"), topology: "none",
			wants: []string{"no endpoint has topology hints", "not ready, not serving"},
		},
		{
			name:   "terminating fallback",
			slices: http(ep("10.0.1.1", terminating(true)), ep("10.0.2.1", terminating(false))),
			node:   testNode("node-1", "zone-a"), topology: "none", fallback: true,
			wants: []string{"no endpoint is ready: topology applies only to ready endpoints", "terminating fallback", "used because no endpoint is ready", "terminating and not serving: never used"},
		},
		{
			name:   "serving terminating beside a ready one",
			slices: http(ep("10.0.1.1", terminating(true)), ep("10.0.2.1")),
			node:   testNode("node-1", "zone-a"), topology: "none",
			wants: []string{"serving and terminating: used only while no endpoint is ready"},
		},
		{
			name:   "no endpoint at all",
			slices: http(ep("10.0.1.1", notReady())),
			node:   testNode("node-1", "zone-a"), topology: "none",
			wants: []string{"the traffic is rejected"},
		},
		{
			name:   "local set",
			svc:    newService(withInternalLocal()),
			slices: http(ep("10.0.1.1", onNode("node-1")), ep("10.0.2.1", onNode("node-2")), ep("10.0.3.1")),
			node:   testNode("node-1", "zone-a"), local: true, topology: "none",
			wants: []string{"every ready endpoint on this node (1)", "on node node-2, not this one", "names no node"},
		},
		{
			name:   "local set empty",
			svc:    newService(withInternalLocal()),
			slices: http(ep("10.0.2.1", onNode("node-2"))),
			node:   testNode("node-1", "zone-a"), local: true, topology: "none",
			wants: []string{"dropped here"},
		},
		{
			name:   "local terminating fallback",
			svc:    newService(withInternalLocal()),
			slices: http(ep("10.0.1.1", onNode("node-1"), terminating(true)), ep("10.0.2.1", onNode("node-2"))),
			node:   testNode("node-1", "zone-a"), local: true, topology: "none", fallback: true,
			wants: []string{"no endpoint on this node is ready: its 1 serving-and-terminating", "used because no endpoint on this node is ready", "on node node-2, not this one"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := tc.svc
			if svc == nil {
				svc = newService()
			}
			_, ex := mustBuild(t, svc, tc.slices...).Explain(tc.node)
			ch := ex.GetPorts()[0].GetFamilies()[0].GetCluster()
			if tc.local {
				ch = ex.GetPorts()[0].GetFamilies()[0].GetLocal()
			}
			if ch.GetTopology() != tc.topology || ch.GetTerminatingFallback() != tc.fallback {
				t.Errorf("topology %q, fallback %v; want %q, %v", ch.GetTopology(), ch.GetTerminatingFallback(), tc.topology, tc.fallback)
			}
			text := ch.GetReason() + "\n" + ch.GetTopologyReason()
			for _, v := range ch.GetCandidates() {
				text += "\n" + v.GetEndpoint().GetIp() + ": " + v.GetReason()
			}
			for _, w := range tc.wants {
				if !strings.Contains(text, w) {
					t.Errorf("explanation lacks %q:\n%s", w, text)
				}
			}
		})
	}
}

// TestExplainPolicyMatchesPort holds the policy sentence of each port to
// the flags the table is built from: it names cluster-wide endpoints
// exactly when the port uses them, and the node's own exactly when it
// uses those.
func TestExplainPolicyMatchesPort(t *testing.T) {
	for _, internal := range []bool{false, true} {
		for _, external := range []bool{false, true} {
			for _, reachable := range []svcOpt{nil, withExternalIPs("192.0.2.20"), withType(corev1.ServiceTypeNodePort)} {
				opts := []svcOpt{}
				if internal {
					opts = append(opts, withInternalLocal())
				}
				if external {
					opts = append(opts, withExternalLocal())
				}
				if reachable != nil {
					opts = append(opts, reachable)
				}
				svc := newService(opts...)
				if svc.Spec.Type == corev1.ServiceTypeNodePort {
					svc.Spec.Ports[0].NodePort = 30080
				}
				s := mustBuild(t, svc, httpSlice("web-a", ep("10.0.1.1", onNode("node-1"))))
				_, ex := s.Explain(testNode("node-1", "zone-a"))
				pe := ex.GetPorts()[0]
				if pe.GetUsesClusterEndpoints() != s.ports[0].usesCluster || pe.GetUsesLocalEndpoints() != s.ports[0].usesLocal {
					t.Errorf("flags explained %v/%v, table's %v/%v", pe.GetUsesClusterEndpoints(), pe.GetUsesLocalEndpoints(), s.ports[0].usesCluster, s.ports[0].usesLocal)
				}
				if got := strings.Contains(pe.GetPolicy(), "cluster-wide"); got != s.ports[0].usesCluster {
					t.Errorf("iTP Local %v eTP Local %v %v: policy %q names cluster-wide endpoints: %v, port uses them: %v",
						internal, external, svc.Spec.Type, pe.GetPolicy(), got, s.ports[0].usesCluster)
				}
				if got := strings.Contains(pe.GetPolicy(), "this node's endpoints only"); got != s.ports[0].usesLocal {
					t.Errorf("iTP Local %v eTP Local %v %v: policy %q names local endpoints: %v, port uses them: %v",
						internal, external, svc.Spec.Type, pe.GetPolicy(), got, s.ports[0].usesLocal)
				}
			}
		}
	}
}

func TestCheckSource(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ranges  []string
		noLB    bool
		from    string
		allowed bool
		want    string
	}{
		{"no ranges", nil, false, "198.51.100.1", true, "no loadBalancerSourceRanges"},
		{"in a range", []string{"198.51.100.0/24", "203.0.113.0/24"}, false, "203.0.113.9", true, "entry 203.0.113.0/24"},
		{"in none", []string{"198.51.100.0/24"}, false, "203.0.113.9", false, "in no loadBalancerSourceRanges entry"},
		{"other family", []string{"198.51.100.0/24"}, false, "2001:db8::1", false, "no loadBalancerSourceRanges entry is IPv6"},
		{"IPv6 in range", []string{"198.51.100.0/24", "2001:db8::/32"}, false, "2001:db8::1", true, "2001:db8::/32"},
		{"mapped IPv4", []string{"198.51.100.0/24"}, false, "::ffff:198.51.100.7", true, "198.51.100.0/24"},
		{"every range invalid", []string{ClosedSourceRange}, false, "198.51.100.1", false, "admit no one"},
		{"no load balancer IP", nil, true, "198.51.100.1", true, "has no load balancer IP)"},
		// The node's IP 10.0.0.5 is in a range: the load balancer IP
		// itself is let in as a source (allowFromNode), nothing else.
		{"LB IP, node allowed", []string{"10.0.0.0/24"}, false, "192.0.2.10", true, "holds the node's IP 10.0.0.5"},
		{"other source, node allowed", []string{"10.0.0.0/24"}, false, "192.0.2.11", false, "in no loadBalancerSourceRanges entry"},
		{"LB IP, node not allowed", []string{"198.51.100.0/24"}, false, "192.0.2.10", false, "in no loadBalancerSourceRanges entry"},
		{"LB IP, node allowed in the other family", []string{"198.51.100.0/24", "2001:db8::/64"}, false, "192.0.2.10", false, "in no loadBalancerSourceRanges entry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &pb.Service{LoadBalancerSourceRanges: tc.ranges, LoadBalancerIps: []string{"192.0.2.10"}}
			if tc.noLB {
				svc.LoadBalancerIps = nil
			}
			nodeIPs := []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("2001:db8::5")}
			got := CheckSource(svc, netip.MustParseAddr(tc.from), nodeIPs)
			if got.GetAllowed() != tc.allowed || !strings.Contains(got.GetReason(), tc.want) {
				t.Errorf("CheckSource(%v, %s) = %v %q; want %v and %q in the reason", tc.ranges, tc.from, got.GetAllowed(), got.GetReason(), tc.allowed, tc.want)
			}
		})
	}
}

// TestExplainFrontends checks the per-family addresses: each family's
// cluster IP, load balancer and external IPs, and both families listed
// even when one has no endpoints.
func TestExplainFrontends(t *testing.T) {
	svc := nodePortService(withClusterIPs("10.96.0.10", "fd00::10"), withType(corev1.ServiceTypeLoadBalancer),
		withIngress(corev1.LoadBalancerIngress{IP: "192.0.2.10"}, corev1.LoadBalancerIngress{IP: "2001:db8::10"}),
		withExternalIPs("192.0.2.20"))
	_, ex := mustBuild(t, svc, httpSlice("web-a", ep("10.0.1.1"))).Explain(testNode("node-1", "zone-a"))
	fams := ex.GetPorts()[0].GetFamilies()
	if len(fams) != 2 {
		t.Fatalf("%d families, want 2", len(fams))
	}
	got := [][]string{
		{fams[0].GetFamily(), fams[0].GetClusterIp(), strings.Join(fams[0].GetLoadBalancerIps(), ","), strings.Join(fams[0].GetExternalIps(), ",")},
		{fams[1].GetFamily(), fams[1].GetClusterIp(), strings.Join(fams[1].GetLoadBalancerIps(), ","), strings.Join(fams[1].GetExternalIps(), ",")},
	}
	want := [][]string{{"IPv4", "10.96.0.10", "192.0.2.10", "192.0.2.20"}, {"IPv6", "fd00::10", "2001:db8::10", ""}}
	if !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Errorf("families %v, want %v", got, want)
	}
	if r := fams[1].GetCluster().GetReason(); r != "no endpoint of this family" {
		t.Errorf("IPv6 without endpoints: reason %q", r)
	}
	if ex.GetPorts()[0].GetNodePort() != 30080 {
		t.Errorf("node port %d, want 30080", ex.GetPorts()[0].GetNodePort())
	}
}
