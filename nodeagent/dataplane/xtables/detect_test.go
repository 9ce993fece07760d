package xtables

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// fakeRunner dumps canned tables (or fails) and records what ran.
type fakeRunner struct {
	dumps    map[string]string
	fail     bool
	saves    []string
	restores int
}

func (f *fakeRunner) Save(_ context.Context, table string) ([]byte, error) {
	f.saves = append(f.saves, table)
	if f.fail {
		return nil, errors.New("modules missing")
	}
	return []byte(f.dumps[table]), nil
}

func (f *fakeRunner) Restore(context.Context, []byte, ...string) error {
	f.restores++
	return nil
}

func (f *fakeRunner) EnsureRule(context.Context, string, string, ...string) error { return nil }

func dumpWith(nat, filter, mangle string) *fakeRunner {
	return &fakeRunner{dumps: map[string]string{"nat": nat, "filter": filter, "mangle": mangle}}
}

func TestDetectBackend(t *testing.T) {
	const rules3 = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j ACCEPT\n-A INPUT -j ACCEPT\nCOMMIT\n"
	const rules1 = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"
	const ours = "*nat\n:PP-SERVICES - [0:0]\nCOMMIT\n"
	const hint = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	tests := []struct {
		name        string
		nft, legacy *fakeRunner
		want        Backend
		wantErr     bool
	}{
		{name: "empty node defaults to nft", nft: dumpWith("", "", ""), legacy: dumpWith("", "", ""), want: BackendNFT},
		{name: "more legacy rules", nft: dumpWith("", rules1, ""), legacy: dumpWith("", rules3, ""), want: BackendLegacy},
		{name: "more nft rules", nft: dumpWith("", rules3, ""), legacy: dumpWith("", rules1, ""), want: BackendNFT},
		{name: "tie is nft", nft: dumpWith("", rules1, ""), legacy: dumpWith("", rules1, ""), want: BackendNFT},
		{name: "kubelet hint beats counts", nft: dumpWith("", rules3, ""), legacy: dumpWith("", "", hint), want: BackendLegacy},
		{name: "our own chains beat the hint", nft: dumpWith("", "", hint), legacy: dumpWith(ours, "", ""), want: BackendLegacy},
		{name: "legacy tools broken", nft: dumpWith("", rules1, ""), legacy: &fakeRunner{fail: true}, want: BackendNFT},
		{name: "nft tools broken", nft: &fakeRunner{fail: true}, legacy: dumpWith("", "", ""), want: BackendLegacy},
		{name: "all broken", nft: &fakeRunner{fail: true}, legacy: &fakeRunner{fail: true}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DetectBackend(context.Background(), "PP-SERVICES", tt.nft, tt.legacy)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("DetectBackend = %s, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("DetectBackend = %s, %v; want %s", got, err, tt.want)
			}
		})
	}
}

// TestToolsDetectOnce checks that Tools detects at the first call only,
// and not at all for a fixed backend, and that a backend without tools
// is left out of detection.
func TestToolsDetectOnce(t *testing.T) {
	legacy := dumpWith("", "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n", "")
	tools := NewTools("PP-SERVICES", BackendAuto, map[Backend]Runner{BackendLegacy: legacy})
	if b := tools.Backend(); b != "" {
		t.Fatalf("Backend before detection = %q", b)
	}
	for range 2 {
		r, err := tools.Runner(context.Background())
		if err != nil || r != legacy {
			t.Fatalf("Runner = %v, %v; want the legacy runner", r, err)
		}
	}
	if b := tools.Backend(); b != BackendLegacy || !slices.Equal(legacy.saves, []string{"nat", "filter", "mangle"}) {
		t.Errorf("Backend = %q after dumps %v; want legacy, detected once", b, legacy.saves)
	}

	nft := dumpWith("", "", "")
	fixed := NewTools("PP-SERVICES", BackendNFT, map[Backend]Runner{BackendNFT: nft})
	if r, err := fixed.Runner(context.Background()); err != nil || r != nft || fixed.Backend() != BackendNFT || len(nft.saves) != 0 {
		t.Errorf("fixed backend: Runner = %v, %v, Backend %q, dumps %v; want nft without detection", r, err, fixed.Backend(), nft.saves)
	}

	broken := NewTools("PP-SERVICES", "", map[Backend]Runner{BackendNFT: &fakeRunner{fail: true}})
	if _, err := broken.Runner(context.Background()); err == nil || broken.Backend() != "" {
		t.Errorf("detection with broken tools: %v, backend %q; want an error and none", err, broken.Backend())
	}
}

func TestScanSave(t *testing.T) {
	chains, rules := ScanSave([]byte("*nat\n:PREROUTING ACCEPT [0:0]\n:PP-SVC-X - [0:0]\n-A PREROUTING -j PP-SVC-X\n-A PP-SVC-X -j RETURN\nCOMMIT\n"))
	if !slices.Equal(chains, []string{"PREROUTING", "PP-SVC-X"}) || rules != 2 {
		t.Errorf("ScanSave = %v, %d", chains, rules)
	}
}
