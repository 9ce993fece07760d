package iptables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
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
	sizes := []int{1000, 5000, 10000}
	if s := os.Getenv("PP_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				b.Fatalf("PP_BENCH_SIZES: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	reps := 3
	if s := os.Getenv("PP_BENCH_REPS"); s != "" {
		var err error
		if reps, err = strconv.Atoi(s); err != nil || reps < 1 {
			b.Fatalf("PP_BENCH_REPS: %q", s)
		}
	}
	var rows []benchRow
	for _, backend := range []Backend{BackendNFT, BackendLegacy} {
		if _, err := exec.LookPath(binaryNames(IPv4, backend).restore); err != nil {
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
	backend                 Backend
	services, bytes         int
	render, jumps           time.Duration
	fullInitial, fullSteady time.Duration
	floor                   time.Duration
	partialEP, partialSvc   time.Duration
	partialBytes            int
}

func (r benchRow) ratio() float64 { return r.fullSteady.Seconds() / r.floor.Seconds() }

func benchOne(b *testing.B, backend Backend, n, reps int) benchRow {
	b.Helper()
	tp := nstest.New(b, nstest.Options{Pods: 1})
	cfg := DefaultConfig(IPv4)
	cfg.Backend = backend
	cfg.LocalMode = LocalClusterCIDR
	cfg.ClusterCIDRs = []string{"10.0.0.0/8"}
	cfg.CommandPrefix = []string{"ip", "netns", "exec", tp.NodeNS()}
	d, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	node := &pb.NodeInfo{Name: "bench", Hash: 1}
	services := scaleServices(n, 3)
	tbl := newTable(b, node, services...)
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
	p := newParams(&d.cfg, tbl.Node)
	p.backend = backend
	var full, floor, rend []time.Duration
	for range reps {
		var rs *ruleset
		rend = append(rend, timed(func() error {
			rs = render(&renderInput{table: tbl, params: p, full: true, prev: d.state, refreshJumps: true})
			return nil
		}))
		row.bytes = len(rs.data)
		full = append(full, timed(func() error { return d.Sync(ctx, tbl, nil, true) }))
		floor = append(floor, timed(func() error { return d.r.Restore(ctx, rs.data, "--noflush") }))
	}
	row.fullSteady, row.floor, row.render = median(full), median(floor), median(rend)
	row.jumps = timed(func() error { return ensureJumps(ctx, d.r) })

	// Partial: one Service's endpoints change back and forth.
	var partial []time.Duration
	cur := tbl
	for i := range max(reps, 5) {
		s := proto.CloneOf(services[n/2])
		s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", addrAt("10.64.0.0", 1+i%2)+":8080", addrAt("10.64.0.0", 3)+":8080")}
		next := replaceService(b, cur, s)
		partial = append(partial, timed(func() error { return d.Sync(ctx, next, []string{"ns/" + s.Name}, false) }))
		cur = next
		row.partialBytes = d.Stats().LastRestoreBytes
	}
	row.partialEP = median(partial)

	// Partial: add then remove one Service.
	partial = partial[:0]
	extra := scaleServices(n+1, 3)[n]
	for i := range max(reps, 4) {
		var next *proxytable.Table
		if i%2 == 0 {
			next = replaceService(b, cur, extra)
		} else {
			next = removeService(b, cur, "ns/"+extra.Name)
		}
		partial = append(partial, timed(func() error { return d.Sync(ctx, next, []string{"ns/" + extra.Name}, false) }))
		cur = next
	}
	row.partialSvc = median(partial)
	if st := d.Stats(); st.PartialSyncs == 0 || st.RestoreFailures != 0 {
		b.Fatalf("unexpected stats %+v", st)
	}
	return row
}

func replaceService(tb testing.TB, t *proxytable.Table, s *pb.Service) *proxytable.Table {
	tb.Helper()
	entries := make([]*pb.ServiceEntry, 0, len(t.Entries)+1)
	for k, e := range t.Entries {
		if k != s.Namespace+"/"+s.Name {
			entries = append(entries, e)
		}
	}
	entries = append(entries, entry(s))
	out, err := proxytable.FromEntries(version(t.Node, entries), t.Node, entries)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func removeService(tb testing.TB, t *proxytable.Table, key string) *proxytable.Table {
	tb.Helper()
	entries := make([]*pb.ServiceEntry, 0, len(t.Entries))
	for k, e := range t.Entries {
		if k != key {
			entries = append(entries, e)
		}
	}
	out, err := proxytable.FromEntries(version(t.Node, entries), t.Node, entries)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func printBenchTable(w *os.File, rows []benchRow) {
	if len(rows) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "backend\tservices\tinput\trender\tjumps\tfull(initial)\tfull(steady)\tfloor\tratio\tpartial(ep)\tpartial(svc)\t")
	for _, r := range rows {
		_, _ = fmt.Fprintf(tw, "%s\t%d\t%.1fMB\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t\n", r.backend, r.services, float64(r.bytes)/1e6,
			ms(r.render), ms(r.jumps), ms(r.fullInitial), ms(r.fullSteady), ms(r.floor), r.ratio(), ms(r.partialEP), ms(r.partialSvc))
	}
	_ = tw.Flush()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond)) }

// BenchmarkRender measures a full render of 10k Services x 3 endpoints,
// the part of a full sync that is ours (pure, no kernel needed).
func BenchmarkRender(b *testing.B) {
	tbl := newTable(b, &pb.NodeInfo{Name: "bench", Hash: 1}, scaleServices(10000, 3)...)
	cfg := testConfig(IPv4)
	p := newParams(&cfg, tbl.Node)
	p.backend = BackendNFT
	b.ReportAllocs()
	for b.Loop() {
		render(&renderInput{table: tbl, params: p, full: true})
	}
}
