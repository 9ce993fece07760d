package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// TestLeftovers checks what an agent removes once its mode is in force:
// every other mode on every backend, its own mode on the other backend,
// and never its own mode on its own backend.
func TestLeftovers(t *testing.T) {
	for _, tt := range []struct {
		mode    string
		backend xtables.Backend
		want    []string
	}{
		{"nftables", "", []string{"iptables (legacy iptables)", "iptables (nft iptables)", "ipvs (auto iptables)"}},
		{"iptables", xtables.BackendNFT, []string{"iptables (legacy iptables)", "ipvs (auto iptables)", "nftables"}},
		{"iptables", xtables.BackendLegacy, []string{"iptables (nft iptables)", "ipvs (auto iptables)", "nftables"}},
		{"ipvs", xtables.BackendNFT, []string{"iptables (legacy iptables)", "iptables (nft iptables)", "ipvs (legacy iptables) rules", "nftables"}},
		{"ipvs", xtables.BackendLegacy, []string{"iptables (legacy iptables)", "iptables (nft iptables)", "ipvs (nft iptables) rules", "nftables"}},
		{"", "", []string{"iptables (legacy iptables)", "iptables (nft iptables)", "ipvs (auto iptables)", "nftables"}},
	} {
		t.Run(fmt.Sprintf("%s-%s", tt.mode, tt.backend), func(t *testing.T) {
			var got []string
			for _, l := range leftovers(tt.mode, tt.backend) {
				got = append(got, l.String())
				if l.mode == tt.mode && (l.mode == "nftables" || l.backend == tt.backend || l.backend == xtables.BackendAuto) {
					t.Errorf("%v would remove the running mode's own rules", l)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("leftovers = %q, want %q", got, tt.want)
			}
		})
	}
}

// fakeLeftover is a dataplane of another mode: what it found, and its
// cleanups.
type fakeLeftover struct {
	found    []string
	cleanErr error
	cleaned  *[]string
	name     string
	listErr  error
}

func (f *fakeLeftover) Sync(context.Context, *proxytable.Table, []string, bool) error { return nil }

func (f *fakeLeftover) Leftovers(context.Context) ([]string, error) { return f.found, f.listErr }

func (f *fakeLeftover) Cleanup(context.Context) error {
	if f.cleanErr == nil {
		*f.cleaned = append(*f.cleaned, f.name)
		f.found = nil
	}
	return f.cleanErr
}

// fakeIPVSLeftover is an IPVS dataplane: it lists with rulesOnly and
// can remove its rules alone.
type fakeIPVSLeftover struct{ *fakeLeftover }

func (f *fakeIPVSLeftover) Leftovers(_ context.Context, rulesOnly bool) ([]string, error) {
	return f.found, nil
}

func (f *fakeIPVSLeftover) CleanupRules(context.Context) error {
	*f.cleaned = append(*f.cleaned, f.name)
	f.found = nil
	return nil
}

// running is the running mode's dataplane, with its backend.
type running struct {
	fakeLeftover
	backend xtables.Backend
}

func (r *running) IPTablesBackend() xtables.Backend { return r.backend }

// TestSweeper checks the sweep's order and retries: nothing is removed
// until the running mode synced and knows its backend; what another mode
// left is removed once, after a successful sync; a failure is retried
// after the next sync; a mode that cannot run here is skipped.
func TestSweeper(t *testing.T) {
	var cleaned []string
	failing := errors.New("kernel says no")
	others := map[string]*fakeLeftover{
		"nftables":                     {found: []string{"table ip proxyplane"}},
		"iptables (legacy iptables)":   {found: []string{"legacy nat/PP-SERVICES"}, cleanErr: failing},
		"ipvs (legacy iptables) rules": {found: []string{"legacy nat/PP-IPVS-SERVICES"}},
	}
	var opened []string
	open := func(l leftover, f dataplane.Family) (dataplane.Dataplane, error) {
		opened = append(opened, l.String())
		o := others[l.String()]
		switch {
		case o == nil:
			return nil, errors.New("cannot run here")
		case l.mode == "ipvs":
			o.name, o.cleaned = l.String(), &cleaned
			return &fakeIPVSLeftover{o}, nil
		}
		o.name, o.cleaned = l.String(), &cleaned
		return o, nil
	}
	run := &running{} // IPVS mode, backend not detected yet
	s := &sweeper{
		mode: "ipvs", families: []dataplane.Family{dataplane.IPv4}, running: []dataplane.Dataplane{run},
		open: open, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}

	s.afterSync(context.Background(), nil)
	if len(opened) != 0 || s.done {
		t.Fatalf("swept %q (done %v) before the running dataplane knew its backend", opened, s.done)
	}

	run.backend = xtables.BackendNFT
	s.afterSync(context.Background(), nil)
	if want := []string{"ipvs (legacy iptables) rules", "nftables"}; !slices.Equal(sorted(cleaned), want) || s.done {
		t.Fatalf("first sweep removed %q (done %v), want %q and a retry for the failed one", cleaned, s.done, want)
	}
	if slices.Contains(opened, "ipvs (nft iptables) rules") {
		t.Errorf("opened the running mode's own backend: %q", opened)
	}

	others["iptables (legacy iptables)"].cleanErr = nil
	cleaned, opened = nil, nil
	s.afterSync(context.Background(), nil)
	if !s.done || !slices.Equal(cleaned, []string{"iptables (legacy iptables)"}) {
		t.Fatalf("second sweep removed %q (done %v), want the legacy iptables mode's rules, then done", cleaned, s.done)
	}

	opened = nil
	s.afterSync(context.Background(), nil)
	if len(opened) != 0 {
		t.Errorf("swept again (%q) after a complete sweep", opened)
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

func TestHasLegacyTable(t *testing.T) {
	for names, want := range map[string]bool{
		"":                    false,
		"mangle\nraw\n":       false,
		"nat\n":               true,
		"mangle\nfilter\n":    true,
		"security\nnatural\n": false,
	} {
		if got := hasLegacyTable(names); got != want {
			t.Errorf("hasLegacyTable(%q) = %v, want %v", names, got, want)
		}
	}
}
