package dptest

import (
	"fmt"
	"slices"
	"strings"
)

// Flow is a new connection's first packet as the node sees it.
type Flow struct {
	Src, Dst string
	Proto    string // tcp, udp, sctp
	DPort    int
	// FromNode: the node itself opens the connection (the output hook);
	// otherwise the packet arrives from a pod or a client (prerouting).
	FromNode bool
}

// Outcome is where one possible path of a packet ends.
type Outcome struct {
	DNAT    string // "ip:port" the packet was DNATed to, "" if none
	Verdict string // ACCEPT, DROP or REJECT
	Masq    bool   // masqueraded in postrouting
}

// String formats o for sorting and failure messages.
func (o Outcome) String() string {
	return fmt.Sprintf("{dnat:%q verdict:%s masq:%v}", o.DNAT, o.Verdict, o.Masq)
}

// SortOutcomes sorts o in place, drops repeats and returns it.
func SortOutcomes(o []Outcome) []Outcome {
	slices.SortFunc(o, func(a, b Outcome) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(o)
}

// Accepted lists the outcomes of a flow DNATed to each of dnats (none:
// not DNATed) and accepted, masqueraded or not.
func Accepted(masq bool, dnats ...string) []Outcome {
	if len(dnats) == 0 {
		return []Outcome{{Verdict: "ACCEPT", Masq: masq}}
	}
	out := make([]Outcome, 0, len(dnats))
	for _, d := range dnats {
		out = append(out, Outcome{DNAT: d, Verdict: "ACCEPT", Masq: masq})
	}
	return out
}

// Refused is a flow ending in verdict (REJECT or DROP) without DNAT.
func Refused(verdict string) []Outcome { return []Outcome{{Verdict: verdict}} }

// Join lists the outcomes of every part.
func Join(parts ...[]Outcome) []Outcome { return slices.Concat(parts...) }

// FlowTest is a packet traced through a feature case's ruleset, and every
// way it may end.
type FlowTest struct {
	Name string
	Case string // the feature case programmed
	Flow Flow
	// Local are the node's addresses besides NodeIP, NodeIP6 and
	// loopback.
	Local []string
	// Affinity seeds the affinity records of the affinity case's port
	// (ns/sticky:http): endpoint "ip:port" -> client addresses.
	Affinity map[string][]string
	Want     []Outcome
}

// Flows are the feature cases' packet traces, with the outcomes of
// kube-proxy's iptables mode; a dataplane that differs (as kube-proxy's
// nftables mode does) says where and why.
func Flows() []FlowTest {
	ep := func(ip string) string { return ip + ":8080" }
	tcp := func(src, dst string, port int) Flow { return Flow{Src: src, Dst: dst, Proto: "tcp", DPort: port} }
	udp := func(src, dst string, port int) Flow { return Flow{Src: src, Dst: dst, Proto: "udp", DPort: port} }
	fromNode := func(f Flow) Flow { f.FromNode = true; return f }
	sticky := map[string][]string{ep(RemoteEP2): {LocalPod}}
	return []FlowTest{
		// ClusterIP: spread over both endpoints; masquerade only traffic
		// that does not come from a pod.
		{
			Name: "pod to ClusterIP", Case: "clusterip", Flow: tcp(LocalPod, "10.96.0.10", 80),
			Want: Accepted(false, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "node to ClusterIP", Case: "clusterip", Flow: fromNode(tcp(NodeIP, "10.96.0.10", 80)),
			Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "off-cluster client to ClusterIP", Case: "clusterip", Flow: tcp(Client, "10.96.0.10", 80),
			Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "hairpin", Case: "clusterip", Flow: tcp(LocalEP, "10.96.0.10", 80),
			Want: Join(Accepted(true, ep(LocalEP)), Accepted(false, ep(RemoteEP))),
		},
		{
			Name: "ClusterIP other port", Case: "clusterip", Flow: tcp(LocalPod, "10.96.0.10", 81),
			Want: Accepted(false),
		},
		{
			Name: "ClusterIP other protocol", Case: "clusterip", Flow: udp(LocalPod, "10.96.0.10", 80),
			Want: Accepted(false),
		},
		{
			Name: "node to ClusterIP other port", Case: "clusterip", Flow: fromNode(tcp(NodeIP, "10.96.0.10", 81)),
			Want: Accepted(false),
		},

		// NodePort: any local address but loopback; eTP Cluster masquerades.
		{
			Name: "client to NodePort", Case: "nodeport", Flow: tcp(Client, NodeIP, 30080),
			Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "client to NodePort on second address", Case: "nodeport", Local: []string{"10.0.0.1"},
			Flow: tcp(Client, "10.0.0.1", 30080), Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "node to own NodePort", Case: "nodeport", Flow: fromNode(tcp(NodeIP, NodeIP, 30080)),
			Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "localhost NodePort not served", Case: "nodeport", Flow: fromNode(tcp("127.0.0.1", "127.0.0.1", 30080)),
			Want: Accepted(false),
		},
		{
			Name: "NodePort number on a non-local address", Case: "nodeport", Flow: tcp(Client, "198.51.100.99", 30080),
			Want: Accepted(false),
		},
		{
			Name: "NodePort number on the ClusterIP", Case: "nodeport", Flow: tcp(Client, "10.96.0.20", 30080),
			Want: Accepted(false),
		},
		{
			Name: "ClusterIP of NodePort service", Case: "nodeport", Flow: tcp(LocalPod, "10.96.0.20", 80),
			Want: Accepted(false, ep(LocalEP), ep(RemoteEP)),
		},

		// nodePortAddresses: only local addresses inside the CIDRs.
		{
			Name: "NodePort in nodePortAddresses", Case: "nodeport-addresses", Local: []string{"10.0.0.1"},
			Flow: tcp(Client, NodeIP, 30080), Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "NodePort outside nodePortAddresses", Case: "nodeport-addresses", Local: []string{"10.0.0.1"},
			Flow: tcp(Client, "10.0.0.1", 30080), Want: Accepted(false),
		},

		// No endpoints at all: REJECT everywhere.
		{
			Name: "pod to ClusterIP without endpoints", Case: "no-endpoints", Flow: tcp(LocalPod, "10.96.0.30", 80),
			Want: Refused("REJECT"),
		},
		{
			Name: "node to ClusterIP without endpoints", Case: "no-endpoints", Flow: fromNode(tcp(NodeIP, "10.96.0.30", 80)),
			Want: Refused("REJECT"),
		},
		{
			Name: "client to NodePort without endpoints", Case: "no-endpoints", Flow: tcp(Client, NodeIP, 30030),
			Want: Refused("REJECT"),
		},
		{
			Name: "client to external IP without endpoints", Case: "no-endpoints", Flow: tcp(Client, "198.51.100.30", 80),
			Want: Refused("REJECT"),
		},

		// eTP Local with a local endpoint: external traffic keeps its
		// source and stays on the node; pods and the node short-circuit.
		{
			Name: "client to LB IP, eTP Local", Case: "etp-local", Flow: tcp(Client, "198.51.100.40", 80),
			Want: Accepted(false, ep(LocalEP)),
		},
		{
			Name: "client to NodePort, eTP Local", Case: "etp-local", Flow: tcp(Client, NodeIP, 30040),
			Want: Accepted(false, ep(LocalEP)),
		},
		{
			Name: "pod to LB IP short-circuits, eTP Local", Case: "etp-local", Flow: tcp(LocalPod, "198.51.100.40", 80),
			Want: Accepted(false, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "node to NodePort, eTP Local", Case: "etp-local", Flow: fromNode(tcp(NodeIP, NodeIP, 30040)),
			Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "health check node port reachable", Case: "etp-local", Flow: tcp(Client, NodeIP, 32040),
			Want: Accepted(false),
		},
		{
			Name: "node to LB IP, eTP Local without local endpoint, short-circuits", Case: "etp-local-no-local-endpoints",
			Flow: fromNode(tcp(NodeIP, "198.51.100.40", 80)), Want: Accepted(true, ep(RemoteEP), ep(RemoteEP2)),
		},

		// eTP Local without a local endpoint: external traffic dropped,
		// cluster traffic served.
		{
			Name: "client to LB IP, no local endpoint", Case: "etp-local-no-local-endpoints", Flow: tcp(Client, "198.51.100.40", 80),
			Want: Refused("DROP"),
		},
		{
			Name: "client to NodePort, no local endpoint", Case: "etp-local-no-local-endpoints", Flow: tcp(Client, NodeIP, 30040),
			Want: Refused("DROP"),
		},
		{
			Name: "pod to LB IP, no local endpoint", Case: "etp-local-no-local-endpoints", Flow: tcp(LocalPod, "198.51.100.40", 80),
			Want: Accepted(false, ep(RemoteEP), ep(RemoteEP2)),
		},
		{
			Name: "pod to ClusterIP, no local endpoint", Case: "etp-local-no-local-endpoints", Flow: tcp(LocalPod, "10.96.0.40", 80),
			Want: Accepted(false, ep(RemoteEP), ep(RemoteEP2)),
		},

		// iTP Local.
		{
			Name: "pod to ClusterIP, iTP Local", Case: "itp-local", Flow: udp(LocalPod, "10.96.0.50", 53),
			Want: Accepted(false, LocalEP+":5353"),
		},
		{
			Name: "node to ClusterIP, iTP Local", Case: "itp-local", Flow: fromNode(udp(NodeIP, "10.96.0.50", 53)),
			Want: Accepted(true, LocalEP+":5353"),
		},
		{
			Name: "pod to ClusterIP, iTP Local without local endpoint", Case: "itp-local-no-local-endpoints", Flow: udp(LocalPod, "10.96.0.50", 53),
			Want: Refused("DROP"),
		},

		// Affinity: a fresh client may go anywhere; a known one sticks.
		{
			Name: "affinity new client", Case: "affinity", Flow: tcp(LocalPod, "10.96.0.60", 80),
			Want: Accepted(false, ep(LocalEP), ep(RemoteEP), ep(RemoteEP2)),
		},
		{
			Name: "affinity known client", Case: "affinity", Flow: tcp(LocalPod, "10.96.0.60", 80), Affinity: sticky,
			Want: Accepted(false, ep(RemoteEP2)),
		},
		{
			Name: "affinity other client", Case: "affinity", Flow: tcp("10.244.1.6", "10.96.0.60", 80), Affinity: sticky,
			Want: Accepted(false, ep(LocalEP), ep(RemoteEP), ep(RemoteEP2)),
		},

		// loadBalancerSourceRanges.
		{
			Name: "LB from allowed source", Case: "lb-source-ranges", Flow: tcp(Client, "198.51.100.70", 443),
			Want: Accepted(true, RemoteEP+":8443"),
		},
		{
			Name: "LB from other source", Case: "lb-source-ranges", Flow: tcp(Client2, "198.51.100.70", 443),
			Want: Refused("DROP"),
		},
		{
			Name: "LB from node via LB IP source", Case: "lb-source-ranges", Flow: fromNode(tcp("198.51.100.70", "198.51.100.70", 443)),
			Want: Accepted(true, RemoteEP+":8443"),
		},
		{
			Name: "NodePort ignores source ranges", Case: "lb-source-ranges", Flow: tcp(Client2, NodeIP, 30443),
			Want: Accepted(true, RemoteEP+":8443"),
		},

		// External IPs: eTP Cluster always masquerades.
		{
			Name: "client to external IP", Case: "external-ip", Flow: tcp(Client, "198.51.100.80", 80),
			Want: Accepted(true, ep(RemoteEP)),
		},
		{
			Name: "pod to external IP", Case: "external-ip", Flow: tcp(LocalPod, "198.51.100.80", 80),
			Want: Accepted(true, ep(RemoteEP)),
		},

		// SCTP and UDP ports.
		{
			Name: "SCTP port", Case: "sctp-udp", Flow: Flow{Src: LocalPod, Dst: "10.96.0.90", Proto: "sctp", DPort: 3868},
			Want: Accepted(false, RemoteEP+":3868"),
		},
		{
			Name: "UDP port", Case: "sctp-udp", Flow: udp(LocalPod, "10.96.0.90", 53),
			Want: Accepted(false, LocalEP+":5353", RemoteEP+":5353"),
		},
		{
			Name: "TCP on a UDP port", Case: "sctp-udp", Flow: tcp(LocalPod, "10.96.0.90", 53),
			Want: Accepted(false),
		},

		// Dual stack: each family's rules serve its own addresses.
		{
			Name: "IPv4 side of dual stack", Case: "dual-stack-ipv4", Flow: tcp(LocalPod, "10.96.0.100", 80),
			Want: Accepted(false, ep(LocalEP)),
		},
		{
			Name: "IPv6 side of dual stack", Case: "dual-stack-ipv6", Flow: tcp("fd00:244:1::5", "fd00:96::100", 80),
			Want: Accepted(false, "[fd00:244:1::10]:8080", "[fd00:244:2::10]:8080"),
		},
		{
			Name: "IPv6 NodePort", Case: "dual-stack-ipv6", Flow: tcp("fd00:100::2", NodeIP6, 30100),
			Want: Accepted(true, "[fd00:244:1::10]:8080", "[fd00:244:2::10]:8080"),
		},
		{
			Name: "IPv6 localhost NodePort not served", Case: "dual-stack-ipv6", Flow: fromNode(tcp("::1", "::1", 30100)),
			Want: Accepted(false),
		},

		// Multi-port: each port on its own.
		{
			Name: "multi-port served port", Case: "multi-port", Flow: tcp(LocalPod, "10.96.0.110", 80),
			Want: Accepted(false, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "multi-port port without endpoints", Case: "multi-port", Flow: tcp(LocalPod, "10.96.0.110", 9090),
			Want: Refused("REJECT"),
		},

		// Local-traffic detection variants.
		{
			Name: "no detection: client to ClusterIP not masqueraded", Case: "no-local-detection", Flow: tcp(Client, "10.96.0.10", 80),
			Want: Accepted(false, ep(LocalEP), ep(RemoteEP)),
		},
		{
			Name: "no detection: pod to eTP Local LB IP stays local", Case: "no-local-detection", Flow: tcp(LocalPod, "198.51.100.40", 80),
			Want: Accepted(false, ep(LocalEP)),
		},
		{
			Name: "masquerade all", Case: "masquerade-all-node-cidr", Flow: tcp(LocalPod, "10.96.0.10", 80),
			Want: Accepted(true, ep(LocalEP), ep(RemoteEP)),
		},
	}
}
