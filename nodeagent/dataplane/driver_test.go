package dataplane_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// fakeBackend records the calls a Driver makes.
type fakeBackend struct {
	calls       []string
	fingerprint string
	fail        map[string]error // by call name
	drift       *bool            // nil: not a DriftChecker answer
	driftErr    error
}

func (f *fakeBackend) call(name string) error {
	f.calls = append(f.calls, name)
	return f.fail[name]
}

func (f *fakeBackend) Prepare(_ context.Context, t *proxytable.Table) (string, error) {
	if t == nil {
		return "", errors.New("nil table reached the backend")
	}
	return f.fingerprint, f.call("prepare")
}

func (f *fakeBackend) Full(context.Context, *proxytable.Table) error { return f.call("full") }

func (f *fakeBackend) Partial(_ context.Context, _ *proxytable.Table, changed []string) error {
	return f.call("partial " + strings.Join(changed, ","))
}

func (f *fakeBackend) Forget() { f.calls = append(f.calls, "forget") }

// driftingBackend is a fakeBackend that is also a DriftChecker.
type driftingBackend struct{ *fakeBackend }

func (d driftingBackend) Drifted(context.Context) (bool, error) {
	d.calls = append(d.calls, "drifted?")
	return *d.drift, d.driftErr
}

// countingBackend is a fakeBackend that is also a RuleCounter.
type countingBackend struct {
	*fakeBackend
	rules []dataplane.TableRules
}

func (c countingBackend) RuleCounts() []dataplane.TableRules { return c.rules }

// recorder is an Observer keeping every result.
type recorder []dataplane.SyncResult

func (r *recorder) observe(res dataplane.SyncResult) { *r = append(*r, res) }

func TestDriverFullOrPartial(t *testing.T) {
	ctx := context.Background()
	b := &fakeBackend{fingerprint: "a", fail: map[string]error{}}
	var rec recorder
	d := dataplane.NewDriver(b, "fake", dataplane.IPv4, rec.observe)

	steps := []struct {
		name        string
		full        bool
		changed     []string
		fingerprint string
		fail        string
		wantCalls   []string
		wantFull    bool
		wantErr     bool
	}{
		{"first sync is full though partial was asked", false, []string{"ns/a"}, "a", "", []string{"prepare", "full"}, true, false},
		{"partial after success", false, []string{"ns/a"}, "a", "", []string{"prepare", "partial ns/a"}, false, false},
		{"fingerprint change makes it full", false, []string{"ns/b"}, "b", "", []string{"prepare", "full"}, true, false},
		{"failed partial forgets", false, []string{"ns/c"}, "b", "partial ns/c", []string{"prepare", "partial ns/c", "forget"}, false, true},
		{"after a failure the next sync is full", false, []string{"ns/d"}, "b", "", []string{"prepare", "full"}, true, false},
		{"failed prepare forgets and does not program", false, nil, "b", "prepare", []string{"prepare", "forget"}, false, true},
		{"full when asked", true, nil, "b", "", []string{"prepare", "full"}, true, false},
	}
	for _, s := range steps {
		b.calls, b.fingerprint = nil, s.fingerprint
		clear(b.fail)
		if s.fail != "" {
			b.fail[s.fail] = errors.New("kernel said no")
		}
		err := d.Sync(ctx, nil, s.changed, s.full)
		if (err != nil) != s.wantErr {
			t.Fatalf("%s: Sync = %v, want error %v", s.name, err, s.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "syncing IPv4 fake rules: ") {
			t.Errorf("%s: error %q does not name the family and mode", s.name, err)
		}
		if !slices.Equal(b.calls, s.wantCalls) {
			t.Errorf("%s: calls %q, want %q", s.name, b.calls, s.wantCalls)
		}
		last := rec[len(rec)-1]
		if last.Full != s.wantFull || (last.Err != nil) != s.wantErr || last.Mode != "fake" || last.Family != dataplane.IPv4 {
			t.Errorf("%s: observed %+v, want full %v, error %v", s.name, last, s.wantFull, s.wantErr)
		}
	}
	if len(rec) != len(steps) {
		t.Errorf("observed %d syncs, want %d", len(rec), len(steps))
	}
}

func TestDriverRuleCounts(t *testing.T) {
	ctx := context.Background()
	rules := []dataplane.TableRules{{Table: "nat", Total: 9, Written: 2}}
	b := countingBackend{&fakeBackend{fail: map[string]error{"partial ": errors.New("restore failed")}}, rules}
	var rec recorder
	d := dataplane.NewDriver(b, "fake", dataplane.IPv4, rec.observe)
	_ = d.Sync(ctx, nil, nil, true)
	// A failed sync reports what the backend counted too.
	_ = d.Sync(ctx, nil, nil, false)
	if len(rec) != 2 || !slices.Equal(rec[0].Rules, rules) || !slices.Equal(rec[1].Rules, rules) || rec[1].Err == nil {
		t.Errorf("observed %+v, want two syncs, the second failed, both with rules %v", rec, rules)
	}

	// A backend that does not count reports nothing.
	rec = nil
	d = dataplane.NewDriver(&fakeBackend{}, "fake", dataplane.IPv4, rec.observe)
	_ = d.Sync(ctx, nil, nil, true)
	if len(rec) != 1 || rec[0].Rules != nil {
		t.Errorf("observed %+v, want one sync without rules", rec)
	}
}

func TestDriverCanceledContext(t *testing.T) {
	b := &fakeBackend{}
	d := dataplane.NewDriver(b, "fake", dataplane.IPv6, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Sync(ctx, proxytable.Empty(), nil, true); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync = %v, want context.Canceled", err)
	}
	if !slices.Equal(b.calls, []string{"forget"}) {
		t.Errorf("calls %q: a canceled sync must not reach the kernel", b.calls)
	}
}

func TestDriverDrift(t *testing.T) {
	ctx := context.Background()
	drift := false
	b := driftingBackend{&fakeBackend{fingerprint: "a", drift: &drift}}
	var rec recorder
	d := dataplane.NewDriver(b, "fake", dataplane.IPv4, rec.observe)

	steps := []struct {
		name      string
		full      bool
		drift     bool
		driftErr  error
		wantCalls []string
		// wantDrifted: a repair is reported.
		wantDrifted bool
	}{
		{"first sync: nothing to check yet", true, true, nil, []string{"prepare", "full"}, false},
		{"partial: no check", false, true, nil, []string{"prepare", "partial "}, false},
		{"full, no drift", true, false, nil, []string{"prepare", "drifted?", "full"}, false},
		{"full, drift: the backend forgets first", true, true, nil, []string{"prepare", "drifted?", "forget", "full"}, true},
		{"full, check failed: re-read, but no repair to report", true, false, errors.New("no answer"), []string{"prepare", "drifted?", "forget", "full"}, false},
	}
	for _, s := range steps {
		b.calls, drift, b.driftErr = nil, s.drift, s.driftErr
		if err := d.Sync(ctx, nil, nil, s.full); err != nil {
			t.Fatalf("%s: Sync = %v", s.name, err)
		}
		if !slices.Equal(b.calls, s.wantCalls) {
			t.Errorf("%s: calls %q, want %q", s.name, b.calls, s.wantCalls)
		}
		if got := rec[len(rec)-1].Drifted; got != s.wantDrifted {
			t.Errorf("%s: observed Drifted %v, want %v", s.name, got, s.wantDrifted)
		}
		if s.driftErr != nil && !strings.Contains(rec[len(rec)-1].DriftDetail, s.driftErr.Error()) {
			t.Errorf("%s: detail %q does not say why the check failed", s.name, rec[len(rec)-1].DriftDetail)
		}
	}
}

func TestJoin(t *testing.T) {
	ctx := context.Background()
	a := &fakeBackend{fingerprint: "a"}
	b := &fakeBackend{fingerprint: "b", fail: map[string]error{"full": errors.New("no")}}
	c := &fakeBackend{fingerprint: "c"}
	j := dataplane.Join(
		dataplane.NewDriver(a, "fake", dataplane.IPv4, nil),
		dataplane.NewDriver(b, "fake", dataplane.IPv6, nil),
		dataplane.NewDriver(c, "fake", dataplane.IPv6, nil),
	)
	if err := j.Sync(ctx, nil, nil, true); err == nil || !strings.Contains(err.Error(), "IPv6") {
		t.Fatalf("Sync = %v, want the IPv6 failure", err)
	}
	if len(a.calls) == 0 || len(c.calls) != 0 {
		t.Errorf("calls %q, %q: want the first programmed and the one after the failure untouched", a.calls, c.calls)
	}
}
