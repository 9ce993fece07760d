package xtables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

func TestNewRunnersMissingTools(t *testing.T) {
	for _, b := range []Backend{BackendNFT, BackendAuto} {
		_, err := NewRunners(Options{Family: dataplane.IPv4, Backend: b, CommandPrefix: []string{"pp-no-such-prefix"}})
		if !IsMissingBinary(err) || !strings.Contains(err.Error(), "pp-no-such-prefix") {
			t.Errorf("NewRunners(%s) behind a missing prefix = %v, want a MissingBinaryError naming it", b, err)
		}
	}
}

// ruleRecorder records EnsureRule calls and fails on a chain named
// "BROKEN".
type ruleRecorder struct {
	fakeRunner
	ensured []string
}

func (r *ruleRecorder) EnsureRule(_ context.Context, table, chain string, rule ...string) error {
	if chain == "BROKEN" {
		return errors.New("no chain")
	}
	r.ensured = append(r.ensured, table+" "+chain+" "+strings.Join(rule, " "))
	return nil
}

func TestEnsureJumps(t *testing.T) {
	r := &ruleRecorder{}
	jumps := []Jump{
		{Table: "nat", From: "PREROUTING", To: "PP-A", Comment: "a"},
		{Table: "filter", From: "INPUT", To: "PP-B", Match: []string{"-m", "conntrack", "--ctstate", "NEW"}, Comment: "b c"},
	}
	if err := EnsureJumps(context.Background(), r, jumps); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"nat PREROUTING -m comment --comment a -j PP-A",
		"filter INPUT -m conntrack --ctstate NEW -m comment --comment b c -j PP-B",
	}
	if strings.Join(r.ensured, "\n") != strings.Join(want, "\n") {
		t.Errorf("ensured:\n%s\nwant:\n%s", strings.Join(r.ensured, "\n"), strings.Join(want, "\n"))
	}
	err := EnsureJumps(context.Background(), r, []Jump{{Table: "nat", From: "BROKEN", To: "PP-A"}})
	if err == nil || err.Error() != "ensuring nat BROKEN jumps to PP-A: no chain" {
		t.Errorf("EnsureJumps error = %v", err)
	}
}
