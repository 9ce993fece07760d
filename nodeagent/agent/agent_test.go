package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// recorder is a fake dataplane and store that logs calls in order.
type recorder struct {
	mu       sync.Mutex
	calls    []string
	syncErr  error
	saveErr  error
	synced   chan string // receives the version of each successful sync
	lastSave *proxytable.Table
}

func newRecorder() *recorder { return &recorder{synced: make(chan string, 16)} }

func (r *recorder) Sync(_ context.Context, t *proxytable.Table, changed []string, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("sync %s full=%v changed=%v", t.Version, full, changed))
	if r.syncErr != nil {
		return r.syncErr
	}
	r.synced <- t.Version
	return nil
}

func (r *recorder) Save(t *proxytable.Table, changed []string, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf("save %s full=%v changed=%v", t.Version, full, changed))
	if r.saveErr != nil {
		return r.saveErr
	}
	r.lastSave = t
	return nil
}

func (r *recorder) failSyncs(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.syncErr = err
}

func (r *recorder) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func entry(name string, hash uint64, port int32) *pb.ServiceEntry {
	return &pb.ServiceEntry{Key: "default/" + name, Hash: hash, Service: &pb.Service{
		Namespace: "default", Name: name, ClusterIps: []string{"10.96.0.10"},
		Ports: []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: port}},
	}}
}

func version(node *pb.NodeInfo, entries ...*pb.ServiceEntry) string {
	sum := node.GetHash()
	for _, e := range entries {
		sum += e.GetHash()
	}
	return fmt.Sprintf("%016x", sum)
}

var node = &pb.NodeInfo{Name: "node-1", Hash: 100}

func snapshot(entries ...*pb.ServiceEntry) *pb.SyncResponse {
	return &pb.SyncResponse{Nonce: "1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: version(node, entries...), Node: node, Entries: entries,
	}}}
}

func run(t *testing.T, a *Agent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func newAgent(r *recorder, cached *proxytable.Table) *Agent {
	return New(Config{SyncPeriod: time.Hour, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond, Families: []dataplane.Family{dataplane.IPv4}}, r, r, cached, slog.New(slog.DiscardHandler))
}

func TestCachedTableIsProgrammedFirst(t *testing.T) {
	r := newRecorder()
	a1 := entry("a", 1, 80)
	cached, err := proxytable.FromSnapshot(snapshot(a1).GetSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(r, cached)
	run(t, a)
	select {
	case v := <-r.synced:
		if v != cached.Version {
			t.Fatalf("first sync programmed %s, want the cached %s", v, cached.Version)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cached table was never programmed")
	}
	select {
	case <-a.Started():
	case <-time.After(5 * time.Second):
		t.Fatal("Started never closed")
	}
	if got := r.log(); len(got) != 1 || got[0] != fmt.Sprintf("sync %s full=true changed=[]", cached.Version) {
		t.Errorf("calls = %v, want one full sync of the cache", got)
	}
	// The cached table is in force: the metric must say so, although the
	// agent held it from the start.
	if got := testutil.ToFloat64(metrics.AppliedVersion.WithLabelValues(cached.Version)); got != 1 {
		t.Errorf("applied_version_info{version=%q} = %v, want 1", cached.Version, got)
	}
}

func TestApplyPersistsThenPrograms(t *testing.T) {
	r := newRecorder()
	a := newAgent(r, nil)
	run(t, a)
	first := snapshot(entry("a", 1, 80), entry("b", 2, 80))
	metrics.SyncProxyRulesLastQueuedTimestamp.WithLabelValues("IPv4").Set(0)
	if _, err := a.Apply(context.Background(), first, false); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(metrics.SyncProxyRulesLastQueuedTimestamp.WithLabelValues("IPv4")); got == 0 {
		t.Error("sync_proxy_rules_last_queued_timestamp_seconds not set by a queued table")
	}
	v1 := first.GetSnapshot().GetVersion()
	b2 := entry("b", 5, 81)
	v2 := version(node, entry("a", 1, 80), b2)
	got, err := a.Apply(context.Background(), &pb.SyncResponse{Nonce: "2", Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{
		BaseVersion: v1, Version: v2, Upserts: []*pb.ServiceEntry{b2},
	}}}, false)
	if err != nil || got != v2 {
		t.Fatalf("delta applied as %s, %v; want %s", got, err, v2)
	}
	want := []string{
		"save " + v1 + " full=true changed=[]", "sync " + v1 + " full=true changed=[]",
		"save " + v2 + " full=false changed=[default/b]", "sync " + v2 + " full=false changed=[default/b]",
	}
	if calls := r.log(); !slices.Equal(calls, want) {
		t.Errorf("calls:\n%v\nwant:\n%v", calls, want)
	}
	if a.Held().Version != v2 {
		t.Errorf("held %s, want %s", a.Held().Version, v2)
	}
}

func TestRejectedTablesChangeNothing(t *testing.T) {
	good := snapshot(entry("a", 1, 80))
	cases := []struct {
		name      string
		resp      *pb.SyncResponse
		syncErr   error
		saveErr   error
		wantCalls int // after the good snapshot's two
		entryErr  string
	}{
		{"bad version", &pb.SyncResponse{Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: "0000000000000001", Node: node}}}, nil, nil, 0, ""},
		{"bad entry", snapshot(entry("x", 7, 0)), nil, nil, 0, "default/x"},
		{"delta on another base", &pb.SyncResponse{Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{BaseVersion: "ffffffffffffffff"}}}, nil, nil, 0, ""},
		// Persisted, failed to program, cache restored: three calls.
		{"kernel refuses", snapshot(entry("c", 3, 80)), errors.New("iptables-restore: line 3 failed"), nil, 3, ""},
		// A full disk or a read-only state directory: nothing programmed.
		{"cache cannot be written", snapshot(entry("c", 3, 80)), nil, syscall.ENOSPC, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			a := newAgent(r, nil)
			run(t, a)
			if _, err := a.Apply(context.Background(), good, false); err != nil {
				t.Fatal(err)
			}
			r.failSyncs(tc.syncErr)
			r.mu.Lock()
			r.saveErr = tc.saveErr
			r.mu.Unlock()
			_, err := a.Apply(context.Background(), tc.resp, false)
			if err == nil {
				t.Fatal("accepted a table it must reject")
			}
			if tc.saveErr != nil && (!errors.Is(err, tc.saveErr) || !strings.Contains(err.Error(), "persisting")) {
				t.Errorf("error %v, want it to say the table could not be persisted, and why", err)
			}
			if entries := proxytable.EntryErrors(err); tc.entryErr != "" && (len(entries) != 1 || entries[0].GetKey() != tc.entryErr) {
				t.Errorf("entry errors %v, want one for %q", entries, tc.entryErr)
			}
			if a.Held().Version != good.GetSnapshot().GetVersion() {
				t.Errorf("held %s after a rejected table, want the previous %s", a.Held().Version, good.GetSnapshot().GetVersion())
			}
			if calls := r.log(); len(calls) != 2+tc.wantCalls {
				t.Errorf("calls %v", calls)
			}
			if r.lastSave.Version != good.GetSnapshot().GetVersion() {
				t.Errorf("cache holds %s, want the previous table", r.lastSave.Version)
			}
		})
	}
}

func TestNoTableNoSync(t *testing.T) {
	r := newRecorder()
	a := New(Config{SyncPeriod: 20 * time.Millisecond, RetryMin: time.Millisecond, RetryMax: time.Millisecond}, r, r, nil, slog.New(slog.DiscardHandler))
	run(t, a)
	// Several periods pass; a table then arrives. Before it, nothing may
	// have been programmed: an empty sync would flush the kernel.
	time.Sleep(100 * time.Millisecond) //nolint:forbidigo // proving an absence needs time to pass
	resp := snapshot(entry("a", 1, 80))
	if _, err := a.Apply(context.Background(), resp, false); err != nil {
		t.Fatal(err)
	}
	if calls := r.log(); calls[0] != "save "+resp.GetSnapshot().GetVersion()+" full=true changed=[]" {
		t.Errorf("first call %q: something was programmed before any table existed", calls[0])
	}
}

func TestSyncAfterAFailureIsFull(t *testing.T) {
	r := newRecorder()
	a := newAgent(r, nil)
	run(t, a)
	a1, b1 := entry("a", 1, 80), entry("b", 2, 80)
	first := snapshot(a1, b1)
	if _, err := a.Apply(context.Background(), first, false); err != nil {
		t.Fatal(err)
	}
	v1 := first.GetSnapshot().GetVersion()
	delta := func(e *pb.ServiceEntry) *pb.SyncResponse {
		return &pb.SyncResponse{Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{BaseVersion: v1, Version: version(node, a1, e), Upserts: []*pb.ServiceEntry{e}}}}
	}
	r.failSyncs(errors.New("one family failed"))
	if _, err := a.Apply(context.Background(), delta(entry("b", 5, 81)), false); err == nil {
		t.Fatal("want the failed sync reported")
	}
	r.failSyncs(nil)
	b3 := entry("b", 6, 82)
	if _, err := a.Apply(context.Background(), delta(b3), false); err != nil {
		t.Fatal(err)
	}
	calls := r.log()
	if want := "sync " + version(node, a1, b3) + " full=true changed=[default/b]"; calls[len(calls)-1] != want {
		t.Errorf("last call %q, want %q: the kernel may hold part of the failed table", calls[len(calls)-1], want)
	}
}

// TestUnprogrammedCacheIsNotClaimed checks that a cached table the kernel
// refused is not reported as held (the hello would make the control plane
// send a delta to rules that are not there), and is once a retry
// programmed it.
func TestUnprogrammedCacheIsNotClaimed(t *testing.T) {
	r := newRecorder()
	r.failSyncs(errors.New("xtables lock held"))
	cached, err := proxytable.FromSnapshot(snapshot(entry("a", 1, 80)).GetSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(r, cached)
	run(t, a)
	select {
	case <-a.Started():
	case <-time.After(5 * time.Second):
		t.Fatal("Started never closed")
	}
	if v := a.Held().Version; v != "" {
		t.Fatalf("held %q while the cached table is not programmed, want none", v)
	}
	r.failSyncs(nil) // the retry, with backoff, succeeds
	select {
	case v := <-r.synced:
		if v != cached.Version {
			t.Fatalf("retry programmed %s, want the cached %s", v, cached.Version)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cached table was never programmed")
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.Held().Version != cached.Version {
		if time.Now().After(deadline) {
			t.Fatalf("held %q after the cached table was programmed, want %s", a.Held().Version, cached.Version)
		}
		time.Sleep(time.Millisecond)
	}
}
