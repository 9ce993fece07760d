package iptables

import (
	"context"
	"errors"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// saveOnly is a runner whose Save returns canned dumps (or fails).
type saveOnly struct {
	fakeRunner
	fail bool
}

func (s *saveOnly) Save(_ context.Context, table string) ([]byte, error) {
	if s.fail {
		return nil, errors.New("modules missing")
	}
	return []byte(s.saveOutput[table]), nil
}

func dumpWith(nat, filter, mangle string) *saveOnly {
	return &saveOnly{fakeRunner: fakeRunner{saveOutput: map[string]string{"nat": nat, "filter": filter, "mangle": mangle}}}
}

func TestDetectBackend(t *testing.T) {
	const rules3 = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n-A INPUT -j ACCEPT\n-A INPUT -j ACCEPT\nCOMMIT\n"
	const rules1 = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"
	const ours = "*nat\n:PP-SERVICES - [0:0]\nCOMMIT\n"
	const hint = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	tests := []struct {
		name        string
		nft, legacy *saveOnly
		want        Backend
		wantErr     bool
	}{
		{name: "empty node defaults to nft", nft: dumpWith("", "", ""), legacy: dumpWith("", "", ""), want: BackendNFT},
		{name: "more legacy rules", nft: dumpWith("", rules1, ""), legacy: dumpWith("", rules3, ""), want: BackendLegacy},
		{name: "more nft rules", nft: dumpWith("", rules3, ""), legacy: dumpWith("", rules1, ""), want: BackendNFT},
		{name: "tie is nft", nft: dumpWith("", rules1, ""), legacy: dumpWith("", rules1, ""), want: BackendNFT},
		{name: "kubelet hint beats counts", nft: dumpWith("", rules3, ""), legacy: dumpWith("", "", hint), want: BackendLegacy},
		{name: "our own chains beat the hint", nft: dumpWith("", "", hint), legacy: dumpWith(ours, "", ""), want: BackendLegacy},
		{name: "legacy tools broken", nft: dumpWith("", rules1, ""), legacy: &saveOnly{fail: true}, want: BackendNFT},
		{name: "nft tools broken", nft: &saveOnly{fail: true}, legacy: dumpWith("", "", ""), want: BackendLegacy},
		{name: "all broken", nft: &saveOnly{fail: true}, legacy: &saveOnly{fail: true}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DetectBackend(context.Background(), chainServices, tt.nft, tt.legacy)
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

func TestDetectionAtFirstSync(t *testing.T) {
	nft, legacy := newFakeRunner(), newFakeRunner()
	legacy.saveOutput = map[string]string{"filter": "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"}
	cfg := testConfig(IPv4)
	cfg.Backend = BackendAuto
	d := newDataplane(cfg, map[Backend]runner{BackendNFT: nft, BackendLegacy: legacy})
	if b := d.Stats().Backend; b != "" {
		t.Fatalf("backend before the first Sync = %q", b)
	}
	if err := d.Sync(context.Background(), dptest.Table(t, dptest.Node(), dptest.ClusterIPTwoEndpoints()), nil, true); err != nil {
		t.Fatal(err)
	}
	if b := d.Stats().Backend; b != BackendLegacy {
		t.Fatalf("backend = %q, want legacy", b)
	}
	if len(nft.restores) != 0 || len(legacy.restores) != 1 {
		t.Fatalf("restores: nft %d, legacy %d", len(nft.restores), len(legacy.restores))
	}
}

func TestConfigValidate(t *testing.T) {
	ok := testConfig(IPv4)
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"family":            func(c *Config) { c.Family = 5 },
		"backend":           func(c *Config) { c.Backend = "iptables" },
		"masquerade bit":    func(c *Config) { c.MasqueradeBit = 32 },
		"local mode":        func(c *Config) { c.LocalMode = "Bridge" },
		"no cluster CIDR":   func(c *Config) { c.ClusterCIDRs = []string{"fd00::/48"} },
		"two cluster CIDRs": func(c *Config) { c.ClusterCIDRs = []string{"10.0.0.0/16", "10.1.0.0/16"} },
		"bad CIDR":          func(c *Config) { c.ClusterCIDRs = []string{"10.0.0.0/33"} },
		"loopback nodeport": func(c *Config) { c.NodePortAddresses = []string{"127.0.0.0/8"} },
		"bad node IP":       func(c *Config) { c.NodeIPs = []string{"node"} },
		"negative lock":     func(c *Config) { c.LockWait = -1 },
	} {
		c := testConfig(IPv4)
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
	}
	all := testConfig(IPv4)
	all.NodePortAddresses = []string{"0.0.0.0/0"}
	if err := all.Validate(); err != nil {
		t.Errorf("0.0.0.0/0 nodePortAddresses: %v", err)
	}
}

func TestErrorPredicates(t *testing.T) {
	re := &RestoreError{Binary: "iptables-restore", Line: 3, Key: "ns/a", Err: errors.New("exit status 1")}
	wrapped := errors.Join(errors.New("x"), re)
	if !IsRestoreFailed(wrapped) || IsLockHeld(wrapped) || IsMissingBinary(wrapped) || IsCommandFailed(wrapped) {
		t.Errorf("predicates on a RestoreError are wrong")
	}
	le := &LockError{Err: &CommandError{Args: []string{"iptables-legacy"}, ExitCode: 4, Err: errors.New("exit status 4")}}
	if !IsLockHeld(le) || !IsCommandFailed(le) {
		t.Errorf("predicates on a LockError are wrong")
	}
	if !IsMissingBinary(&MissingBinaryError{Name: "iptables-nft-restore", Err: errors.New("not found")}) {
		t.Errorf("IsMissingBinary false")
	}
	for stderr, want := range map[string]int{
		"iptables-restore: line 6 failed\n":                      6,
		"Bad argument\nError occurred at line: 3\nTry `iptables": 3,
		"iptables-nft-restore: line 12 failed: No chain":         12,
		"something else": 0,
	} {
		if got := reportedLine(stderr); got != want {
			t.Errorf("reportedLine(%q) = %d, want %d", stderr, got, want)
		}
	}
}
