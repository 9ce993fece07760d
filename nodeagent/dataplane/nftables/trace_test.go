package nftables

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// differs lists the flows whose outcome differs from kube-proxy's iptables
// mode (dptest.Flows): like kube-proxy's nftables mode, a ClusterIP
// reached on a port or protocol the Service lacks is refused, where the
// iptables mode routes it on.
var differs = map[string][]dptest.Outcome{
	"ClusterIP other port":             dptest.Refused("REJECT"),
	"ClusterIP other protocol":         dptest.Refused("REJECT"),
	"node to ClusterIP other port":     dptest.Refused("REJECT"),
	"NodePort number on the ClusterIP": dptest.Refused("REJECT"),
	"TCP on a UDP port":                dptest.Refused("REJECT"),
}

// TestFlows traces packets through each case's ruleset, as programmed
// into the fake kernel by a full Sync: the flows of dptest.Flows, with the
// outcomes kube-proxy's nftables mode gives.
func TestFlows(t *testing.T) {
	for _, tt := range dptest.Flows() {
		t.Run(tt.Name, func(t *testing.T) {
			c := dptest.CaseNamed(t, tt.Case)
			k := newFakeKernel(c.Family)
			d := newTestDataplane(caseConfig(c), k)
			if err := d.Sync(context.Background(), dptest.Table(t, dptest.Node(), c.Services()...), nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			local := append([]string{dptest.NodeIP, dptest.NodeIP6, "127.0.0.1", "::1"}, tt.Local...)
			tr := newTracer(t, k, local...)
			for ep, clients := range tt.Affinity {
				set := affinitySet("ns/sticky", "http", ep)
				if _, ok := k.table.sets[set]; !ok {
					t.Fatalf("no affinity set %s", set)
				}
				tr.affinity[set] = clients
			}
			want := tt.Want
			if w, ok := differs[tt.Name]; ok {
				want = w
			}
			got, want := tr.trace(tt.Flow), dptest.SortOutcomes(slices.Clone(want))
			if !slices.Equal(got, want) {
				t.Errorf("flow %+v:\n got  %v\n want %v", tt.Flow, got, want)
			}
		})
	}
}

// affinitySet names the affinity set of endpoint ipPort of port portName
// of Service key with a 600 s timeout (the affinity case's).
func affinitySet(key, portName, ipPort string) string {
	ap := netip.MustParseAddrPort(ipPort)
	return prefixAffinitySet + affinityNameBase(key, "tcp", portName, ap.Addr().String(), int32(ap.Port()), 600)
}
