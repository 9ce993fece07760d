package ipvs

import (
	"context"
	"errors"
	"testing"
)

// saveRunner is an iptablesRunner whose Save prints canned dumps.
type saveRunner struct {
	iptablesRunner
	dumps map[string]string
	err   error
}

func (r saveRunner) Save(_ context.Context, table string) ([]byte, error) {
	return []byte(r.dumps[table]), r.err
}

func TestDetectBackend(t *testing.T) {
	empty := saveRunner{dumps: map[string]string{}}
	ours := saveRunner{dumps: map[string]string{"nat": ":PP-IPVS-SERVICES - [0:0]\n"}}
	hint := saveRunner{dumps: map[string]string{"mangle": ":KUBE-IPTABLES-HINT - [0:0]\n"}}
	busy := saveRunner{dumps: map[string]string{"filter": "-A INPUT -j ACCEPT\n-A INPUT -j DROP\n"}}
	broken := saveRunner{err: errors.New("exit status 1")}
	for _, tt := range []struct {
		name        string
		nft, legacy iptablesRunner
		want        Backend
	}{
		{"empty node: nft", empty, empty, BackendNFT},
		{"our chains in legacy", hint, ours, BackendLegacy},
		{"kubelet's hint in legacy", empty, hint, BackendLegacy},
		{"more rules in legacy", empty, busy, BackendLegacy},
		{"legacy tools broken", empty, broken, BackendNFT},
		{"only legacy installed", nil, empty, BackendLegacy},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runners := map[Backend]iptablesRunner{}
			if tt.nft != nil {
				runners[BackendNFT] = tt.nft
			}
			runners[BackendLegacy] = tt.legacy
			got, err := detectBackend(context.Background(), runners)
			if err != nil || got != tt.want {
				t.Errorf("detectBackend = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	if _, err := detectBackend(context.Background(), map[Backend]iptablesRunner{BackendNFT: broken, BackendLegacy: broken}); err == nil {
		t.Errorf("detectBackend with every backend broken succeeded")
	}
}

// TestAutoBackendDetectedAtFirstSync checks a Dataplane in auto mode
// detects once, writes to the chosen backend only, and reports the choice.
func TestAutoBackendDetectedAtFirstSync(t *testing.T) {
	k := newFakeKernel(nodeIPs[0][0])
	s := k.seams(IPv4)
	legacy := newFakeIPTables(k, "iptables-legacy")
	legacy.tables["mangle"]["KUBE-KUBELET-CANARY"] = nil
	s.iptables[BackendLegacy] = legacy
	cfg := testConfig(IPv4, 0)
	cfg.Backend = BackendAuto
	d := newDataplane(cfg, s)
	if got := d.Stats().Backend; got != "" {
		t.Errorf("Backend before the first Sync = %q", got)
	}
	if err := d.Sync(context.Background(), newTable(t, testNode(0)), nil, true); err != nil {
		t.Fatal(err)
	}
	if got := d.Stats().Backend; got != BackendLegacy || len(legacy.restores) != 1 || len(k.iptables[IPv4].restores) != 0 {
		t.Errorf("Backend = %q, legacy restores %d, nft restores %d; want legacy only", got, len(legacy.restores), len(k.iptables[IPv4].restores))
	}
}
