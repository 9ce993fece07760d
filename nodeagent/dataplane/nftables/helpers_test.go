package nftables

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// ---- Configuration -----------------------------------------------------

// testConfig is the unit tests' configuration of family.
func testConfig(family dataplane.Family) Config {
	c := DefaultConfig(family)
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

// fullState computes the ruleset of t as a full sync would.
func fullState(t *proxytable.Table, cfg Config) *state {
	p := newParams(&cfg, t.Node)
	return buildState(t, &p)
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// newTestDataplane returns a Dataplane over k, with no Observer.
func newTestDataplane(cfg Config, k kernel) *Dataplane { return newDataplane(cfg, k, nil) }

// withoutDriftCheck returns a Dataplane over d's backend whose Driver
// cannot see that the backend is a dataplane.DriftChecker: what the drift
// tests compare with, to show what the check repairs.
func withoutDriftCheck(d *Dataplane, observe dataplane.Observer) *Dataplane {
	hidden := struct{ dataplane.Backend }{d.b}
	return &Dataplane{Driver: dataplane.NewDriver(hidden, mode, d.b.cfg.Family, observe), b: d.b}
}

// ---- Fake kernel ----------------------------------------------------------

// fakeKernel implements kernel over a model of the family's table, with
// the rules of nf_tables that matter to the Dataplane: operations apply
// in order to a copy, which replaces the table only if all of them
// succeeded (a transaction is atomic); objects must exist before they are
// referenced; a chain or set still referenced cannot be deleted; an
// element already present with another value cannot be added; and at
// commit the jump graph must be loop-free and every statement allowed
// where its base chains reach it (DNAT on nat prerouting and output,
// masquerade on nat postrouting, reject on filter input, forward and
// output). Its ruleset generation counts the transactions applied, as
// the kernel's counts commits.
type fakeKernel struct {
	family dataplane.Family
	table  *fakeTable // nil when the table does not exist
	runs   []*transaction
	lists  int
	gen    uint32
	gens   int // Gen calls
	// genErr, when set, is what Gen returns.
	genErr error
	// fail, when set, is called before each transaction: an error it
	// returns is the transaction's result and nothing is applied.
	fail func(tx *transaction) error
}

type fakeTable struct {
	chains map[string]*fakeChain
	sets   map[string]*fakeSet
}

type fakeChain struct {
	hook  *baseHook
	rules []rule
}

type fakeSet struct {
	def   *set
	elems map[elemKey]element
}

func newFakeKernel(f dataplane.Family) *fakeKernel { return &fakeKernel{family: f} }

func (t *fakeTable) clone() *fakeTable {
	c := &fakeTable{chains: make(map[string]*fakeChain, len(t.chains)), sets: make(map[string]*fakeSet, len(t.sets))}
	for k, v := range t.chains {
		c.chains[k] = &fakeChain{hook: v.hook, rules: slices.Clone(v.rules)}
	}
	for k, v := range t.sets {
		c.sets[k] = &fakeSet{def: v.def, elems: maps.Clone(v.elems)}
	}
	return c
}

func (k *fakeKernel) List(ctx context.Context) (*inventory, error) {
	k.lists++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if k.table == nil {
		return nil, nil
	}
	inv := &inventory{chains: map[string]bool{}, sets: map[string]bool{}}
	for n, c := range k.table.chains {
		inv.chains[n] = c.hook != nil
	}
	for n, s := range k.table.sets {
		inv.sets[n] = s.def.isMap()
	}
	return inv, nil
}

func (k *fakeKernel) Gen(ctx context.Context) (uint32, error) {
	k.gens++
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if k.genErr != nil {
		return 0, k.genErr
	}
	return k.gen, nil
}

// commitBehind applies change to the table as another program's commit
// would (an operator's nft command): the generation changes. change may
// leave the table nil (deleted).
func (k *fakeKernel) commitBehind(change func(t **fakeTable)) {
	change(&k.table)
	k.gen = nextGen(k.gen)
}

// opsOf returns tx's operations as a list, each with its elements in
// elems and owners (not elemSeq).
func opsOf(tx *transaction) []op {
	var out []op
	tx.each(func(_ int, o *op) bool {
		c := *o
		if c.elemSeq != nil {
			c.elems, c.owners, c.elemSeq = nil, nil, nil
			o.eachElem(func(_ int, e element, owner string) bool {
				c.elems, c.owners = append(c.elems, e), append(c.owners, owner)
				return true
			})
		}
		out = append(out, c)
		return true
	})
	return out
}

func (k *fakeKernel) Run(ctx context.Context, tx *transaction) error {
	k.runs = append(k.runs, tx)
	if err := ctx.Err(); err != nil {
		return err
	}
	if k.fail != nil {
		if err := k.fail(tx); err != nil {
			return err
		}
	}
	var cur *fakeTable
	if k.table != nil {
		cur = k.table.clone()
	}
	ops := opsOf(tx)
	for i := range ops {
		o := &ops[i]
		next, errno, elem := k.apply(cur, o)
		if errno != 0 {
			if elem >= 0 {
				o = o.element(elem) // as the kernel's error offset says
			}
			return &TransactionError{Family: k.family, Op: o.text(k.family), Key: o.owner, Errno: errno, Refused: 1}
		}
		cur = next
	}
	if cur != nil {
		if errno := validate(cur); errno != 0 {
			return &TransactionError{Family: k.family, Errno: errno, Refused: 1}
		}
	}
	k.table = cur
	if !tx.empty() {
		k.gen = nextGen(k.gen)
	}
	return nil
}

// refs counts the references to chain or set name from rules and
// elements.
func (t *fakeTable) refs(name string) int {
	n := 0
	for _, c := range t.chains {
		for _, r := range c.rules {
			for _, e := range r.exprs {
				if refersTo(e) == name {
					n++
				}
			}
		}
	}
	for _, s := range t.sets {
		for _, v := range s.elems {
			if v.verdict.chain == name {
				n++
			}
		}
	}
	return n
}

// refersTo returns the chain or set an expression refers to.
func refersTo(e rexpr) string {
	switch e := e.(type) {
	case verdict:
		return e.chain
	case setMatch:
		return e.set
	case setUpdate:
		return e.set
	case vmapLookup:
		return e.set
	case dnatMap:
		return e.set
	case hairpinMatch:
		return e.set
	}
	return ""
}

// apply applies o to t; for an element operation that fails, elem is
// the index of the refused element (-1 otherwise).
func (k *fakeKernel) apply(t *fakeTable, o *op) (next *fakeTable, errno syscall.Errno, elem int) {
	next, errno = k.applyOp(t, o)
	if errno == 0 || (o.kind != opAddElements && o.kind != opDeleteElements) {
		return next, errno, -1
	}
	// Find the element: apply them one by one to a copy.
	c := t.clone()
	for i := range o.elems {
		if _, err := k.applyOp(c, o.element(i)); err != 0 {
			return next, errno, i
		}
	}
	return next, errno, -1
}

func (k *fakeKernel) applyOp(t *fakeTable, o *op) (*fakeTable, syscall.Errno) {
	if t == nil && o.kind != opAddTable {
		return nil, syscall.ENOENT
	}
	switch o.kind {
	case opAddTable:
		if t == nil {
			t = &fakeTable{chains: map[string]*fakeChain{}, sets: map[string]*fakeSet{}}
		}
	case opDeleteTable:
		return nil, 0
	case opAddChain:
		if c, ok := t.chains[o.chain.name]; ok {
			if (c.hook == nil) != (o.chain.hook == nil) || (c.hook != nil && *c.hook != *o.chain.hook) {
				return t, syscall.EEXIST
			}
			return t, 0
		}
		t.chains[o.chain.name] = &fakeChain{hook: o.chain.hook}
	case opFlushChain:
		c, ok := t.chains[o.name]
		if !ok {
			return t, syscall.ENOENT
		}
		c.rules = nil
	case opDeleteChain:
		c, ok := t.chains[o.name]
		if !ok {
			return t, syscall.ENOENT
		}
		c.rules = nil // a chain's own rules go with it
		if t.refs(o.name) > 0 {
			return t, syscall.EBUSY
		}
		delete(t.chains, o.name)
	case opAddRule:
		c, ok := t.chains[o.name]
		if !ok {
			return t, syscall.ENOENT
		}
		for _, e := range o.rule.exprs {
			switch e := e.(type) {
			case verdict:
				if e.chain == "" {
					break
				}
				target, ok := t.chains[e.chain]
				if !ok {
					return t, syscall.ENOENT
				}
				if target.hook != nil {
					return t, syscall.EOPNOTSUPP
				}
			case setMatch, setUpdate, vmapLookup, dnatMap, hairpinMatch:
				s, ok := t.sets[refersTo(e)]
				if !ok {
					return t, syscall.ENOENT
				}
				if _, isMap := e.(vmapLookup); isMap != s.def.vmap {
					return t, syscall.EINVAL
				}
				if _, isDNAT := e.(dnatMap); isDNAT != s.def.endpoints {
					return t, syscall.EINVAL
				}
				if _, isHairpin := e.(hairpinMatch); isHairpin != (s.def.key == keyHairpin) {
					return t, syscall.EINVAL
				}
				if _, isUpdate := e.(setUpdate); isUpdate && s.def.timeout == 0 {
					return t, syscall.EOPNOTSUPP
				}
			}
		}
		c.rules = append(c.rules, *o.rule)
	case opAddSet:
		if s, ok := t.sets[o.set.name]; ok {
			if *s.def != *o.set {
				return t, syscall.EEXIST
			}
			return t, 0
		}
		t.sets[o.set.name] = &fakeSet{def: o.set, elems: map[elemKey]element{}}
	case opFlushSet:
		s, ok := t.sets[o.name]
		if !ok {
			return t, syscall.ENOENT
		}
		s.elems = map[elemKey]element{}
	case opDeleteSet:
		if _, ok := t.sets[o.name]; !ok {
			return t, syscall.ENOENT
		}
		if t.refs(o.name) > 0 {
			return t, syscall.EBUSY
		}
		delete(t.sets, o.name)
	case opAddElements:
		s, ok := t.sets[o.set.name]
		if !ok {
			return t, syscall.ENOENT
		}
		for _, e := range o.elems {
			if e.verdict.chain != "" {
				c, ok := t.chains[e.verdict.chain]
				if !ok {
					return t, syscall.ENOENT
				}
				if c.hook != nil {
					return t, syscall.EOPNOTSUPP
				}
			}
			if v, ok := s.elems[e.key]; ok && v != e {
				return t, syscall.EEXIST
			}
			s.elems[e.key] = e
		}
	case opDeleteElements:
		s, ok := t.sets[o.set.name]
		if !ok {
			return t, syscall.ENOENT
		}
		for _, e := range o.elems {
			if _, ok := s.elems[e.key]; !ok {
				return t, syscall.ENOENT
			}
			delete(s.elems, e.key)
		}
	default:
		panic(fmt.Sprintf("fake kernel: operation %d", o.kind))
	}
	return t, 0
}

// validate checks the table as the kernel does at commit: from each base
// chain, every reachable chain must be loop-free and use only what the
// base chain's type and hook allow.
func validate(t *fakeTable) syscall.Errno {
	for _, c := range t.chains {
		if c.hook == nil {
			continue
		}
		if errno := t.walk(c, c.hook, map[*fakeChain]bool{}); errno != 0 {
			return errno
		}
	}
	return 0
}

func (t *fakeTable) walk(c *fakeChain, h *baseHook, path map[*fakeChain]bool) syscall.Errno {
	if path[c] {
		return syscall.ELOOP
	}
	path[c] = true
	defer delete(path, c)
	visit := func(name string) syscall.Errno {
		if name == "" {
			return 0
		}
		return t.walk(t.chains[name], h, path)
	}
	for _, r := range c.rules {
		for _, e := range r.exprs {
			switch e := e.(type) {
			case dnatTo, dnatMap:
				if h.typ != "nat" || (h.hook != "prerouting" && h.hook != "output") {
					return syscall.EOPNOTSUPP
				}
			case masquerade:
				if h.typ != "nat" || h.hook != "postrouting" {
					return syscall.EOPNOTSUPP
				}
			case reject:
				if h.typ != "filter" || (h.hook != "input" && h.hook != "forward" && h.hook != "output") {
					return syscall.EOPNOTSUPP
				}
			case verdict:
				if errno := visit(e.chain); errno != 0 {
					return errno
				}
			case vmapLookup:
				for _, v := range t.sets[e.set].elems {
					if errno := visit(v.verdict.chain); errno != 0 {
						return errno
					}
				}
			}
		}
	}
	return 0
}

// dump renders the table canonically: chains and sets by name, elements
// sorted, for comparing two kernels.
func (k *fakeKernel) dump() string {
	if k.table == nil {
		return "(no table)"
	}
	var b strings.Builder
	for _, n := range slices.Sorted(maps.Keys(k.table.sets)) {
		s := k.table.sets[n]
		fmt.Fprintf(&b, "set %s { %s }\n", n, strings.Join(s.def.declaration(k.family), "; "))
		var els []string
		for _, v := range s.elems {
			els = append(els, s.def.elemText(v))
		}
		slices.Sort(els)
		for _, e := range els {
			b.WriteString("  " + e + "\n")
		}
	}
	for _, n := range slices.Sorted(maps.Keys(k.table.chains)) {
		c := k.table.chains[n]
		b.WriteString("chain " + n)
		if c.hook != nil {
			b.WriteString(" { " + c.hook.text() + " }")
		}
		b.WriteString("\n")
		for _, r := range c.rules {
			b.WriteString("  " + r.String(k.family) + "\n")
		}
	}
	return b.String()
}

// ---- Packet tracer -------------------------------------------------------

// tracer walks a packet through a fake kernel's table the way netfilter
// would: the base chains of each hook in priority order, the routing
// decision between prerouting and input or forward, postrouting last. It
// follows every branch a numgen match could take, like kube-proxy's
// tracePacket.
type tracer struct {
	tb    testing.TB
	f     dataplane.Family
	table *fakeTable
	// local are the node's addresses (fib type local).
	local []netip.Addr
	// affinity holds the sources in each affinity set.
	affinity map[string][]string
}

func newTracer(tb testing.TB, k *fakeKernel, local ...string) *tracer {
	tb.Helper()
	tr := &tracer{tb: tb, f: k.family, table: k.table, affinity: map[string][]string{}}
	for _, a := range local {
		tr.local = append(tr.local, netip.MustParseAddr(a))
	}
	if tr.table == nil {
		tb.Fatal("trace: no table")
	}
	return tr
}

type pktState struct {
	src, dst netip.Addr
	dport    uint16
	proto    uint8
	mark     uint32
	dnat     string
	masq     bool
	verdict  string // "" while undecided; ACCEPT ends a base chain
}

var protoNumbers = map[string]uint8{"tcp": protoTCP, "udp": protoUDP, "sctp": protoSCTP}

// trace returns every outcome the flow can have, deduplicated and sorted.
func (tr *tracer) trace(f dptest.Flow) []dptest.Outcome {
	tr.tb.Helper()
	s := pktState{src: netip.MustParseAddr(f.Src), dst: netip.MustParseAddr(f.Dst), dport: uint16(f.DPort), proto: protoNumbers[f.Proto]}
	var states []pktState
	if f.FromNode {
		states = tr.hook("output", []pktState{s})
		states = tr.hook("postrouting", states)
	} else {
		states = tr.hook("prerouting", []pktState{s})
		var in, fwd []pktState
		for _, st := range states {
			if st.verdict == "" && slices.Contains(tr.local, st.dst) {
				in = append(in, st)
			} else {
				fwd = append(fwd, st)
			}
		}
		states = append(tr.hook("input", in), tr.hook("postrouting", tr.hook("forward", fwd))...)
	}
	var outs []dptest.Outcome
	for _, st := range states {
		v := st.verdict
		if v == "" {
			v = "ACCEPT"
		}
		outs = append(outs, dptest.Outcome{DNAT: st.dnat, Verdict: v, Masq: st.masq})
	}
	return dptest.SortOutcomes(outs)
}

// hook runs the live states through the base chains of hook by priority.
// A state leaves with verdict "" (accepted, go on) or DROP/REJECT.
func (tr *tracer) hook(hook string, in []pktState) []pktState {
	var bases []string
	for n, c := range tr.table.chains {
		if c.hook != nil && c.hook.hook == hook {
			bases = append(bases, n)
		}
	}
	slices.SortFunc(bases, func(a, b string) int { return tr.table.chains[a].hook.priority - tr.table.chains[b].hook.priority })
	states := in
	for _, n := range bases {
		var next []pktState
		for _, s := range states {
			if s.verdict != "" {
				next = append(next, s)
				continue
			}
			for _, out := range tr.chain(n, s, 0) {
				if out.verdict == "ACCEPT" {
					out.verdict = ""
				}
				next = append(next, out)
			}
		}
		states = next
	}
	return states
}

// chain evaluates chain and returns the states in which the packet leaves
// it: with a verdict, or with verdict "" (fell off the end or returned)
// to continue in the caller.
func (tr *tracer) chain(name string, s pktState, depth int) []pktState {
	if depth > 20 {
		tr.tb.Fatalf("trace: chain depth exceeded at %s", name)
	}
	c, ok := tr.table.chains[name]
	if !ok {
		tr.tb.Fatalf("trace: no chain %s", name)
	}
	var done []pktState
	live := []pktState{s}
	for _, r := range c.rules {
		var next []pktState
		for _, st := range live {
			for _, br := range tr.rule(r, st, depth) {
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

// Branch kinds of an expression's evaluation.
const (
	noMatch  = iota // the rule stops; the packet goes on to the next rule
	goOn            // next expression of the rule
	terminal        // the packet leaves the chain with a verdict
)

type branch struct {
	s    pktState
	kind int
}

// rule applies one rule and returns the resulting states: verdict "" to
// go on with the next rule, or a verdict (RETURN included).
func (tr *tracer) rule(r rule, s pktState, depth int) []pktState {
	var out []pktState
	live := []pktState{s}
	for _, e := range r.exprs {
		var next []pktState
		for _, st := range live {
			for _, b := range tr.expr(e, st, depth) {
				switch b.kind {
				case noMatch:
					out = append(out, st)
				case goOn:
					next = append(next, b.s)
				case terminal:
					out = append(out, b.s)
				}
			}
		}
		live = next
	}
	return append(out, live...)
}

func (tr *tracer) expr(e rexpr, s pktState, depth int) []branch {
	test := func(ok bool) []branch {
		if ok {
			return []branch{{s, goOn}}
		}
		return []branch{{s, noMatch}}
	}
	switch e := e.(type) {
	case addrMatch:
		a := s.dst
		if e.src {
			a = s.src
		}
		return test(e.p.Contains(a) != e.neg)
	case protoMatch:
		return test(s.proto == e.proto)
	case dportMatch:
		return test(s.proto == e.proto && s.dport == e.port)
	case fibLocal:
		a := s.dst
		if e.src {
			a = s.src
		}
		return test(slices.Contains(tr.local, a))
	case ctState:
		return test(true) // every traced packet opens a connection
	case markClear:
		return test(s.mark&e.mark == 0)
	case markSet:
		if e.xor {
			s.mark ^= e.mark
		} else {
			s.mark |= e.mark
		}
		return []branch{{s, goOn}}
	case setMatch:
		a := s.dst
		if e.src {
			a = s.src
		}
		if slices.Contains(tr.affinity[e.set], a.String()) {
			return test(true)
		}
		set, ok := tr.table.sets[e.set]
		if !ok {
			tr.tb.Fatalf("trace: no set %s", e.set)
		}
		_, in := set.elems[elemKey{addr: a}]
		return test(in)
	case setUpdate:
		return []branch{{s, goOn}}
	case numgenZero:
		if e.mod == 1 {
			return test(true)
		}
		return []branch{{s, goOn}, {s, noMatch}}
	case vmapLookup:
		key := elemKey{proto: s.proto, port: s.dport}
		if e.withAddr {
			key.addr = s.dst
		}
		v, ok := tr.table.sets[e.set].elems[key]
		if !ok {
			return test(false)
		}
		return tr.verdict(v.verdict, s, depth)
	case hairpinMatch:
		_, in := tr.table.sets[e.set].elems[elemKey{addr: s.src, proto: s.proto, port: s.dport}]
		return test(s.dnat != "" && s.src == s.dst && in)
	case dnatMap:
		// Every index numgen can draw; one the map lacks ends the rule.
		var out []branch
		for i := range e.mod {
			v, ok := tr.table.sets[e.set].elems[elemKey{index: i}]
			if !ok {
				out = append(out, branch{s, noMatch})
				continue
			}
			d := s
			d.dst, d.dport, d.dnat, d.verdict = v.endpoint.Addr(), v.endpoint.Port(), v.endpoint.String(), "ACCEPT"
			out = append(out, branch{d, terminal})
		}
		return out
	case dnatTo:
		s.dst, s.dport, s.dnat, s.verdict = e.addr, e.port, netip.AddrPortFrom(e.addr, e.port).String(), "ACCEPT"
		return []branch{{s, terminal}}
	case masquerade:
		s.masq, s.verdict = true, "ACCEPT"
		return []branch{{s, terminal}}
	case reject:
		s.verdict = "REJECT"
		return []branch{{s, terminal}}
	case verdict:
		return tr.verdict(e, s, depth)
	}
	tr.tb.Fatalf("trace: unsupported expression %T", e)
	return nil
}

func (tr *tracer) verdict(v verdict, s pktState, depth int) []branch {
	switch v.kind {
	case verdictAccept:
		s.verdict = "ACCEPT"
	case verdictDrop:
		s.verdict = "DROP"
	case verdictReturn:
		s.verdict = "RETURN"
	case verdictJump, verdictGoto:
		var out []branch
		for _, r := range tr.chain(v.chain, s, depth+1) {
			switch {
			case r.verdict != "":
				out = append(out, branch{r, terminal})
			case v.kind == verdictJump:
				out = append(out, branch{r, goOn})
			default:
				// The end of a goto's chain returns from the caller.
				r.verdict = "RETURN"
				out = append(out, branch{r, terminal})
			}
		}
		return out
	}
	return []branch{{s, terminal}}
}
