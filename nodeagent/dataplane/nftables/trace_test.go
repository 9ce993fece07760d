package nftables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// accepted lists the outcomes of a flow DNATed to each of dnats (none:
// not DNATed) and accepted, masqueraded or not.
func accepted(masq bool, dnats ...string) []outcome {
	if len(dnats) == 0 {
		return []outcome{{verdict: "ACCEPT", masq: masq}}
	}
	out := make([]outcome, 0, len(dnats))
	for _, d := range dnats {
		out = append(out, outcome{dnat: d, verdict: "ACCEPT", masq: masq})
	}
	return out
}

// refused is a flow ending in verdict (REJECT or DROP) without DNAT.
func refused(verdict string) []outcome { return []outcome{{verdict: verdict}} }

func join(parts ...[]outcome) []outcome { return slices.Concat(parts...) }

// TestFlows traces packets through each case's ruleset, as programmed
// into the fake kernel by a full Sync. The cases are the iptables
// dataplane's, with the outcomes kube-proxy's nftables mode gives.
func TestFlows(t *testing.T) {
	ep := func(ip string) string { return ip + ":8080" }
	tests := []struct {
		name  string
		cas   string
		flow  flow
		local []string // extra local addresses
		// affinity seeds affinity sets: set name -> sources.
		affinity map[string][]string
		want     []outcome
	}{
		// ClusterIP: spread over both endpoints; masquerade only traffic
		// that does not come from a pod.
		{name: "pod to ClusterIP", cas: "clusterip", flow: flow{src: localPod, dst: "10.96.0.10", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP), ep(remoteEP))},
		{name: "node to ClusterIP", cas: "clusterip", flow: flow{src: nodeIP, dst: "10.96.0.10", proto: "tcp", dport: 80, fromNode: true},
			want: accepted(true, ep(localEP), ep(remoteEP))},
		{name: "off-cluster client to ClusterIP", cas: "clusterip", flow: flow{src: client, dst: "10.96.0.10", proto: "tcp", dport: 80},
			want: accepted(true, ep(localEP), ep(remoteEP))},
		{name: "hairpin", cas: "clusterip", flow: flow{src: localEP, dst: "10.96.0.10", proto: "tcp", dport: 80},
			want: join(accepted(true, ep(localEP)), accepted(false, ep(remoteEP)))},
		// A ClusterIP on a port or protocol the Service lacks is refused,
		// as kube-proxy's nftables mode (its iptables mode routes it on).
		{name: "ClusterIP other port", cas: "clusterip", flow: flow{src: localPod, dst: "10.96.0.10", proto: "tcp", dport: 81},
			want: refused("REJECT")},
		{name: "ClusterIP other protocol", cas: "clusterip", flow: flow{src: localPod, dst: "10.96.0.10", proto: "udp", dport: 80},
			want: refused("REJECT")},
		{name: "node to ClusterIP other port", cas: "clusterip", flow: flow{src: nodeIP, dst: "10.96.0.10", proto: "tcp", dport: 81, fromNode: true},
			want: refused("REJECT")},

		// NodePort: any local address but loopback; eTP Cluster masquerades.
		{name: "client to NodePort", cas: "nodeport", flow: flow{src: client, dst: nodeIP, proto: "tcp", dport: 30080},
			want: accepted(true, ep(localEP), ep(remoteEP))},
		{name: "client to NodePort on second address", cas: "nodeport", local: []string{"10.0.0.1"},
			flow: flow{src: client, dst: "10.0.0.1", proto: "tcp", dport: 30080}, want: accepted(true, ep(localEP), ep(remoteEP))},
		{name: "node to own NodePort", cas: "nodeport", flow: flow{src: nodeIP, dst: nodeIP, proto: "tcp", dport: 30080, fromNode: true},
			want: accepted(true, ep(localEP), ep(remoteEP))},
		{name: "localhost NodePort not served", cas: "nodeport", flow: flow{src: "127.0.0.1", dst: "127.0.0.1", proto: "tcp", dport: 30080, fromNode: true},
			want: accepted(false)},
		{name: "NodePort number on a non-local address", cas: "nodeport", flow: flow{src: client, dst: "198.51.100.99", proto: "tcp", dport: 30080},
			want: accepted(false)},
		{name: "NodePort number on the ClusterIP", cas: "nodeport", flow: flow{src: client, dst: "10.96.0.20", proto: "tcp", dport: 30080},
			want: refused("REJECT")},
		{name: "ClusterIP of NodePort service", cas: "nodeport", flow: flow{src: localPod, dst: "10.96.0.20", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP), ep(remoteEP))},

		// nodePortAddresses: only local addresses inside the CIDRs.
		{name: "NodePort in nodePortAddresses", cas: "nodeport-addresses", local: []string{"10.0.0.1"},
			flow: flow{src: client, dst: nodeIP, proto: "tcp", dport: 30080}, want: accepted(true, ep(localEP), ep(remoteEP))},
		{name: "NodePort outside nodePortAddresses", cas: "nodeport-addresses", local: []string{"10.0.0.1"},
			flow: flow{src: client, dst: "10.0.0.1", proto: "tcp", dport: 30080}, want: accepted(false)},

		// No endpoints at all: REJECT everywhere.
		{name: "pod to ClusterIP without endpoints", cas: "no-endpoints", flow: flow{src: localPod, dst: "10.96.0.30", proto: "tcp", dport: 80},
			want: refused("REJECT")},
		{name: "node to ClusterIP without endpoints", cas: "no-endpoints", flow: flow{src: nodeIP, dst: "10.96.0.30", proto: "tcp", dport: 80, fromNode: true},
			want: refused("REJECT")},
		{name: "client to NodePort without endpoints", cas: "no-endpoints", flow: flow{src: client, dst: nodeIP, proto: "tcp", dport: 30030},
			want: refused("REJECT")},
		{name: "client to external IP without endpoints", cas: "no-endpoints", flow: flow{src: client, dst: "198.51.100.30", proto: "tcp", dport: 80},
			want: refused("REJECT")},

		// eTP Local with a local endpoint: external traffic keeps its
		// source and stays on the node; pods and the node short-circuit.
		{name: "client to LB IP, eTP Local", cas: "etp-local", flow: flow{src: client, dst: "198.51.100.40", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP))},
		{name: "client to NodePort, eTP Local", cas: "etp-local", flow: flow{src: client, dst: nodeIP, proto: "tcp", dport: 30040},
			want: accepted(false, ep(localEP))},
		{name: "pod to LB IP short-circuits, eTP Local", cas: "etp-local", flow: flow{src: localPod, dst: "198.51.100.40", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP), ep(remoteEP))},
		{name: "node to NodePort, eTP Local", cas: "etp-local", flow: flow{src: nodeIP, dst: nodeIP, proto: "tcp", dport: 30040, fromNode: true},
			want: accepted(true, ep(localEP), ep(remoteEP))},
		// Not opened by a rule (see README): nothing here stops it.
		{name: "health check node port not blocked", cas: "etp-local", flow: flow{src: client, dst: nodeIP, proto: "tcp", dport: 32040},
			want: accepted(false)},
		{name: "node to LB IP, eTP Local without local endpoint, short-circuits", cas: "etp-local-no-local-endpoints",
			flow: flow{src: nodeIP, dst: "198.51.100.40", proto: "tcp", dport: 80, fromNode: true}, want: accepted(true, ep(remoteEP), ep(remoteEP2))},

		// eTP Local without a local endpoint: external traffic dropped,
		// cluster traffic served.
		{name: "client to LB IP, no local endpoint", cas: "etp-local-no-local-endpoints", flow: flow{src: client, dst: "198.51.100.40", proto: "tcp", dport: 80},
			want: refused("DROP")},
		{name: "client to NodePort, no local endpoint", cas: "etp-local-no-local-endpoints", flow: flow{src: client, dst: nodeIP, proto: "tcp", dport: 30040},
			want: refused("DROP")},
		{name: "pod to LB IP, no local endpoint", cas: "etp-local-no-local-endpoints", flow: flow{src: localPod, dst: "198.51.100.40", proto: "tcp", dport: 80},
			want: accepted(false, ep(remoteEP), ep(remoteEP2))},
		{name: "pod to ClusterIP, no local endpoint", cas: "etp-local-no-local-endpoints", flow: flow{src: localPod, dst: "10.96.0.40", proto: "tcp", dport: 80},
			want: accepted(false, ep(remoteEP), ep(remoteEP2))},

		// iTP Local.
		{name: "pod to ClusterIP, iTP Local", cas: "itp-local", flow: flow{src: localPod, dst: "10.96.0.50", proto: "udp", dport: 53},
			want: accepted(false, localEP+":5353")},
		{name: "node to ClusterIP, iTP Local", cas: "itp-local", flow: flow{src: nodeIP, dst: "10.96.0.50", proto: "udp", dport: 53, fromNode: true},
			want: accepted(true, localEP+":5353")},
		{name: "pod to ClusterIP, iTP Local without local endpoint", cas: "itp-local-no-local-endpoints", flow: flow{src: localPod, dst: "10.96.0.50", proto: "udp", dport: 53},
			want: refused("DROP")},

		// Affinity: a fresh client may go anywhere; a known one sticks.
		{name: "affinity new client", cas: "affinity", flow: flow{src: localPod, dst: "10.96.0.60", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP), ep(remoteEP), ep(remoteEP2))},
		{name: "affinity known client", cas: "affinity", flow: flow{src: localPod, dst: "10.96.0.60", proto: "tcp", dport: 80},
			affinity: map[string][]string{affinitySet("ns/sticky", "http", ep(remoteEP2)): {localPod}},
			want:     accepted(false, ep(remoteEP2))},
		{name: "affinity other client", cas: "affinity", flow: flow{src: "10.244.1.6", dst: "10.96.0.60", proto: "tcp", dport: 80},
			affinity: map[string][]string{affinitySet("ns/sticky", "http", ep(remoteEP2)): {localPod}},
			want:     accepted(false, ep(localEP), ep(remoteEP), ep(remoteEP2))},

		// loadBalancerSourceRanges.
		{name: "LB from allowed source", cas: "lb-source-ranges", flow: flow{src: client, dst: "198.51.100.70", proto: "tcp", dport: 443},
			want: accepted(true, remoteEP+":8443")},
		{name: "LB from other source", cas: "lb-source-ranges", flow: flow{src: client2, dst: "198.51.100.70", proto: "tcp", dport: 443},
			want: refused("DROP")},
		{name: "LB from node via LB IP source", cas: "lb-source-ranges", flow: flow{src: "198.51.100.70", dst: "198.51.100.70", proto: "tcp", dport: 443, fromNode: true},
			want: accepted(true, remoteEP+":8443")},
		{name: "NodePort ignores source ranges", cas: "lb-source-ranges", flow: flow{src: client2, dst: nodeIP, proto: "tcp", dport: 30443},
			want: accepted(true, remoteEP+":8443")},

		// External IPs: eTP Cluster always masquerades.
		{name: "client to external IP", cas: "external-ip", flow: flow{src: client, dst: "198.51.100.80", proto: "tcp", dport: 80},
			want: accepted(true, ep(remoteEP))},
		{name: "pod to external IP", cas: "external-ip", flow: flow{src: localPod, dst: "198.51.100.80", proto: "tcp", dport: 80},
			want: accepted(true, ep(remoteEP))},

		// SCTP and UDP ports.
		{name: "SCTP port", cas: "sctp-udp", flow: flow{src: localPod, dst: "10.96.0.90", proto: "sctp", dport: 3868},
			want: accepted(false, remoteEP+":3868")},
		{name: "UDP port", cas: "sctp-udp", flow: flow{src: localPod, dst: "10.96.0.90", proto: "udp", dport: 53},
			want: accepted(false, localEP+":5353", remoteEP+":5353")},
		{name: "TCP on a UDP port", cas: "sctp-udp", flow: flow{src: localPod, dst: "10.96.0.90", proto: "tcp", dport: 53},
			want: refused("REJECT")},

		// Dual stack: each family's rules serve its own addresses.
		{name: "IPv4 side of dual stack", cas: "dual-stack-ipv4", flow: flow{src: localPod, dst: "10.96.0.100", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP))},
		{name: "IPv6 side of dual stack", cas: "dual-stack-ipv6", flow: flow{src: "fd00:244:1::5", dst: "fd00:96::100", proto: "tcp", dport: 80},
			want: accepted(false, "[fd00:244:1::10]:8080", "[fd00:244:2::10]:8080")},
		{name: "IPv6 NodePort", cas: "dual-stack-ipv6", flow: flow{src: "fd00:100::2", dst: nodeIP6, proto: "tcp", dport: 30100},
			want: accepted(true, "[fd00:244:1::10]:8080", "[fd00:244:2::10]:8080")},
		{name: "IPv6 localhost NodePort not served", cas: "dual-stack-ipv6", flow: flow{src: "::1", dst: "::1", proto: "tcp", dport: 30100, fromNode: true},
			want: accepted(false)},

		// Multi-port: each port on its own.
		{name: "multi-port served port", cas: "multi-port", flow: flow{src: localPod, dst: "10.96.0.110", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP), ep(remoteEP))},
		{name: "multi-port port without endpoints", cas: "multi-port", flow: flow{src: localPod, dst: "10.96.0.110", proto: "tcp", dport: 9090},
			want: refused("REJECT")},

		// Local-traffic detection variants.
		{name: "no detection: client to ClusterIP not masqueraded", cas: "no-local-detection", flow: flow{src: client, dst: "10.96.0.10", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP), ep(remoteEP))},
		{name: "no detection: pod to eTP Local LB IP stays local", cas: "no-local-detection", flow: flow{src: localPod, dst: "198.51.100.40", proto: "tcp", dport: 80},
			want: accepted(false, ep(localEP))},
		{name: "masquerade all", cas: "masquerade-all-node-cidr", flow: flow{src: localPod, dst: "10.96.0.10", proto: "tcp", dport: 80},
			want: accepted(true, ep(localEP), ep(remoteEP))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := caseNamed(t, tt.cas)
			k := newFakeKernel(c.family)
			d := newDataplane(c.config(), k)
			if err := d.Sync(context.Background(), newTable(t, testNode(), c.services()...), nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			local := append([]string{nodeIP, nodeIP6, "127.0.0.1", "::1"}, tt.local...)
			tr := newTracer(t, k, local...)
			for set, srcs := range tt.affinity {
				if _, ok := k.table.sets[set]; !ok {
					t.Fatalf("no affinity set %s", set)
				}
				tr.affinity[set] = srcs
			}
			got := tr.trace(tt.flow)
			want := slices.Clone(tt.want)
			slices.SortFunc(want, func(a, b outcome) int { return strings.Compare(a.String(), b.String()) })
			if !slices.Equal(got, want) {
				t.Errorf("flow %+v:\n got  %v\n want %v", tt.flow, got, want)
			}
		})
	}
}

func caseNamed(t *testing.T, name string) testCase {
	t.Helper()
	for _, c := range cases {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no case %q", name)
	return testCase{}
}

// affinitySet names the affinity set of endpoint ipPort of port portName
// of Service key with a 600 s timeout (the affinity case's).
func affinitySet(key, portName, ipPort string) string {
	ap := netip.MustParseAddrPort(ipPort)
	return prefixAffinitySet + affinityNameBase(key, "tcp", portName, ap.Addr().String(), int32(ap.Port()), 600)
}
