package ipvs

import (
	"context"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// saveRunner is an xtables.Saver that prints canned dumps.
type saveRunner struct{ dumps map[string]string }

func (r saveRunner) Save(_ context.Context, table string) ([]byte, error) {
	return []byte(r.dumps[table]), nil
}

// TestDetectBackendKnowsOurChain checks that detection (the iptables
// dataplane's) is given this dataplane's own chain: a node whose
// PP-IPVS-SERVICES is in legacy stays on legacy, whatever the hints say.
func TestDetectBackendKnowsOurChain(t *testing.T) {
	ours := saveRunner{dumps: map[string]string{"nat": ":PP-IPVS-SERVICES - [0:0]\n"}}
	hint := saveRunner{dumps: map[string]string{"mangle": ":KUBE-IPTABLES-HINT - [0:0]\n"}}
	got, err := xtables.DetectBackend(context.Background(), chainServices, hint, ours)
	if err != nil || got != xtables.BackendLegacy {
		t.Errorf("DetectBackend = %v, %v; want legacy", got, err)
	}
}

// TestAutoBackendDetectedAtFirstSync checks a Dataplane in auto mode
// detects once, writes to the chosen backend only, and reports the choice.
func TestAutoBackendDetectedAtFirstSync(t *testing.T) {
	k := newFakeKernel(nodeIPs[0][0])
	s := k.seams(dataplane.IPv4)
	legacy := newFakeIPTables(k, "iptables-legacy")
	legacy.tables["mangle"]["KUBE-KUBELET-CANARY"] = nil
	s.iptables[xtables.BackendLegacy] = legacy
	cfg := testConfig(dataplane.IPv4, 0)
	cfg.Backend = xtables.BackendAuto
	d := newDataplane(cfg, s, nil)
	if got := d.b.tools.Backend(); got != "" {
		t.Errorf("Backend before the first Sync = %q", got)
	}
	if err := d.Sync(context.Background(), dptest.Table(t, testNode(0)), nil, true); err != nil {
		t.Fatal(err)
	}
	if got := d.b.tools.Backend(); got != xtables.BackendLegacy || len(legacy.restores) != 1 || len(k.iptables[dataplane.IPv4].restores) != 0 {
		t.Errorf("Backend = %q, legacy restores %d, nft restores %d; want legacy only", got, len(legacy.restores), len(k.iptables[dataplane.IPv4].restores))
	}
}
