package iptables

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// ---- Configuration -----------------------------------------------------

// testConfig is the unit tests' configuration of family.
func testConfig(family dataplane.Family) Config {
	c := DefaultConfig(family)
	c.Backend = xtables.BackendNFT
	c.LocalMode = dataplane.LocalClusterCIDR
	c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
	c.NodeIPs = []string{"192.168.100.1", "fd00:100::1"}
	return c
}

// caseConfig is c's configuration: testConfig of its family, changed as
// the case says.
func caseConfig(c dptest.Case) Config {
	cfg, t := testConfig(c.Family), c.Config
	cfg.LocalMode, cfg.MasqueradeBit = cmp.Or(t.LocalMode, cfg.LocalMode), cmp.Or(t.MasqueradeBit, cfg.MasqueradeBit)
	cfg.NodePortAddresses, cfg.MasqueradeAll = t.NodePortAddresses, t.MasqueradeAll
	cfg.NoRandomFully, cfg.ConntrackTCPBeLiberal = t.NoRandomFully, t.ConntrackTCPBeLiberal
	return cfg
}

// newTestDataplane returns a Dataplane of cfg writing to f as the runner
// of cfg.Backend, reporting its syncs to observe (nil for none).
func newTestDataplane(cfg Config, f xtables.Runner, observe dataplane.Observer) *Dataplane {
	return newDataplane(cfg, map[xtables.Backend]xtables.Runner{cfg.Backend: f}, &fakeSysctls{}, observe)
}

// fakeSysctls holds sysctls in a map, records the writes and fails as
// told. Unset sysctls read as "0".
type fakeSysctls struct {
	values map[string]string
	sets   []string // "name=value", in order
	err    error
}

func (f *fakeSysctls) Get(_ context.Context, name string) (string, error) {
	if f.err != nil {
		return "", f.err
	}
	if v, ok := f.values[name]; ok {
		return v, nil
	}
	return "0", nil
}

func (f *fakeSysctls) Set(_ context.Context, name, value string) error {
	if f.err != nil {
		return f.err
	}
	if f.values == nil {
		f.values = map[string]string{}
	}
	f.values[name] = value
	f.sets = append(f.sets, name+"="+value)
	return nil
}

// rendered is a ruleset with its input written out whole.
type rendered struct {
	*ruleset
	data []byte
}

// render plans in and writes its input whole.
func render(in *renderInput) rendered {
	rs := newRuleset(in)
	var b bytes.Buffer
	if _, err := rs.WriteTo(&b); err != nil {
		panic(fmt.Sprintf("writing the input: %v", err))
	}
	return rendered{ruleset: rs, data: b.Bytes()}
}

// renderFull renders t as a full sync would on an empty kernel.
func renderFull(t *proxytable.Table, cfg Config) rendered {
	return render(&renderInput{table: t, params: newParams(&cfg, t.Node), full: true})
}

// ---- Fake runner and kernel ----------------------------------------------

// fakeRunner records calls and applies restores to a model of the
// kernel's tables with iptables-restore --noflush semantics, refusing
// what the kernel refuses (unknown chains, deleting a referenced chain).
type fakeRunner struct {
	kernel   *fakeKernel
	restores []fakeRestore
	saves    []string
	ensured  int
	// failRestore, when set, fails the next restores: the restore is not
	// applied and the error returned.
	failRestore func(data string) error
	// saveOutput overrides Save (for detection tests).
	saveOutput map[string]string
}

type fakeRestore struct {
	data  string
	flags []string
}

func newFakeRunner() *fakeRunner { return &fakeRunner{kernel: newFakeKernel()} }

func (f *fakeRunner) Restore(_ context.Context, data []byte, flags ...string) error {
	f.restores = append(f.restores, fakeRestore{data: string(data), flags: flags})
	if f.failRestore != nil {
		if err := f.failRestore(string(data)); err != nil {
			return err
		}
	}
	if !slices.Contains(flags, "--noflush") {
		return fmt.Errorf("fake runner: restore without --noflush would flush the whole table")
	}
	if line, err := f.kernel.apply(string(data)); err != nil {
		return &xtables.RestoreError{Tool: "fake-restore", Line: line, Stderr: err.Error(), Err: err}
	}
	return nil
}

func (f *fakeRunner) Save(_ context.Context, table string) ([]byte, error) {
	f.saves = append(f.saves, table)
	if f.saveOutput != nil {
		return []byte(f.saveOutput[table]), nil
	}
	return []byte(f.kernel.save(table)), nil
}

func (f *fakeRunner) EnsureRule(_ context.Context, table, chain string, rule ...string) error {
	f.ensured++
	tb := f.kernel.tables[table]
	if _, ok := tb.chains[chain]; !ok {
		return fmt.Errorf("fake: no chain %s/%s", table, chain)
	}
	text := strings.Join(dptest.QuoteArgs(rule), " ")
	if slices.Contains(tb.chains[chain], text) {
		return nil
	}
	if target := dptest.RuleTarget(text); !builtinTarget(target) {
		if _, ok := tb.chains[target]; !ok {
			return fmt.Errorf("fake: no chain %s/%s", table, target)
		}
	}
	tb.chains[chain] = append([]string{text}, tb.chains[chain]...)
	return nil
}

// fakeKernel holds chains as rule text (the "-A CHAIN" prefix removed).
type fakeKernel struct {
	tables map[string]*fakeTable
}

type fakeTable struct {
	chains map[string][]string
	order  []string // user chains in creation order
}

var builtinChains = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
}

func newFakeKernel() *fakeKernel {
	k := &fakeKernel{tables: map[string]*fakeTable{}}
	for name, chains := range builtinChains {
		t := &fakeTable{chains: map[string][]string{}}
		for _, c := range chains {
			t.chains[c] = nil
		}
		k.tables[name] = t
	}
	return k
}

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{chains: make(map[string][]string, len(t.chains)), order: slices.Clone(t.order)}
	for k, v := range t.chains {
		c.chains[k] = slices.Clone(v)
	}
	return c
}

func isBuiltinChain(table, chain string) bool { return slices.Contains(builtinChains[table], chain) }

func builtinTarget(t string) bool {
	switch t {
	case "", "ACCEPT", "DROP", "REJECT", "RETURN", "DNAT", "SNAT", "MASQUERADE", "MARK":
		return true
	}
	return false
}

// apply runs restore input; on error it returns the failing line and
// leaves the table being processed unchanged (tables before it stay
// committed, as with the real tool).
func (k *fakeKernel) apply(data string) (int, error) {
	var cur *fakeTable
	var name string
	for i, line := range strings.Split(strings.TrimSuffix(data, "\n"), "\n") {
		n := i + 1
		switch {
		case line == "" || strings.HasPrefix(line, "#") || line == "-S":
		case strings.HasPrefix(line, "*"):
			name = line[1:]
			if k.tables[name] == nil {
				return n, fmt.Errorf("unknown table %s", name)
			}
			cur = k.tables[name].clone()
		case line == "COMMIT":
			// Validate jump targets, as the kernel does at commit.
			for c, rules := range cur.chains {
				for _, r := range rules {
					if t := dptest.RuleTarget(r); !builtinTarget(t) {
						if _, ok := cur.chains[t]; !ok {
							return n, fmt.Errorf("chain %s jumps to missing %s", c, t)
						}
					}
				}
			}
			k.tables[name] = cur
			cur = nil
		case strings.HasPrefix(line, ":"):
			c := strings.Fields(line[1:])[0]
			if isBuiltinChain(name, c) {
				return n, fmt.Errorf("restore must not declare built-in chain %s", c)
			}
			if _, ok := cur.chains[c]; !ok {
				cur.order = append(cur.order, c)
			}
			cur.chains[c] = nil // create or flush
		case strings.HasPrefix(line, "-A "):
			c, rest, _ := strings.Cut(line[3:], " ")
			if _, ok := cur.chains[c]; !ok {
				return n, fmt.Errorf("append to missing chain %s", c)
			}
			if t := dptest.RuleTarget(rest); !builtinTarget(t) {
				if _, ok := cur.chains[t]; !ok {
					return n, fmt.Errorf("jump to missing chain %s", t)
				}
			}
			cur.chains[c] = append(cur.chains[c], rest)
		case strings.HasPrefix(line, "-I "):
			args := strings.SplitN(line[3:], " ", 3)
			if len(args) != 3 || args[1] != "1" {
				return n, fmt.Errorf("unsupported insert %q", line)
			}
			c, rest := args[0], args[2]
			if _, ok := cur.chains[c]; !ok {
				return n, fmt.Errorf("insert into missing chain %s", c)
			}
			if t := dptest.RuleTarget(rest); !builtinTarget(t) {
				if _, ok := cur.chains[t]; !ok {
					return n, fmt.Errorf("jump to missing chain %s", t)
				}
			}
			cur.chains[c] = append([]string{rest}, cur.chains[c]...)
		case strings.HasPrefix(line, "-D "):
			c, rest, _ := strings.Cut(line[3:], " ")
			i := slices.Index(cur.chains[c], rest)
			if i < 0 {
				return n, fmt.Errorf("delete of a rule not in %s: %s", c, rest)
			}
			cur.chains[c] = slices.Delete(cur.chains[c], i, i+1)
		case strings.HasPrefix(line, "-X "):
			c := strings.TrimSpace(line[3:])
			if _, ok := cur.chains[c]; !ok {
				return n, fmt.Errorf("delete missing chain %s", c)
			}
			for other, rules := range cur.chains {
				for _, r := range rules {
					if dptest.RuleTarget(r) == c {
						return n, fmt.Errorf("delete chain %s referenced by %s", c, other)
					}
				}
			}
			delete(cur.chains, c)
			cur.order = slices.DeleteFunc(cur.order, func(s string) bool { return s == c })
		default:
			return n, fmt.Errorf("unsupported line %q", line)
		}
	}
	if cur != nil {
		return 0, fmt.Errorf("missing COMMIT")
	}
	return 0, nil
}

// save dumps a table like iptables-save (without counters or reordering).
func (k *fakeKernel) save(table string) string {
	t := k.tables[table]
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, c := range builtinChains[table] {
		b.WriteString(":" + c + " ACCEPT [0:0]\n")
	}
	names := slices.Sorted(slices.Values(t.order))
	for _, c := range names {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, c := range append(slices.Clone(builtinChains[table]), names...) {
		for _, r := range t.chains[c] {
			b.WriteString("-A " + c + " " + r + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// dump returns our (PP-) chains of table with their rules, sorted by
// chain, for comparing kernels.
func (k *fakeKernel) dump(table string) string {
	t := k.tables[table]
	var b strings.Builder
	for _, c := range slices.Sorted(slices.Values(t.order)) {
		if !strings.HasPrefix(c, "PP-") {
			continue // not ours
		}
		b.WriteString(":" + c + "\n")
		rules := t.chains[c]
		if c == chainServices || c == chainNodePorts {
			// Partial syncs edit these in place: compare them as sets,
			// but the NodePort jump must stay last.
			if n := len(rules); n > 0 && dptest.RuleTarget(rules[n-1]) == chainNodePorts {
				b.WriteString("  last: " + rules[n-1] + "\n")
				rules = rules[:n-1]
			}
			rules = slices.Sorted(slices.Values(rules))
		}
		for _, r := range rules {
			b.WriteString("  " + r + "\n")
		}
	}
	return b.String()
}

// ---- Packet tracer -------------------------------------------------------

// tracer walks a packet through a fakeKernel's chains the way netfilter
// would (nat PREROUTING or OUTPUT, routing, filter INPUT, FORWARD or
// OUTPUT, nat POSTROUTING), following every branch a statistic match
// could take, like kube-proxy's tracePacket.
type tracer struct {
	tb     testing.TB
	kernel *fakeKernel
	// local are the node's addresses (addrtype LOCAL).
	local []netip.Addr
	// recent holds affinity entries: recent list name -> source IPs.
	recent map[string][]string
}

func newTracer(tb testing.TB, k *fakeKernel, local ...string) *tracer {
	tb.Helper()
	tr := &tracer{tb: tb, kernel: k, recent: map[string][]string{}}
	for _, a := range local {
		tr.local = append(tr.local, netip.MustParseAddr(a))
	}
	return tr
}

type pktState struct {
	src, dst netip.Addr
	dport    int
	proto    string
	mark     uint32
	dnat     string
	verdict  string // "" while undecided
	masq     bool
	// recentSet names the recent lists a --set rule added the source to.
	recentSet []string
}

// trace returns every outcome the flow can have, deduplicated.
func (tr *tracer) trace(f dptest.Flow) []dptest.Outcome {
	tr.tb.Helper()
	start := pktState{src: netip.MustParseAddr(f.Src), dst: netip.MustParseAddr(f.Dst), dport: f.DPort, proto: f.Proto}
	natHook, filterHook := "PREROUTING", ""
	if f.FromNode {
		natHook = "OUTPUT"
	}
	var outs []dptest.Outcome
	for _, s := range tr.chain("nat", natHook, start, 0) {
		s.verdict = ""
		switch {
		case f.FromNode:
			filterHook = "OUTPUT"
		case slices.Contains(tr.local, s.dst):
			filterHook = "INPUT"
		default:
			filterHook = "FORWARD"
		}
		for _, fs := range tr.chain("filter", filterHook, s, 0) {
			if fs.verdict == "" || fs.verdict == "RETURN" {
				fs.verdict = "ACCEPT"
			}
			if fs.verdict != "ACCEPT" || filterHook == "INPUT" {
				outs = append(outs, dptest.Outcome{DNAT: fs.dnat, Verdict: fs.verdict})
				continue
			}
			fs.verdict = ""
			for _, ps := range tr.chain("nat", "POSTROUTING", fs, 0) {
				outs = append(outs, dptest.Outcome{DNAT: ps.dnat, Verdict: "ACCEPT", Masq: ps.masq})
			}
		}
	}
	return dptest.SortOutcomes(outs)
}

// chain evaluates chain and returns the states in which the packet can
// leave it: with a verdict, or with verdict "" (fell off the end or
// RETURNed) to continue in the caller.
func (tr *tracer) chain(table, chain string, s pktState, depth int) []pktState {
	if depth > 20 {
		tr.tb.Fatalf("trace: chain depth exceeded at %s/%s", table, chain)
	}
	rules, ok := tr.kernel.tables[table].chains[chain]
	if !ok {
		tr.tb.Fatalf("trace: no chain %s/%s", table, chain)
	}
	var done []pktState
	live := []pktState{s}
	for _, rule := range rules {
		var next []pktState
		for _, st := range live {
			for _, br := range tr.rule(table, rule, st, depth) {
				switch br.verdict {
				case "":
					next = append(next, br)
				case "RETURN":
					br.verdict = ""
					done = append(done, br)
				default:
					done = append(done, br)
				}
			}
		}
		live = next
		if len(live) == 0 {
			break
		}
	}
	return append(done, live...)
}

// rule applies one rule to s and returns the resulting branches.
func (tr *tracer) rule(table, rule string, s pktState, depth int) []pktState {
	args := dptest.Tokenize(rule)
	branchProb := 1.0
	target := ""
	var targetArgs []string
	neg := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func() string {
			i++
			if i >= len(args) {
				tr.tb.Fatalf("trace: %q: %s needs a value", rule, a)
			}
			return args[i]
		}
		match := true
		switch a {
		case "!":
			neg = true
			continue
		case "-m":
			val()
			continue
		case "--comment", "--mode", "--seconds":
			val()
			continue
		case "--reap":
			continue
		case "-p":
			match = val() == s.proto
		case "--dport":
			match = val() == strconv.Itoa(s.dport)
		case "-d":
			match = dptest.PrefixOf(val()).Contains(s.dst)
		case "-s":
			match = dptest.PrefixOf(val()).Contains(s.src)
		case "--dst-type":
			if val() != "LOCAL" {
				tr.tb.Fatalf("trace: unsupported addrtype in %q", rule)
			}
			match = slices.Contains(tr.local, s.dst)
		case "--src-type":
			if val() != "LOCAL" {
				tr.tb.Fatalf("trace: unsupported addrtype in %q", rule)
			}
			match = slices.Contains(tr.local, s.src)
		case "--ctstate":
			// A traced packet opens a connection: NEW, and DNAT once
			// DNATed.
			states := strings.Split(val(), ",")
			match = slices.Contains(states, "NEW") || (s.dnat != "" && slices.Contains(states, "DNAT"))
		case "--mark":
			v, m, _ := strings.Cut(val(), "/")
			vv, _ := strconv.ParseUint(v, 0, 32)
			mm := uint64(0xffffffff)
			if m != "" {
				mm, _ = strconv.ParseUint(m, 0, 32)
			}
			match = uint64(s.mark)&mm == vv
		case "--probability":
			p, err := strconv.ParseFloat(val(), 64)
			if err != nil {
				tr.tb.Fatalf("trace: %q: %v", rule, err)
			}
			branchProb = p
			continue
		case "--name":
			name := val()
			// The flag after --name says what to do with the list.
			if i+1 < len(args) && args[i+1] == "--rcheck" {
				i++
				match = slices.Contains(tr.recent[name], s.src.String())
			} else if i+1 < len(args) && args[i+1] == "--set" {
				i++
				s.recentSet = append(slices.Clone(s.recentSet), name)
			}
		case "-j":
			target = val()
			targetArgs = args[i+1:]
			i = len(args)
			continue
		default:
			tr.tb.Fatalf("trace: unsupported option %q in %q", a, rule)
		}
		if neg {
			match, neg = !match, false
		}
		if !match {
			return []pktState{s}
		}
	}
	taken := tr.target(table, target, targetArgs, s, depth)
	if branchProb < 1 {
		// Either the random match fires or it does not.
		return append(taken, s)
	}
	return taken
}

func (tr *tracer) target(table, target string, args []string, s pktState, depth int) []pktState {
	switch target {
	case "":
		return []pktState{s}
	case "ACCEPT", "DROP", "REJECT", "RETURN":
		s.verdict = target
		return []pktState{s}
	case "DNAT":
		if len(args) < 2 || args[0] != "--to-destination" {
			tr.tb.Fatalf("trace: bad DNAT %v", args)
		}
		ap := netip.MustParseAddrPort(args[1])
		s.dst, s.dport, s.dnat, s.verdict = ap.Addr(), int(ap.Port()), args[1], "ACCEPT"
		return []pktState{s}
	case "MARK":
		v, _ := strconv.ParseUint(args[1], 0, 32)
		switch args[0] {
		case "--or-mark":
			s.mark |= uint32(v)
		case "--xor-mark":
			s.mark ^= uint32(v)
		default:
			tr.tb.Fatalf("trace: bad MARK %v", args)
		}
		return []pktState{s}
	case "MASQUERADE":
		s.masq, s.verdict = true, "ACCEPT"
		return []pktState{s}
	}
	// A verdict of "" continues in the caller.
	return tr.chain(table, target, s, depth+1)
}
