package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// flowCase is one case of internal/flowsuite (same name, same Service
// name, same addresses) as node k's table holds it, with the packets that
// case sends traced through the state the Dataplane programs. update and
// after are the suite's change and its checks, applied as a partial sync.
type flowCase struct {
	name string // the flow suite's case name
	svc  string // its Service name, and the goldens' name
	idx  int    // its index in the suite: addresses and ports derive from it
	// services returns node k's table.
	services func(k int) []*pb.Service
	checks   []check
	update   func(k int) []*pb.Service
	after    []check
	// conns, when set, runs before the update: traffic on the old real
	// servers, for graceful termination.
	conns func(k *fakeKernel)
}

// check is one traced packet on node k and every way it can end.
type check struct {
	node int
	flow flow
	want []outcome
}

// one returns a table of one Service, the same on every node.
func one(s svcSpec) func(k int) []*pb.Service {
	return func(k int) []*pb.Service { return []*pb.Service{s.build(k)} }
}

// perNode returns a table of one Service whose endpoints differ by node,
// as topology (hints, PreferSameNode) makes them.
func perNode(s svcSpec, pods [2][]int) func(k int) []*pb.Service {
	return func(k int) []*pb.Service {
		s := s
		s.pods = pods[k]
		return []*pb.Service{s.build(k)}
	}
}

// Flows. Addresses are IPv4 unless a v6 variant says otherwise.
func tcp(src, dst string, port int) flow {
	return flow{src: src, dst: dst, proto: TCP, dport: uint16(port)}
}

func udp(src, dst string, port int) flow {
	return flow{src: src, dst: dst, proto: UDP, dport: uint16(port)}
}

// fromNode is a connection the node k itself opens, from its address.
func fromNode(f flow) flow { f.fromNode = true; return f }

func vip(idx int) string                         { return clusterIPs(idx)[0] }
func vip6(idx int) string                        { return clusterIPs(idx)[1] }
func nodePort(idx int) int                       { return firstNodePort + 2*idx }
func udpNodePort(idx int) int                    { return firstNodePort + 2*idx + 1 }
func pod(i int) string                           { return podIPs[i][0] }
func pod6(i int) string                          { return podIPs[i][1] }
func nodeAddr(k int) string                      { return nodeIPs[k][0] }
func extIP(k, idx int) string                    { return externalIPs(k, idx)[0] }
func ext(k, idx int) []string                    { a := externalIPs(k, idx); return a[:] }
func reachedBy(masq bool, pods ...int) []outcome { return reached(dataplane.IPv4, masq, pods...) }

// reached is IPVS sending the connection to any of pods (in family f),
// masqueraded or not.
func reached(f dataplane.Family, masq bool, pods ...int) []outcome {
	out := make([]outcome, 0, len(pods))
	for _, p := range pods {
		out = append(out, outcome{dest: podEP(p, f), verdict: accepted, masq: masq})
	}
	return out
}

// fromPod is IPVS sending a connection from pod src to any of pods: not
// masqueraded, but for the hairpin path back to src itself.
func fromPod(f dataplane.Family, src int, pods ...int) []outcome {
	out := reached(f, false, pods...)
	for i, p := range pods {
		out[i].masq = p == src
	}
	return out
}

func ended(verdict string) []outcome { return []outcome{{verdict: verdict}} }

var allPods = []int{0, 1, 2, 3}

// flowCases mirrors internal/flowsuite's flowCases, in its order.
var flowCases = []flowCase{
	{
		name: "ClusterIP spreads over all endpoints, from a pod and from a node", svc: "spread", idx: 0,
		services: one(svcSpec{idx: 0, name: "spread", pods: allPods}),
		checks: []check{
			{0, tcp(pod(1), vip(0), 80), fromPod(dataplane.IPv4, 1, allPods...)},
			// The node's own connections are masqueraded: their source
			// is a node address (or the service IP itself).
			{1, fromNode(tcp(nodeAddr(1), vip(0), 80)), reachedBy(true, allPods...)},
			{0, tcp(pod6(1), vip6(0), 80), fromPod(dataplane.IPv6, 1, allPods...)},
		},
	},
	{
		name: "UDP ClusterIP spreads over all endpoints", svc: "udp", idx: 1,
		services: one(svcSpec{idx: 1, name: "udp", pods: allPods}),
		checks:   []check{{1, udp(pod(3), vip(1), 80), fromPod(dataplane.IPv4, 3, allPods...)}},
	},
	{
		name: "a Service without endpoints rejects", svc: "empty", idx: 2,
		services: one(svcSpec{idx: 2, name: "empty", noEndpoints: true}),
		checks: []check{
			// A virtual server without real servers: IPVS answers ICMP
			// port unreachable (ip_vs_leave), for TCP and UDP alike.
			{0, tcp(pod(1), vip(2), 80), ended(rejected)},
			{0, udp(pod(1), vip(2), 80), ended(rejected)},
			{0, tcp(clientIP[0], vip(2), 80), ended(rejected)},
			{0, tcp(pod6(1), vip6(2), 80), ended(rejected)},
		},
	},
	{
		name: "a ClusterIP on a port the Service lacks", svc: "wrongport", idx: 3,
		services: one(svcSpec{idx: 3, name: "wrongport", pods: allPods}),
		checks: []check{
			// The service address is local; PP-IPVS-FILTER rejects what
			// no virtual server takes, as upstream's KUBE-IPVS-FILTER.
			{0, tcp(pod(0), vip(3), 81), ended(rejected)},
			{0, tcp(pod(0), vip(3), 80), fromPod(dataplane.IPv4, 0, allPods...)},
		},
	},
	{
		name: "NodePort answers on both nodes from outside", svc: "nodeport", idx: 4,
		services: one(svcSpec{idx: 4, name: "nodeport", nodePort: true, pods: []int{1, 3}}),
		checks: []check{
			{0, tcp(clientIP[0], nodeAddr(0), nodePort(4)), reachedBy(true, 1, 3)},
			{0, udp(clientIP[0], nodeAddr(0), udpNodePort(4)), reachedBy(true, 1, 3)},
			{1, tcp(clientIP[0], nodeAddr(1), nodePort(4)), reachedBy(true, 1, 3)},
			{1, udp(clientIP[0], nodeAddr(1), udpNodePort(4)), reachedBy(true, 1, 3)},
			// NodePorts answer on every node address, the bridge's too.
			{0, tcp(clientIP[0], bridgeIPs[0][0], nodePort(4)), reachedBy(true, 1, 3)},
			{0, tcp(clientIP[1], nodeIPs[0][1], nodePort(4)), reached(dataplane.IPv6, true, 1, 3)},
		},
	},
	{
		name: "externalTrafficPolicy Local keeps the client address, drops on a node without local endpoints", svc: "etplocal", idx: 5,
		services: one(svcSpec{idx: 5, name: "etplocal", lbIPs: ext(0, 5), etpLocal: true, pods: []int{0}}),
		checks: []check{
			{0, tcp(clientIP[0], nodeAddr(0), nodePort(5)), reachedBy(false, 0)},
			{0, tcp(clientIP[0], extIP(0, 5), 80), reachedBy(false, 0)},
			{1, tcp(clientIP[0], nodeAddr(1), nodePort(5)), ended(dropped)},
			{1, tcp(clientIP[1], nodeIPs[1][1], nodePort(5)), ended(dropped)},
			// The health check port is open on both nodes; the agent's
			// server answers it.
			{0, tcp(clientIP[0], nodeAddr(0), firstHCPort+5), ended(local)},
			{1, tcp(clientIP[0], nodeAddr(1), firstHCPort+5), ended(local)},
			// Inside the cluster the ClusterIP reaches it from anywhere.
			{1, tcp(pod(3), vip(5), 80), reachedBy(false, 0)},
			// Pods and the node still reach the external addresses of a
			// node without a local endpoint (kubernetes#97081), the node
			// masqueraded.
			{1, tcp(pod(3), extIP(0, 5), 80), reachedBy(false, 0)},
			{1, fromNode(tcp(nodeAddr(1), extIP(0, 5), 80)), reachedBy(true, 0)},
		},
	},
	{
		name: "internalTrafficPolicy Local uses only the node's own endpoints", svc: "itplocal", idx: 6,
		services: one(svcSpec{idx: 6, name: "itplocal", itpLocal: true, pods: []int{0, 2}}),
		checks: []check{
			{0, tcp(pod(1), vip(6), 80), reachedBy(false, 0)},
			{1, tcp(pod(3), vip(6), 80), reachedBy(false, 2)},
			{1, fromNode(tcp(nodeAddr(1), vip(6), 80)), reachedBy(true, 2)},
		},
	},
	{
		name: "internalTrafficPolicy Local drops on a node without local endpoints", svc: "itplocal-none", idx: 7,
		services: one(svcSpec{idx: 7, name: "itplocal-none", itpLocal: true, pods: []int{0}}),
		checks: []check{
			{0, tcp(pod(1), vip(7), 80), reachedBy(false, 0)},
			{1, tcp(pod(3), vip(7), 80), ended(dropped)},
			// The node's own connection meets IPVS before the filter
			// table (LOCAL_OUT): refused by the empty virtual server (see
			// README).
			{1, fromNode(tcp(nodeAddr(1), vip(7), 80)), ended(rejected)},
		},
	},
	{
		name: "ClientIP affinity keeps a client on one endpoint", svc: "affinity", idx: 8,
		services: one(svcSpec{idx: 8, name: "affinity", affinity: 60, pods: allPods}),
		// Persistence (in the golden) picks one of them per client.
		checks: []check{{1, tcp(pod(2), vip(8), 80), fromPod(dataplane.IPv4, 2, allPods...)}},
	},
	{
		name: "serving terminating endpoints are used only when none is ready", svc: "terminating", idx: 9,
		// The control plane picks the serving terminating endpoints, then
		// the ready one.
		services: one(svcSpec{idx: 9, name: "terminating", pods: []int{1, 2}}),
		checks:   []check{{1, tcp(pod(3), vip(9), 80), reachedBy(false, 1, 2)}},
		update:   one(svcSpec{idx: 9, name: "terminating", pods: []int{3}}),
		after:    []check{{0, tcp(pod(0), vip(9), 80), reachedBy(false, 3)}},
	},
	{
		name: "topology hints keep traffic in the zone", svc: "hints", idx: 10,
		services: perNode(svcSpec{idx: 10, name: "hints"}, [2][]int{{0, 1}, {2, 3}}),
		checks: []check{
			{0, tcp(pod(1), vip(10), 80), fromPod(dataplane.IPv4, 1, 0, 1)},
			{1, fromNode(tcp(nodeAddr(1), vip(10), 80)), reachedBy(true, 2, 3)},
		},
	},
	{
		name: "topology hints missing on one endpoint are ignored", svc: "hints-partial", idx: 11,
		services: one(svcSpec{idx: 11, name: "hints-partial", pods: allPods}),
		checks:   []check{{0, tcp(pod(1), vip(11), 80), fromPod(dataplane.IPv4, 1, allPods...)}},
	},
	{
		name: "PreferSameNode uses the node's hinted endpoints", svc: "samenode", idx: 12,
		services: perNode(svcSpec{idx: 12, name: "samenode"}, [2][]int{{0, 1}, {3}}),
		checks: []check{
			{1, tcp(pod(2), vip(12), 80), reachedBy(false, 3)},
			{0, tcp(pod(0), vip(12), 80), fromPod(dataplane.IPv4, 0, 0, 1)},
		},
	},
	{
		name: "LoadBalancer IP and externalIPs answer from outside", svc: "lb", idx: 13,
		services: one(svcSpec{idx: 13, name: "lb", lbIPs: ext(1, 13), extIPs: ext(0, 13), pods: []int{0, 2}}),
		checks: []check{
			{1, tcp(clientIP[0], extIP(1, 13), 80), reachedBy(true, 0, 2)},
			{0, tcp(clientIP[0], extIP(0, 13), 80), reachedBy(true, 0, 2)},
			{1, udp(clientIP[0], extIP(1, 13), 80), reachedBy(true, 0, 2)},
			{1, tcp(clientIP[1], externalIPs(1, 13)[1], 80), reached(dataplane.IPv6, true, 0, 2)},
		},
	},
	{
		name: "loadBalancerSourceRanges let listed sources in and drop the rest", svc: "ranges", idx: 14,
		services: one(svcSpec{idx: 14, name: "ranges", lbIPs: ext(0, 14), ranges: []string{clientIP[0] + "/32", clientIP[1] + "/128"}, pods: []int{2}}),
		checks: []check{
			{0, tcp(clientIP[0], extIP(0, 14), 80), reachedBy(true, 2)},
			{0, tcp(clientIP[1], externalIPs(0, 14)[1], 80), reached(dataplane.IPv6, true, 2)},
		},
		update: one(svcSpec{idx: 14, name: "ranges", lbIPs: ext(0, 14), ranges: []string{"203.0.113.0/24", "2001:db8:ffff::/48"}, pods: []int{2}}),
		after: []check{
			{0, tcp(clientIP[0], extIP(0, 14), 80), ended(dropped)},
			{0, tcp(clientIP[1], externalIPs(0, 14)[1], 80), ended(dropped)},
			// NodePorts ignore source ranges, as upstream.
			{0, tcp(clientIP[0], nodeAddr(0), nodePort(14)), reachedBy(true, 2)},
		},
	},
	{
		name: "a UDP flow moves to a live endpoint when its endpoint goes away", svc: "stale-udp", idx: 15,
		services: one(svcSpec{idx: 15, name: "stale-udp", pods: []int{1}}),
		checks:   []check{{0, udp(clientIP[0], vip(15), 80), reachedBy(true, 1)}},
		// Both old real servers carry connections when pod-1 goes.
		conns: func(k *fakeKernel) {
			for _, proto := range []Protocol{TCP, UDP} {
				key := vsKey{netip.MustParseAddr(vip(15)), proto, 80}
				if k.ipvs.vss[key] != nil {
					k.ipvs.setConns(key, netip.MustParseAddrPort(podEP(1, dataplane.IPv4)), 1, 1)
				}
			}
		},
		update: one(svcSpec{idx: 15, name: "stale-udp", pods: []int{3}}),
		// UDP's real server is deleted at once (expire_nodest_conn moves
		// the flow); TCP's is drained at weight 0 (in the golden) and
		// takes no new connection.
		after: []check{
			{0, udp(clientIP[0], vip(15), 80), reachedBy(true, 3)},
			{1, udp(pod(2), vip(15), 80), reachedBy(false, 3)},
			{0, tcp(clientIP[0], vip(15), 80), reachedBy(true, 3)},
		},
	},
	{
		name: "masquerade: off-cluster clients and other nodes' NodePorts, never pod to pod", svc: "masquerade", idx: 16,
		services: one(svcSpec{idx: 16, name: "masquerade", nodePort: true, pods: []int{2}}),
		checks: []check{
			{0, tcp(pod(0), vip(16), 80), reachedBy(false, 2)},
			{0, tcp(clientIP[0], vip(16), 80), reachedBy(true, 2)},
			{0, tcp(clientIP[0], nodeAddr(0), nodePort(16)), reachedBy(true, 2)},
			{1, tcp(clientIP[0], nodeAddr(1), nodePort(16)), reachedBy(true, 2)},
		},
	},
	{
		name: "hairpin: a pod reaches itself through its Service, masqueraded", svc: "hairpin", idx: 17,
		services: one(svcSpec{idx: 17, name: "hairpin", pods: []int{0}}),
		checks: []check{
			{0, tcp(pod(0), vip(17), 80), reachedBy(true, 0)},
			{0, tcp(pod(1), vip(17), 80), reachedBy(false, 0)},
			{0, tcp(pod6(0), vip6(17), 80), reached(dataplane.IPv6, true, 0)},
		},
	},
	{
		name: "skipped Services get no rules, and the rest of the table is unaffected", svc: "skipped", idx: 18,
		// The control plane leaves skipped Services out of every table.
		services: func(int) []*pb.Service { return nil },
		checks: []check{
			{0, tcp(pod(1), vip(18), 80), ended(routed)},
			{0, tcp(pod(1), vip(18+100), 80), ended(routed)},
		},
	},
}

// sortOutcomes orders outcomes for comparison.
func sortOutcomes(o []outcome) []outcome {
	o = slices.Clone(o)
	slices.SortFunc(o, func(a, b outcome) int { return strings.Compare(a.String(), b.String()) })
	return o
}

func formatOutcomes(o []outcome) string {
	parts := make([]string, len(o))
	for i, x := range o {
		parts[i] = x.String()
	}
	return fmt.Sprintf("[%s]", strings.Join(parts, ", "))
}
