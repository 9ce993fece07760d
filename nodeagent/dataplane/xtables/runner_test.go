package xtables

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
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

// scriptRunner returns an execRunner whose restore tool is sh running
// script (given as the flags "-c", script), for the streaming tests.
func scriptRunner(t *testing.T) *execRunner {
	t.Helper()
	sh, err := tool.New(nil, "sh")
	if err != nil {
		t.Skipf("no sh: %v", err)
	}
	return &execRunner{restore: sh, backend: BackendNFT}
}

// srcFunc is an io.WriterTo of a function.
type srcFunc func(io.Writer) error

func (f srcFunc) WriteTo(w io.Writer) (int64, error) { return 0, f(w) }

// TestRestoreFromStreams checks the streaming restore against a stand-in
// tool: the input arrives whole; a tool that fails early reads no more
// and its error names the line; and a writer that fails half way kills
// the tool before it sees the end of its input, so that nothing of a
// half-written input commits.
func TestRestoreFromStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	r := scriptRunner(t)
	big := strings.Repeat("-A PP-X -j ACCEPT\n", 100000) // beyond any pipe buffer
	out, eof := filepath.Join(dir, "in"), filepath.Join(dir, "eof")

	whole := srcFunc(func(w io.Writer) error { _, err := io.WriteString(w, big); return err })
	if err := r.RestoreFrom(ctx, whole, "-c", "cat > "+out); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); string(got) != big {
		t.Errorf("the tool read %d bytes, want %d", len(got), len(big))
	}

	err := r.RestoreFrom(ctx, whole, "-c", "head -c 100 >/dev/null; echo 'line 2 failed' >&2; exit 2")
	var re *RestoreError
	if !errors.As(err, &re) || re.Line != 2 {
		t.Errorf("RestoreFrom with a failing tool = %v, want a RestoreError at line 2", err)
	}

	broken := errors.New("render failed")
	half := srcFunc(func(w io.Writer) error {
		if _, err := io.WriteString(w, big); err != nil {
			return err
		}
		return broken
	})
	err = r.RestoreFrom(ctx, half, "-c", "cat > "+out+" && touch "+eof)
	if !errors.Is(err, broken) {
		t.Errorf("RestoreFrom with a failing writer = %v, want its error", err)
	}
	if _, err := os.Stat(eof); err == nil {
		t.Errorf("the tool saw the end of a half-written input")
	}
}

// TestRestoreFromFallsBack checks that a Runner without streaming gets
// the input whole, and none when the writer fails.
func TestRestoreFromFallsBack(t *testing.T) {
	f := &fakeRunner{}
	src := srcFunc(func(w io.Writer) error { _, err := io.WriteString(w, "*nat\nCOMMIT\n"); return err })
	if err := RestoreFrom(context.Background(), f, src); err != nil || f.restores != 1 {
		t.Errorf("RestoreFrom = %v with %d restores, want one", err, f.restores)
	}
	broken := errors.New("render failed")
	if err := RestoreFrom(context.Background(), f, srcFunc(func(io.Writer) error { return broken })); !errors.Is(err, broken) || f.restores != 1 {
		t.Errorf("RestoreFrom with a failing writer = %v after %d restores, want its error and none more", err, f.restores)
	}
}
