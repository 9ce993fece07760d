package nftables

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/knftables"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// BenchmarkSync measures syncs on the real kernel, in a throwaway network
// namespace, for N Services (NodePort, so each also has an external
// chain) x 3 endpoints, N from PP_BENCH_SIZES (default 1000,5000,10000),
// and prints a table:
//
//   - build: computing the ruleset, the full transaction and its netlink
//     encoding (pure Go, included in full);
//   - full(initial): the first full sync into a namespace without the table;
//   - nft -f: the floor for it: the same ruleset as nft text
//     (rulesetText), loaded by nft -f into a namespace without the table;
//   - raw: the floor without nft's parsing: the full sync's pre-encoded
//     netlink batch sent into a namespace without the table;
//   - full(steady): a full sync over the same rules already in force
//     (every chain flushed and refilled, affinity sets kept);
//   - recreate: the alternative for it, delete and recreate the table in
//     one batch (pre-encoded), which would drop affinity state;
//   - partial(ep): a partial sync after one Service's endpoint changed;
//   - partial(svc): a partial sync adding or removing one Service;
//   - 1-elem: the floor for a partial sync: a netlink batch adding (then
//     removing) one service-ips element;
//   - knftables(ep): partial(ep)'s transaction through knftables (nft -f,
//     with its cache fetching), the library this package did not choose.
//
// Timings are medians of PP_BENCH_REPS runs (default 3). Run it alone:
//
//	go test -run '^$' -bench BenchmarkSync -benchtime 1x -timeout 60m ./nodeagent/dataplane/nftables/
func BenchmarkSync(b *testing.B) {
	requireKernel(b)
	sizes := dptest.EnvInts(b, "PP_BENCH_SIZES", []int{1000, 5000, 10000})
	reps := dptest.EnvInts(b, "PP_BENCH_REPS", []int{3})[0]
	var rows []benchRow
	for _, n := range sizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			row := benchOne(b, n, reps)
			rows = append(rows, row)
			b.ReportMetric(row.fullInitial.Seconds(), "full-s")
			b.ReportMetric(float64(row.partialEP.Milliseconds()), "partial-ep-ms")
		})
	}
	printBenchTable(os.Stdout, rows)
}

type benchRow struct {
	services, ops, bytes          int
	build                         time.Duration
	fullInitial, nftFloor, raw    time.Duration
	fullSteady, recreate          time.Duration
	partialEP, partialSvc, oneElm time.Duration
	knftEP                        time.Duration
}

func benchOne(b *testing.B, n, reps int) benchRow {
	b.Helper()
	tp := nstest.New(b, nstest.Options{Pods: 1})
	ns := tp.NodeNS()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cfg := DefaultConfig(dataplane.IPv4)
	cfg.LocalMode = dataplane.LocalClusterCIDR
	cfg.ClusterCIDRs = []string{"10.0.0.0/8"}
	cfg.NetNS = nsPath(ns)
	node := &pb.NodeInfo{Name: "bench", Hash: 1}
	services := dptest.ScaleServices(n, 3)
	tbl := dptest.Table(b, node, services...)
	row := benchRow{services: n}
	p := newParams(&cfg, node)

	timed := func(f func() error) time.Duration {
		b.Helper()
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	dropTable := func() {
		b.Helper()
		if out, err := tp.Exec(ns, "nft", "delete", "table", "ip", TableName); err != nil && !strings.Contains(string(out), "No such file") {
			b.Fatalf("deleting the table: %v", err)
		}
	}
	raw := newNetlinkKernel(dataplane.IPv4, nsPath(ns))

	var build, initial, floor, rawFull, steady, recreate []time.Duration
	var text string
	for range reps {
		var bt *batch
		build = append(build, timed(func() error {
			st := buildState(tbl, &p)
			tx := fullTransaction(st, nil, true)
			row.ops = len(opsOf(tx))
			var err error
			bt, err = encodeBatch(tx, dataplane.IPv4, 1)
			return err
		}))
		row.bytes = bt.size

		dropTable()
		d, err := New(cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		initial = append(initial, timed(func() error { return d.Sync(ctx, tbl, nil, true) }))
		steady = append(steady, timed(func() error { return d.Sync(ctx, tbl, nil, true) }))

		// Delete and recreate, in one batch, over the table in force.
		st := buildState(tbl, &p)
		rc := &transaction{}
		rc.add(op{kind: opAddTable}, op{kind: opDeleteTable})
		rc.ops = append(rc.ops, opsOf(fullTransaction(st, nil, false))...)
		recreate = append(recreate, timed(func() error { return raw.Run(ctx, rc) }))

		dropTable()
		rawFull = append(rawFull, timed(func() error { return raw.Run(ctx, fullTransaction(st, nil, false)) }))

		dropTable()
		if text == "" {
			text = rulesetText(st, dataplane.IPv4)
		}
		floor = append(floor, timeNFTScript(b, ns, text))
	}
	row.build, row.fullInitial, row.nftFloor, row.raw = dptest.Median(build), dptest.Median(initial), dptest.Median(floor), dptest.Median(rawFull)
	row.fullSteady, row.recreate = dptest.Median(steady), dptest.Median(recreate)

	// Bring the Dataplane in step with the table in force.
	rec := &dptest.Recorder{}
	d, err := New(cfg, rec.Observe)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Sync(ctx, tbl, nil, true); err != nil {
		b.Fatal(err)
	}

	// Partial: one Service's endpoints change back and forth.
	cur := tbl
	var partial []time.Duration
	for i := range max(reps, 5) {
		s := dptest.EndpointChange(services[n/2], i)
		next := dptest.Replace(b, cur, s)
		partial = append(partial, timed(func() error { return d.Sync(ctx, next, []string{"ns/" + s.Name}, false) }))
		cur = next
	}
	row.partialEP = dptest.Median(partial)
	// The same change as transactions for knftables, there and back.
	changedKey := []string{"ns/" + services[n/2].Name}
	other := dptest.Replace(b, cur, dptest.EndpointChange(services[n/2], max(reps, 5)))
	stHere, stThere := buildState(cur, &p), buildState(other, &p)
	there := partialTransaction(stHere, computeChange(stHere, other, changedKey, &p))
	back := partialTransaction(stThere, computeChange(stThere, cur, changedKey, &p))

	// Partial: add then remove one Service.
	partial = partial[:0]
	extra := dptest.ScaleServices(n+1, 3)[n]
	for i := range max(reps, 4) {
		next := dptest.Toggle(b, cur, extra, i)
		partial = append(partial, timed(func() error { return d.Sync(ctx, next, []string{"ns/" + extra.Name}, false) }))
		cur = next
	}
	row.partialSvc = dptest.Median(partial)
	if rec.Count(false, false) == 0 || rec.Count(false, true)+rec.Count(true, true) != 0 {
		b.Fatalf("unexpected syncs %+v", rec.Results)
	}

	// Floor: one element in and out of service-ips, pointing at an
	// existing chain, which makes the kernel validate the table as any
	// change of a jump or a map does.
	target := d.b.state.services["ns/svc-0"].chains[0].name
	el := []element{{key: elemKey{addr: mustAddr("10.63.0.1"), proto: protoTCP, port: 80}, verdict: goTo(target)}}
	ips := d.b.state.sharedSet(mapServiceIPs)
	var one []time.Duration
	for range max(reps, 5) {
		one = append(one, timed(func() error {
			return raw.Run(ctx, &transaction{ops: []op{{kind: opAddElements, set: ips, elems: el}}})
		}))
		if err := raw.Run(ctx, &transaction{ops: []op{{kind: opDeleteElements, set: ips, elems: el}}}); err != nil {
			b.Fatal(err)
		}
	}
	row.oneElm = dptest.Median(one)

	// The same endpoint change through knftables: nft -f of the same
	// operations, after nft fetched what it needs of the table.
	row.knftEP = benchKnftables(b, tp, ns, there, back, reps)
	return row
}

// benchKnftables runs there (from the table in force to another) and
// back through knftables in ns, and returns the median time of there.
func benchKnftables(b *testing.B, tp *nstest.Topology, ns string, there, back *transaction, reps int) time.Duration {
	b.Helper()
	var out []time.Duration
	err := tp.Do(ns, func() error {
		nft, err := knftables.New(knftables.IPv4Family, TableName)
		if err != nil {
			return err
		}
		for range max(reps, 5) {
			start := time.Now()
			if err := nft.Run(context.Background(), toKnftables(nft, there, dataplane.IPv4)); err != nil {
				return fmt.Errorf("knftables: %w", err)
			}
			out = append(out, time.Since(start))
			if err := nft.Run(context.Background(), toKnftables(nft, back, dataplane.IPv4)); err != nil {
				return fmt.Errorf("knftables back: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return dptest.Median(out)
}

// toKnftables converts tx to a knftables transaction.
func toKnftables(nft knftables.Interface, tx *transaction, f dataplane.Family) *knftables.Transaction {
	kt := nft.NewTransaction()
	for _, o := range opsOf(tx) {
		switch o.kind {
		case opAddTable:
			kt.Add(&knftables.Table{})
		case opAddChain:
			c := &knftables.Chain{Name: o.chain.name}
			if h := o.chain.hook; h != nil {
				typ, hook, prio := knftables.BaseChainType(h.typ), knftables.BaseChainHook(h.hook), knftables.BaseChainPriority(strconv.Itoa(h.priority))
				c.Type, c.Hook, c.Priority = &typ, &hook, &prio
			}
			kt.Add(c)
		case opFlushChain:
			kt.Flush(&knftables.Chain{Name: o.name})
		case opDeleteChain:
			kt.Delete(&knftables.Chain{Name: o.name})
		case opAddRule:
			kt.Add(&knftables.Rule{Chain: o.name, Rule: o.rule.String(f)})
		case opAddElements, opDeleteElements:
			for _, e := range o.elems {
				el := &knftables.Element{Key: strings.Split(e.key.text(o.set.key), " . ")}
				if o.set.vmap {
					el.Map = o.set.name
					if o.kind == opAddElements {
						el.Value = []string{e.verdict.String()}
					}
				} else {
					el.Set = o.set.name
				}
				if o.kind == opAddElements {
					kt.Add(el)
				} else {
					kt.Delete(el)
				}
			}
		default:
			panic(fmt.Sprintf("toKnftables: operation %d not converted", o.kind))
		}
	}
	return kt
}

// timeNFTScript loads script with nft -f in namespace ns and returns how
// long it took. It is the harness for comparing other rulesets on the
// same kernel (kube-proxy's nftables mode: see BenchmarkNFTScripts).
func timeNFTScript(tb testing.TB, ns, script string) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		tb.Fatalf("nft -f: %v: %s", err, firstLines(string(out), 5))
	}
	return took
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// BenchmarkNFTScripts times nft scripts from files, in order, in one fresh
// namespace: PP_BENCH_NFT_SCRIPTS=initial.nft,update.nft,... (each file
// loaded with nft -f, timed separately). It is how kube-proxy's nftables
// ruleset (dumped with "nft list ruleset" from a kube-proxy at N
// Services, and a one-Service change written as nft commands) is timed
// on the same kernel as BenchmarkSync.
func BenchmarkNFTScripts(b *testing.B) {
	requireKernel(b)
	files := os.Getenv("PP_BENCH_NFT_SCRIPTS")
	if files == "" {
		b.Skip("set PP_BENCH_NFT_SCRIPTS to a comma-separated list of nft scripts")
	}
	tp := nstest.New(b, nstest.Options{Pods: 1})
	for _, f := range strings.Split(files, ",") {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		took := timeNFTScript(b, tp.NodeNS(), string(data))
		fmt.Printf("%s\t%d bytes\t%s\n", f, len(data), dptest.Millis(took))
	}
}

func printBenchTable(w io.Writer, rows []benchRow) {
	if len(rows) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "services\tops\tbatch\tbuild\tfull(initial)\tnft -f\tratio\traw\tfull(steady)\trecreate\tpartial(ep)\tpartial(svc)\t1-elem\tratio\tknftables(ep)\t")
	for _, r := range rows {
		_, _ = fmt.Fprintf(tw, "%d\t%d\t%.1fMB\t%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t\n", r.services, r.ops, float64(r.bytes)/1e6,
			dptest.Millis(r.build), dptest.Millis(r.fullInitial), dptest.Millis(r.nftFloor), r.fullInitial.Seconds()/r.nftFloor.Seconds(), dptest.Millis(r.raw),
			dptest.Millis(r.fullSteady), dptest.Millis(r.recreate), dptest.Millis(r.partialEP), dptest.Millis(r.partialSvc), dptest.Millis(r.oneElm),
			r.partialEP.Seconds()/r.oneElm.Seconds(), dptest.Millis(r.knftEP))
	}
	_ = tw.Flush()
}

// BenchmarkDriftCheck measures what the drift check costs before a full
// sync, on the real kernel, at N Services x 3 endpoints (PP_BENCH_SIZES,
// default 10000): Drifted when nothing else committed (one GETGEN), and
// when another program committed (GETGEN and the confirming listing of
// the table's chains and sets). Medians of PP_BENCH_REPS (default 5):
//
//	go test -run '^$' -bench BenchmarkDriftCheck -benchtime 1x -timeout 30m ./nodeagent/dataplane/nftables/
func BenchmarkDriftCheck(b *testing.B) {
	requireKernel(b)
	sizes := dptest.EnvInts(b, "PP_BENCH_SIZES", []int{10000})
	reps := dptest.EnvInts(b, "PP_BENCH_REPS", []int{5})[0]
	for _, n := range sizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			tp := nstest.New(b, nstest.Options{Pods: 1})
			ns := tp.NodeNS()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			cfg := DefaultConfig(dataplane.IPv4)
			cfg.NetNS = nsPath(ns)
			d, err := New(cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			tbl := dptest.Table(b, &pb.NodeInfo{Name: "bench", Hash: 1}, dptest.ScaleServices(n, 3)...)
			if err := d.Sync(ctx, tbl, nil, true); err != nil {
				b.Fatal(err)
			}
			inv := d.b.state.inventory()
			var quiet, confirm []time.Duration
			for i := range reps {
				start := time.Now()
				drifted, err := d.b.Drifted(ctx)
				quiet = append(quiet, time.Since(start))
				if err != nil || drifted {
					b.Fatalf("Drifted with no other commit = %v, %v", drifted, err)
				}
				// Another program's commit, outside our table.
				verb := []string{"add", "delete"}[i%2]
				if out, err := tp.Exec(ns, "nft", verb, "table", "ip", "someone-else"); err != nil {
					b.Fatalf("%s: %v", out, err)
				}
				start = time.Now()
				drifted, err = d.b.Drifted(ctx)
				confirm = append(confirm, time.Since(start))
				if err != nil || drifted {
					b.Fatalf("Drifted after another commit = %v, %v", drifted, err)
				}
			}
			fmt.Printf("services %d (%d chains, %d sets): Drifted, no other commit: %v; after another commit (GETGEN + listing): %v\n",
				n, len(inv.chains), len(inv.sets), dptest.Median(quiet).Round(time.Microsecond), dptest.Median(confirm).Round(time.Microsecond))
			b.ReportMetric(float64(dptest.Median(quiet).Microseconds()), "gen-us")
			b.ReportMetric(float64(dptest.Median(confirm).Microseconds()), "confirm-us")
		})
	}
}
