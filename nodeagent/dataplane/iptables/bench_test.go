package iptables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"text/tabwriter"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// BenchmarkSync measures syncs on the real kernel, in a throwaway network
// namespace, for N Services x 3 endpoints (N from PP_BENCH_SIZES, default
// 1000,5000,10000) on every installed backend, and prints a table:
//
//   - render: rendering the full input (pure Go, included in full);
//   - jumps: ensuring the jumps one by one, as the first sync does (later
//     full syncs re-assert them inside the restore instead);
//   - full(initial): the first full sync into an empty namespace;
//   - full(steady): a full sync over the same rules already in force;
//   - floor: iptables-restore --noflush of the very bytes the steady full
//     sync wrote, run the same way (same prefix), over the same state;
//   - ratio: full(steady) / floor, the cost of everything we add (render,
//     bookkeeping, jump checks);
//   - partial(ep): a partial sync after one Service's endpoint changed;
//   - partial(svc): a partial sync adding or removing one Service (this
//     also rewrites the dispatch chains).
//
// Timings are medians of PP_BENCH_REPS runs (default 3). Run it alone:
//
//	go test -run '^$' -bench BenchmarkSync -benchtime 1x -timeout 30m ./nodeagent/dataplane/iptables/
func BenchmarkSync(b *testing.B) {
	nstest.RequireRoot(b)
	sizes := dptest.EnvInts(b, "PP_BENCH_SIZES", []int{1000, 5000, 10000})
	reps := dptest.EnvInts(b, "PP_BENCH_REPS", []int{3})[0]
	var rows []benchRow
	for _, backend := range []xtables.Backend{xtables.BackendNFT, xtables.BackendLegacy} {
		if _, err := exec.LookPath(xtables.BinariesOf(dataplane.IPv4, backend).Restore); err != nil {
			b.Logf("%s not installed: skipped", backend)
			continue
		}
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/%d", backend, n), func(b *testing.B) {
				row := benchOne(b, backend, n, reps)
				rows = append(rows, row)
				b.ReportMetric(row.fullSteady.Seconds(), "full-s")
				b.ReportMetric(row.floor.Seconds(), "floor-s")
				b.ReportMetric(row.ratio(), "ratio")
				b.ReportMetric(float64(row.partialEP.Milliseconds()), "partial-ep-ms")
			})
		}
	}
	printBenchTable(os.Stdout, rows)
}

type benchRow struct {
	backend                 xtables.Backend
	services, bytes         int
	render, jumps           time.Duration
	fullInitial, fullSteady time.Duration
	floor                   time.Duration
	partialEP, partialSvc   time.Duration
}

func (r benchRow) ratio() float64 { return r.fullSteady.Seconds() / r.floor.Seconds() }

func benchOne(b *testing.B, backend xtables.Backend, n, reps int) benchRow {
	b.Helper()
	tp := nstest.New(b, nstest.Options{Pods: 1})
	cfg := DefaultConfig(dataplane.IPv4)
	cfg.Backend = backend
	cfg.LocalMode = dataplane.LocalClusterCIDR
	cfg.ClusterCIDRs = []string{"10.0.0.0/8"}
	cfg.CommandPrefix = []string{"ip", "netns", "exec", tp.NodeNS()}
	partials, failures := 0, 0
	d, err := New(cfg, func(r dataplane.SyncResult) {
		switch {
		case r.Err != nil:
			failures++
		case !r.Full:
			partials++
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	node := &pb.NodeInfo{Name: "bench", Hash: 1}
	services := dptest.ScaleServices(n, 3)
	tbl := dptest.Table(b, node, services...)
	row := benchRow{backend: backend, services: n}

	timed := func(f func() error) time.Duration {
		b.Helper()
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	row.fullInitial = timed(func() error { return d.Sync(ctx, tbl, nil, true) })

	// Steady full syncs and the floor, interleaved so that drift in the
	// machine's load hits both alike.
	p := newParams(&d.b.cfg, tbl.Node)
	p.backend = backend
	var full, floor, rend []time.Duration
	for range reps {
		var rs rendered
		rend = append(rend, timed(func() error {
			rs = render(&renderInput{table: tbl, params: p, full: true, prev: d.b.state, refreshJumps: true})
			return nil
		}))
		row.bytes = len(rs.data)
		full = append(full, timed(func() error { return d.Sync(ctx, tbl, nil, true) }))
		floor = append(floor, timed(func() error { return d.b.r.Restore(ctx, rs.data, "--noflush") }))
	}
	row.fullSteady, row.floor, row.render = dptest.Median(full), dptest.Median(floor), dptest.Median(rend)
	row.jumps = timed(func() error { return xtables.EnsureJumps(ctx, d.b.r, jumps) })

	// Partial: one Service's endpoints change back and forth.
	var partial []time.Duration
	cur := tbl
	for i := range max(reps, 5) {
		s := dptest.EndpointChange(services[n/2], i)
		next := dptest.Replace(b, cur, s)
		partial = append(partial, timed(func() error { return d.Sync(ctx, next, []string{"ns/" + s.Name}, false) }))
		cur = next
	}
	row.partialEP = dptest.Median(partial)

	// Partial: add then remove one Service.
	partial = partial[:0]
	extra := dptest.ScaleServices(n+1, 3)[n]
	for i := range max(reps, 4) {
		next := dptest.Toggle(b, cur, extra, i)
		partial = append(partial, timed(func() error { return d.Sync(ctx, next, []string{"ns/" + extra.Name}, false) }))
		cur = next
	}
	row.partialSvc = dptest.Median(partial)
	if partials == 0 || failures != 0 {
		b.Fatalf("%d partial syncs and %d failures, want partial syncs and no failure", partials, failures)
	}
	return row
}

func printBenchTable(w *os.File, rows []benchRow) {
	if len(rows) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "backend\tservices\tinput\trender\tjumps\tfull(initial)\tfull(steady)\tfloor\tratio\tpartial(ep)\tpartial(svc)\t")
	for _, r := range rows {
		_, _ = fmt.Fprintf(tw, "%s\t%d\t%.1fMB\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t\n", r.backend, r.services, float64(r.bytes)/1e6,
			dptest.Millis(r.render), dptest.Millis(r.jumps), dptest.Millis(r.fullInitial), dptest.Millis(r.fullSteady), dptest.Millis(r.floor), r.ratio(), dptest.Millis(r.partialEP), dptest.Millis(r.partialSvc))
	}
	_ = tw.Flush()
}

// BenchmarkRender measures a full render of 10k Services x 3 endpoints,
// the part of a full sync that is ours (pure, no kernel needed).
func BenchmarkRender(b *testing.B) {
	tbl := dptest.Table(b, &pb.NodeInfo{Name: "bench", Hash: 1}, dptest.ScaleServices(10000, 3)...)
	cfg := testConfig(dataplane.IPv4)
	p := newParams(&cfg, tbl.Node)
	p.backend = xtables.BackendNFT
	b.ReportAllocs()
	for b.Loop() {
		render(&renderInput{table: tbl, params: p, full: true})
	}
}
