package iptables

import (
	"context"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// TestDetectionAtFirstSync checks that a Dataplane in auto mode detects
// the backend once, at the first Sync, given its own chain, and writes to
// the chosen backend only.
func TestDetectionAtFirstSync(t *testing.T) {
	nft, legacy := newFakeRunner(), newFakeRunner()
	legacy.saveOutput = map[string]string{"filter": "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"}
	cfg := testConfig(dataplane.IPv4)
	cfg.Backend = xtables.BackendAuto
	d := newDataplane(cfg, map[xtables.Backend]xtables.Runner{xtables.BackendNFT: nft, xtables.BackendLegacy: legacy}, &fakeSysctls{}, nil)
	if b := d.b.tools.Backend(); b != "" {
		t.Fatalf("backend before the first Sync = %q", b)
	}
	for range 2 {
		if err := d.Sync(context.Background(), dptest.Table(t, dptest.Node(), dptest.ClusterIPTwoEndpoints()), nil, true); err != nil {
			t.Fatal(err)
		}
	}
	if b := d.b.tools.Backend(); b != xtables.BackendLegacy {
		t.Fatalf("backend = %q, want legacy", b)
	}
	if len(nft.restores) != 0 || len(legacy.restores) != 2 {
		t.Fatalf("restores: nft %d, legacy %d", len(nft.restores), len(legacy.restores))
	}
	// Detection dumped nat, filter and mangle of each backend once; the
	// first full sync listed legacy's nat.
	if len(nft.saves) != 3 || len(legacy.saves) != 4 {
		t.Fatalf("saves: nft %v, legacy %v", nft.saves, legacy.saves)
	}
}
