package iptables

import (
	"context"
	"slices"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// TestFlows traces packets through each case's ruleset, as programmed
// into the fake kernel by a full Sync (jumps included). The flows and
// their outcomes are kube-proxy's iptables mode's (dptest.Flows).
func TestFlows(t *testing.T) {
	for _, tt := range dptest.Flows() {
		t.Run(tt.Name, func(t *testing.T) {
			c := dptest.CaseNamed(t, tt.Case)
			f := newFakeRunner()
			d := newTestDataplane(caseConfig(c), f, nil)
			if err := d.Sync(context.Background(), dptest.Table(t, dptest.Node(), c.Services()...), nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			local := append([]string{dptest.NodeIP, dptest.NodeIP6, "127.0.0.1", "::1"}, tt.Local...)
			tr := newTracer(t, f.kernel, local...)
			for ep, clients := range tt.Affinity {
				tr.recent[sepChain("ns/sticky:http", "tcp", ep)] = clients
			}
			got, want := tr.trace(tt.Flow), dptest.SortOutcomes(slices.Clone(tt.Want))
			if !slices.Equal(got, want) {
				t.Errorf("flow %+v:\n got  %v\n want %v", tt.Flow, got, want)
			}
		})
	}
}

func sepChain(spn, proto, ipPort string) string { return prefixSep + portHash(spn, proto, ipPort) }
