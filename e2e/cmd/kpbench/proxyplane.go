package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/nftables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// proxyplaneResult is one of proxyplane's Dataplanes (nftables or
// iptables), and the floors, at one world. The child process that
// measured it (proxyplaneChild) sends it as JSON.
type proxyplaneResult struct {
	// Full are first full syncs of a new Dataplane into the namespace
	// without its rules: what an agent does on start.
	Full []time.Duration `json:"full"`
	// Partial are partial syncs after one Service's endpoint changed.
	Partial []time.Duration `json:"partial"`
	// Added are partial syncs adding one Service (each removed again, not
	// timed).
	Added []time.Duration `json:"added"`
	// Resync are full syncs of the table in force by the same Dataplane,
	// after the partial ones: what the agent does every sync period.
	Resync []time.Duration `json:"resync"`
	// PeakRSS is the child's peak resident memory (VmHWM) once the syncs
	// are done, before the listing and the floors: a process holding the
	// node's table and the Dataplane, as the agent does. HeapInuse is its
	// Go heap then, after a collection.
	PeakRSS   uint64 `json:"peakRSS"`
	HeapInuse uint64 `json:"heapInuse"`
	// TableRSS is the child's resident memory (VmRSS) holding the table,
	// before the first sync: its own baseline (the binary, the runtime,
	// the table and what building it left), which PeakRSS includes.
	TableRSS uint64 `json:"tableRSS"`
	// Floor is the same ruleset as the kernel tools' text (nftables: the
	// Dataplane's Ruleset; iptables: iptables-save of what it programmed),
	// loaded by nft -f or iptables-restore into the namespace without it.
	Floor []time.Duration `json:"floor"`
	// NftElem and NetlinkElem (nftables only) add one service-ips element
	// to the table in force, with the nft command and with one netlink
	// batch: the floor of any update through nft, and of any update at
	// all (the kernel validates the table graph on each such commit).
	NftElem     []time.Duration `json:"nftElem,omitempty"`
	NetlinkElem []time.Duration `json:"netlinkElem,omitempty"`
	// Elements counts service-ips elements (nftables) or rules
	// (iptables) as listed; TextBytes is the floor's input size.
	Elements  int `json:"elements"`
	TextBytes int `json:"textBytes"`
	// Backend is the iptables backend used (iptables only).
	Backend string `json:"backend,omitempty"`
}

// roleEnv makes kpbench run as its proxyplane child (proxyplaneChild).
const roleEnv = "KPBENCH_ROLE"

// proxyplaneBench measures mode's Dataplane on world w in a child process
// of its own (this binary again), so that its resident memory is an
// agent's: the table and the Dataplane, not the API client's or the
// previous world's.
func proxyplaneBench(ctx context.Context, o *Options, mode string, w world) (proxyplaneResult, error) {
	var res proxyplaneResult
	self, err := os.Executable()
	if err != nil {
		return res, fmt.Errorf("finding this binary: %w", err)
	}
	cmd := exec.CommandContext(ctx, self, "--mode="+mode, fmt.Sprintf("--world=%dx%d", w.Services, w.Endpoints),
		fmt.Sprintf("--reps=%d", o.Reps), fmt.Sprintf("--partials=%d", o.Partials), "--dir="+o.Dir)
	cmd.Env = append(os.Environ(), roleEnv+"=proxyplane")
	cmd.Stderr = os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	out, err := cmd.Output()
	if err != nil {
		return res, fmt.Errorf("proxyplane %s at %s: %w", mode, w, err)
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return res, fmt.Errorf("proxyplane %s at %s: its result: %w", mode, w, err)
	}
	return res, nil
}

// proxyplaneChild is the child's main: it measures one Dataplane on one
// world and prints the result as JSON on stdout.
func proxyplaneChild(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("kpbench proxyplane", pflag.ContinueOnError)
	mode := fs.String("mode", "nftables", "nftables or iptables")
	ws := fs.String("world", "", "SERVICESxENDPOINTS")
	o := newOptions()
	fs.IntVar(&o.Reps, "reps", o.Reps, "")
	fs.IntVar(&o.Partials, "partials", o.Partials, "")
	fs.StringVar(&o.Dir, "dir", o.Dir, "")
	fs.StringVar(&o.Profile, "profile", "", "Write the syncs' CPU and allocation profiles (pprof) to PREFIX.cpu and PREFIX.allocs, and skip the floors.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	w, err := parseWorld(*ws)
	if err != nil {
		return err
	}
	var res proxyplaneResult
	switch *mode {
	case "nftables":
		res, err = nftablesBench(ctx, o, w)
	case "iptables":
		res, err = iptablesBench(ctx, o, w)
	default:
		err = fmt.Errorf("--mode %q: nftables or iptables", *mode)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// maxListedEndpoints bounds the worlds whose nftables table is listed
// with nft (see nftablesBench).
const maxListedEndpoints = 100000

// syncer is what both Dataplanes offer.
type syncer interface {
	Sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error
}

// agentSyncs runs the agent's part on world w: o.Reps full syncs of a new
// Dataplane each (newDP) from empty (clear), then o.Partials endpoint
// changes and o.Partials Services added and removed, all checked to be
// partial syncs (counted by observe's counts), then o.Reps full syncs of
// the table in force by the same Dataplane. It records the process's
// peak memory then, and returns the last Dataplane and the table in force.
func agentSyncs(ctx context.Context, o *Options, w world, res *proxyplaneResult, label string,
	newDP func() (syncer, error), clear func() error, counts *syncCounts,
) (syncer, *proxytable.Table, error) {
	node := &pb.NodeInfo{Name: nodeName, Hash: 1}
	tbl, err := ppTable(node, w)
	if err != nil {
		return nil, nil, err
	}
	if m, err := procStatus(os.Getpid()); err == nil {
		res.TableRSS = m.rss
	}
	if o.Profile != "" {
		stop, err := profile(o.Profile)
		if err != nil {
			return nil, nil, err
		}
		defer stop()
	}
	var d syncer
	for range o.Reps {
		if err := clear(); err != nil {
			return nil, nil, err
		}
		if d, err = newDP(); err != nil {
			return nil, nil, err
		}
		start := time.Now()
		if err := d.Sync(ctx, tbl, nil, true); err != nil {
			return nil, nil, err
		}
		res.Full = append(res.Full, time.Since(start))
	}
	log.Printf("proxyplane %s at %s: full syncs %v", label, w, roundAll(res.Full))

	cur := tbl
	timed := func(next *proxytable.Table, changed []string) (time.Duration, error) {
		start := time.Now()
		if err := d.Sync(ctx, next, changed, false); err != nil {
			return 0, err
		}
		cur = next
		return time.Since(start), nil
	}
	for k := range o.Partials {
		next, changed, err := ppChange(cur, changedService(w.Services), w.Endpoints, k)
		if err != nil {
			return nil, nil, err
		}
		took, err := timed(next, changed)
		if err != nil {
			return nil, nil, err
		}
		res.Partial = append(res.Partial, took)
	}
	log.Printf("proxyplane %s at %s: one-endpoint partial syncs %v", label, w, roundAll(res.Partial))
	for range o.Partials {
		before := cur
		next, changed, err := ppAdd(cur, addedService(w.Services), w.Endpoints)
		if err != nil {
			return nil, nil, err
		}
		took, err := timed(next, changed)
		if err != nil {
			return nil, nil, err
		}
		res.Added = append(res.Added, took)
		back, _, err := next.Apply(&pb.Delta{BaseVersion: next.Version, Version: before.Version, Removals: changed})
		if err != nil {
			return nil, nil, err
		}
		if _, err := timed(back, changed); err != nil {
			return nil, nil, err
		}
	}
	log.Printf("proxyplane %s at %s: one-Service-added partial syncs %v", label, w, roundAll(res.Added))
	for range o.Reps {
		start := time.Now()
		if err := d.Sync(ctx, cur, nil, true); err != nil {
			return nil, nil, err
		}
		res.Resync = append(res.Resync, time.Since(start))
	}
	log.Printf("proxyplane %s at %s: full syncs of the table in force %v", label, w, roundAll(res.Resync))
	if want := 3 * o.Partials; counts.partials != want || counts.failures != 0 {
		return nil, nil, fmt.Errorf("%d partial syncs and %d failures, want %d and none", counts.partials, counts.failures, want)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapInuse = ms.HeapInuse
	if m, err := procStatus(os.Getpid()); err == nil {
		res.PeakRSS = m.hwm
	}
	log.Printf("proxyplane %s at %s: peak RSS %d MiB, heap in use %d MiB, RSS with the table before the syncs %d MiB", label, w, res.PeakRSS>>20, res.HeapInuse>>20, res.TableRSS>>20)
	return d, cur, nil
}

// profile starts a CPU profile into prefix.cpu; the function it returns
// stops it and writes the allocations so far into prefix.allocs.
func profile(prefix string) (func(), error) {
	cpu, err := os.Create(prefix + ".cpu")
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		_ = cpu.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = cpu.Close()
		f, err := os.Create(prefix + ".allocs")
		if err != nil {
			log.Printf("writing the allocation profile: %v", err)
			return
		}
		defer func() { _ = f.Close() }()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			log.Printf("writing the allocation profile: %v", err)
		}
	}, nil
}

// syncCounts counts a Dataplane's syncs, so that the partial syncs
// measured are known to have been partial.
type syncCounts struct{ partials, failures int }

func (c *syncCounts) observe(r dataplane.SyncResult) {
	if r.Err != nil {
		c.failures++
	} else if !r.Full {
		c.partials++
	}
}

// nftablesBench measures the nftables Dataplane on w in a fresh namespace.
func nftablesBench(ctx context.Context, o *Options, w world) (proxyplaneResult, error) {
	var res proxyplaneResult
	err := phase(fmt.Sprintf("kpbench-proxyplane-nft-%d", w.Services), func(tb *progTB) error {
		tp := nstest.New(tb, nstest.Options{Pods: 1}) //nolint:contextcheck // nstest bounds its own commands
		ns := tp.NodeNS()
		tb.Cleanup(func() { flushRuleset(context.WithoutCancel(ctx), ns) })
		cfg := nftables.DefaultConfig(dataplane.IPv4)
		cfg.LocalMode = dataplane.LocalClusterCIDR
		cfg.ClusterCIDRs = []string{clusterCIDR}
		cfg.NodeIPs = []string{tp.NodeIP().String()}
		cfg.NetNS = filepath.Join("/run/netns", ns)
		dropTable := func() error {
			out, _, err := runCmd(ctx, 10*time.Minute, ns, "", "nft", "delete", "table", "ip", nftables.TableName)
			if err != nil && !strings.Contains(string(out), "No such file") {
				return err
			}
			return nil
		}
		counts := &syncCounts{}
		s, _, err := agentSyncs(ctx, o, w, &res, "nftables", func() (syncer, error) {
			return nftables.New(cfg, counts.observe)
		}, dropTable, counts)
		if err != nil {
			return err
		}
		d := s.(*nftables.Dataplane)
		if o.Profile != "" {
			return nil
		}

		// The ruleset as text, as nft would load it: the floor's input.
		text := d.Ruleset()
		res.TextBytes = len(text)
		// What the kernel holds, as nft lists it, unless that takes
		// minutes (2.5 at 250,000 endpoints here): then what the
		// Dataplane says it programmed.
		listing := []byte(text)
		if w.Services*w.Endpoints <= maxListedEndpoints {
			var took time.Duration
			if listing, took, err = runStdout(ctx, 10*time.Minute, ns, "nft", "list", "table", "ip", nftables.TableName); err != nil {
				return err
			}
			log.Printf("nft list table ip proxyplane: %d bytes in %v", len(listing), took.Round(time.Millisecond))
		}
		res.Elements = countServiceIPs(string(listing))
		if err := os.WriteFile(filepath.Join(o.Dir, fmt.Sprintf("proxyplane-%dx%d.nft", w.Services, w.Endpoints)), listing, 0o644); err != nil {
			return err
		}

		// The floors.
		for range o.Reps {
			if err := dropTable(); err != nil {
				return err
			}
			_, took, err := runCmd(ctx, 10*time.Minute, ns, text, "nft", "-f", "-")
			if err != nil {
				return fmt.Errorf("loading proxyplane's ruleset text: %w", err)
			}
			res.Floor = append(res.Floor, took)
		}
		log.Printf("proxyplane's ruleset at %s through nft -f: %v", w, roundAll(res.Floor))

		// One element in and out of service-ips, pointing at an existing
		// chain, over the table just loaded (the same ruleset).
		chain := firstServiceChain(text)
		if chain == "" {
			return fmt.Errorf("no service chain in the ruleset")
		}
		elem := "{ 10.63.0.1 . tcp . 80 : goto " + chain + " }"
		for range o.Partials {
			_, took, err := runCmd(ctx, time.Minute, ns, "", "nft", "add", "element", "ip", nftables.TableName, "service-ips", elem)
			if err != nil {
				return err
			}
			res.NftElem = append(res.NftElem, took)
			if _, _, err := runCmd(ctx, time.Minute, ns, "", "nft", "delete", "element", "ip", nftables.TableName, "service-ips", "{ 10.63.0.1 . tcp . 80 }"); err != nil {
				return err
			}
		}
		if res.NetlinkElem, err = netlinkElement(cfg.NetNS, chain, o.Partials); err != nil {
			return err
		}
		log.Printf("one element at %s: nft %v, netlink %v", w, roundAll(res.NftElem), roundAll(res.NetlinkElem))
		return nil
	})
	return res, err
}

// iptablesBench measures the iptables Dataplane on w in a fresh
// namespace.
func iptablesBench(ctx context.Context, o *Options, w world) (proxyplaneResult, error) {
	var res proxyplaneResult
	err := phase(fmt.Sprintf("kpbench-proxyplane-ipt-%d", w.Services), func(tb *progTB) error {
		tp := nstest.New(tb, nstest.Options{Pods: 1}) //nolint:contextcheck // nstest bounds its own commands
		ns := tp.NodeNS()
		tb.Cleanup(func() { flushRuleset(context.WithoutCancel(ctx), ns) })
		cfg := iptables.DefaultConfig(dataplane.IPv4)
		cfg.LocalMode = dataplane.LocalClusterCIDR
		cfg.ClusterCIDRs = []string{clusterCIDR}
		cfg.NodeIPs = []string{tp.NodeIP().String()}
		cfg.CommandPrefix = []string{"ip", "netns", "exec", ns}
		counts := &syncCounts{}
		var last *iptables.Dataplane
		s, _, err := agentSyncs(ctx, o, w, &res, "iptables", func() (syncer, error) {
			d, err := iptables.New(cfg, counts.observe)
			last = d
			return d, err
		}, func() error { return clearIPTables(ctx, ns, last) }, counts)
		if err != nil {
			return err
		}
		d := s.(*iptables.Dataplane)
		res.Backend = string(d.IPTablesBackend())
		if o.Profile != "" {
			return nil
		}
		bin := xtables.BinariesOf(dataplane.IPv4, d.IPTablesBackend())
		dump, took, err := runStdout(ctx, 10*time.Minute, ns, bin.Save)
		if err != nil {
			return err
		}
		log.Printf("%s: %d bytes in %v", bin.Save, len(dump), took.Round(time.Millisecond))
		res.Elements, res.TextBytes = countRules(string(dump)), len(dump)
		if err := os.WriteFile(filepath.Join(o.Dir, fmt.Sprintf("proxyplane-%dx%d.iptables", w.Services, w.Endpoints)), dump, 0o644); err != nil {
			return err
		}
		for range o.Reps {
			if err := clearIPTables(ctx, ns, d); err != nil {
				return err
			}
			_, took, err := runCmd(ctx, 10*time.Minute, ns, string(dump), bin.Restore)
			if err != nil {
				return fmt.Errorf("loading proxyplane's iptables-save: %w", err)
			}
			res.Floor = append(res.Floor, took)
		}
		log.Printf("proxyplane's iptables rules at %s through %s: %v", w, bin.Restore, roundAll(res.Floor))
		return nil
	})
	return res, err
}

// clearIPTables empties namespace ns's iptables rules in d's backend (nft
// when d is nil, before the first sync: what an empty node's detection
// picks).
func clearIPTables(ctx context.Context, ns string, d *iptables.Dataplane) error {
	if d == nil || d.IPTablesBackend() == xtables.BackendNFT {
		_, _, err := runCmd(ctx, 10*time.Minute, ns, "", "nft", "flush", "ruleset")
		return err
	}
	bin := xtables.BinariesOf(dataplane.IPv4, d.IPTablesBackend())
	_, _, err := runCmd(ctx, 10*time.Minute, ns, "*nat\nCOMMIT\n*filter\nCOMMIT\n*mangle\nCOMMIT\n", bin.Restore)
	return err
}

// countRules counts the rules (-A lines) of an iptables-save dump.
func countRules(dump string) int {
	n := 0
	for line := range strings.SplitSeq(dump, "\n") {
		if strings.HasPrefix(line, "-A ") {
			n++
		}
	}
	return n
}

var serviceChain = regexp.MustCompile(`(?m)^\s*chain (service-\S+) \{`)

func firstServiceChain(text string) string {
	m := serviceChain.FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

// netlinkElement adds (timed) and deletes (not timed) one service-ips
// element reps times, each a one-message netlink batch sent with
// google/nftables, in the namespace at nsPath.
func netlinkElement(nsPath, chain string, reps int) ([]time.Duration, error) {
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", nsPath, err)
	}
	defer func() { _ = unix.Close(fd) }()
	conn, err := gnft.New(gnft.WithNetNSFd(fd), gnft.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer func() { _ = conn.CloseLasting() }()
	set := &gnft.Set{Table: &gnft.Table{Name: nftables.TableName, Family: gnft.TableFamilyIPv4}, Name: "service-ips", IsMap: true}
	// ipv4_addr . inet_proto . inet_service: each field padded to 4 bytes.
	key := make([]byte, 12)
	copy(key[0:4], []byte{10, 63, 0, 1})
	key[4] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(key[8:10], 80)
	el := []gnft.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}}
	var out []time.Duration
	for range reps {
		start := time.Now()
		if err := conn.SetAddElements(set, el); err != nil {
			return nil, err
		}
		if err := conn.Flush(); err != nil {
			return nil, fmt.Errorf("netlink: adding an element: %w", err)
		}
		out = append(out, time.Since(start))
		if err := conn.SetDeleteElements(set, []gnft.SetElement{{Key: key}}); err != nil {
			return nil, err
		}
		if err := conn.Flush(); err != nil {
			return nil, fmt.Errorf("netlink: deleting an element: %w", err)
		}
	}
	return out, nil
}
