package iptables

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// heapRunner is a Runner that reads the restore input as iptables-restore
// would and, every megabyte of it and at its end, collects garbage and
// records the live heap; it applies nothing.
type heapRunner struct {
	fakeRunner
	input, peak uint64
}

func (h *heapRunner) sample() {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h.peak = max(h.peak, ms.HeapAlloc)
}

// EnsureRule succeeds: nothing is applied.
func (h *heapRunner) EnsureRule(context.Context, string, string, ...string) error { return nil }

// Restore is how a Runner gets the input whole.
func (h *heapRunner) Restore(_ context.Context, data []byte, _ ...string) error {
	h.input += uint64(len(data))
	h.sample()
	return nil
}

// RestoreFrom is how a StreamRunner gets the input as it is written.
func (h *heapRunner) RestoreFrom(_ context.Context, src io.WriterTo, _ ...string) error {
	_, err := src.WriteTo(h)
	h.sample()
	return err
}

func (h *heapRunner) Write(b []byte) (int, error) {
	if h.input>>20 != (h.input+uint64(len(b)))>>20 {
		h.sample()
	}
	h.input += uint64(len(b))
	return len(b), nil
}

// TestFullSyncMemory pins the memory a full sync holds while
// iptables-restore reads its input (7 MB at 500 Services x 50
// endpoints): the input goes to the tool as it is rendered, never whole,
// so the live heap grows by what the state keeps (chain names, dispatch
// lines), well under half the input. Holding the input whole (as the
// dataplane did before: 353-388 MiB peak RSS at 250,000 endpoints) costs
// more than the input itself.
func TestFullSyncMemory(t *testing.T) {
	tbl := dptest.Table(t, &pb.NodeInfo{Name: "mem", Hash: 1}, dptest.ScaleServices(500, 50)...)
	h := &heapRunner{fakeRunner: *newFakeRunner()}
	d := newTestDataplane(testConfig(dataplane.IPv4), h, nil)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	if err := d.Sync(context.Background(), tbl, nil, true); err != nil {
		t.Fatal(err)
	}
	runtime.KeepAlive(tbl)
	grown := int64(h.peak) - int64(before)
	t.Logf("input %.1f MB, live heap grown by %.1f MB while it was read", float64(h.input)/1e6, float64(grown)/1e6)
	if h.input < 5e6 {
		t.Fatalf("input %d bytes, want a full sync of 25,000 endpoints", h.input)
	}
	if grown > int64(h.input/2) {
		t.Errorf("live heap grew by %d bytes while the restore read %d bytes of input, want at most half of it", grown, h.input)
	}
}

// TestLocateEveryLine checks that locating a line (how a failed restore
// names its rule and Service) finds the very line written, with the
// Service that wrote it.
func TestLocateEveryLine(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	tbl := dptest.Table(t, dptest.Node(), dptest.ClusterIPTwoEndpoints(), dptest.NodePortService(), dptest.NoEndpointsService())
	p := newParams(&cfg, tbl.Node)
	full := newRuleset(&renderInput{table: tbl, params: p, full: true})
	// A partial sync: one Service gone, one added, one changed.
	web := dptest.ClusterIPTwoEndpoints()
	web.ClusterEndpoints[0].Endpoints = web.ClusterEndpoints[0].Endpoints[:1]
	partialTbl := dptest.Table(t, dptest.Node(), web, dptest.NoEndpointsService(), dptest.LBSourceRanges())
	for _, in := range []*renderInput{
		{table: tbl, params: p, full: true},
		{table: tbl, params: p, full: true, refreshJumps: true},
		{table: partialTbl, params: p, prev: full.next, changed: dptest.ChangedKeys(tbl, partialTbl)},
	} {
		jumps := in.refreshJumps
		rs := render(in)
		lines := strings.Split(strings.TrimSuffix(string(rs.data), "\n"), "\n")
		owners := map[string]int{}
		for i, want := range lines {
			owner, got, ok := rs.locate(i + 1)
			if !ok || got != want {
				t.Fatalf("locate(%d) = %q, %v, want %q", i+1, got, ok, want)
			}
			if strings.Contains(want, "DNAT") && !strings.Contains(want, "--comment "+owner) {
				t.Errorf("line %d %q located to %q, want its Service", i+1, want, owner)
			}
			if (owner == ownerJumps) != (jumps && strings.Contains(want, "-j PP-") && !strings.HasPrefix(want, "-A ")) {
				t.Errorf("line %d %q located to %q", i+1, want, owner)
			}
			owners[owner]++
		}
		if in.full && (owners["ns/np"] == 0 || owners["ns/web"] == 0 || owners[""] == 0) {
			t.Errorf("owners %v, want lines of ns/np, ns/web and of no Service", owners)
		}
		if !in.full && (owners["ns/np"] == 0 || owners["ns/web"] == 0 || owners["ns/lb-fw"] == 0 || !strings.Contains(string(rs.data), "-D PP-SERVICES")) {
			t.Errorf("partial sync: owners %v, want lines of ns/np, ns/web and ns/lb-fw, and dispatch edits:\n%s", owners, rs.data)
		}
		if _, _, ok := rs.locate(len(lines) + 1); ok {
			t.Errorf("located a line past the end")
		}
	}
}

// TestWriteFailsWhenRenderingChanges checks the guard of the input's
// second rendering: a Service that renders differently when written
// than when planned (its table changed in between) fails the write, and
// the restore, rather than leaving a state that is not the kernel's.
func TestWriteFailsWhenRenderingChanges(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	tbl := dptest.Table(t, dptest.Node(), dptest.ClusterIPTwoEndpoints())
	rs := newRuleset(&renderInput{table: tbl, params: newParams(&cfg, tbl.Node), full: true})
	tbl.Entries["ns/web"].Service.ClusterEndpoints[0].Endpoints[0].Port = 9999
	var b bytes.Buffer
	if _, err := rs.WriteTo(&b); !errors.Is(err, errRenderChanged) {
		t.Fatalf("WriteTo = %v, want errRenderChanged", err)
	}
	f := newFakeRunner()
	if err := xtables.RestoreFrom(context.Background(), f, rs, "--noflush"); !errors.Is(err, errRenderChanged) || len(f.restores) != 0 {
		t.Errorf("RestoreFrom = %v after %d restores, want errRenderChanged and none", err, len(f.restores))
	}
}

// TestFullSyncSharesUnchangedState checks that a full sync over the
// table in force keeps the previous state of every Service that did not
// change rather than a copy (so it holds one state, not two, at its
// peak), and a new one for a Service that changed.
func TestFullSyncSharesUnchangedState(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	services := dptest.ScaleServices(20, 3)
	tbl := dptest.Table(t, dptest.Node(), services...)
	p := newParams(&cfg, tbl.Node)
	first := render(&renderInput{table: tbl, params: p, full: true})
	changed := dptest.EndpointChange(services[7], 0)
	next := dptest.Replace(t, tbl, changed)
	again := render(&renderInput{table: next, params: p, full: true, prev: first.next})
	if len(again.stale) == 0 {
		t.Errorf("the changed Service's old endpoint chains are not deleted")
	}
	for k, st := range again.next.services {
		if shared := st == first.next.services[k]; shared != (k != "ns/"+changed.Name) {
			t.Errorf("%s: state shared with the previous one = %v", k, shared)
		}
	}
}
