package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// params is everything rendering needs besides the table, resolved from
// Config and the table's NodeInfo at each sync.
type params struct {
	family        dataplane.Family
	mark          string // the masquerade bit as a mark value, "0x004000"
	masqueradeAll bool
	// localCIDR is the pod CIDR of the family; "" when pod traffic cannot
	// be recognised (LocalNone, or NodeCIDR without a pod CIDR).
	localCIDR     string
	nodePortAll   bool     // NodePorts on every local address (but loopback unless localhostNodePorts)
	nodePortCIDRs []string // else on the local addresses in these
	// localhostNodePorts: NodePorts answer on 127.0.0.0/8 too, with
	// route_localnet and the anti-martian rule (IPv4 only).
	localhostNodePorts bool
	nodeIPs            []netip.Addr
	dropInvalid        bool
	randomFully        bool
	// backend shapes the input where the tools differ in speed.
	backend xtables.Backend
}

// nftCacheAllChains is the number of chains in one nat input above which
// the nft input starts with "-S" (see assemble): below it the sorted-list
// cost is a few milliseconds, less than listing the table.
const nftCacheAllChains = 500

func newParams(c *Config, node *pb.NodeInfo) params {
	set := &c.Settings
	p := params{
		family:        c.Family,
		mark:          fmt.Sprintf("%#08x", uint32(1)<<uint(c.MasqueradeBit)),
		masqueradeAll: c.MasqueradeAll,
		nodeIPs:       set.PrimaryIPs(node),
		dropInvalid:   !c.ConntrackTCPBeLiberal,
		randomFully:   !c.NoRandomFully,
	}
	if cidr := set.LocalCIDR(node); cidr.IsValid() {
		p.localCIDR = cidr.String()
	}
	all, cidrs := set.NodePorts(p.nodeIPs)
	p.nodePortAll, p.nodePortCIDRs = all, strs(cidrs)
	p.localhostNodePorts = set.LocalhostNodePortsOn(p.nodeIPs)
	return p
}

// fingerprint identifies everything in p that rules depend on; a change
// (the node's pod CIDR in NodeCIDR mode) makes the Driver's next sync a
// full one.
func (p *params) fingerprint() string { return fmt.Sprintf("%+v", *p) }

// largeClusterEndpoints is kube-proxy's threshold above which per-endpoint
// rules carry no comments: they make the restore input about 40% larger
// and iptables-restore proportionally slower.
const largeClusterEndpoints = 1000

// programmed is what a successful restore left in the kernel: the input a
// partial sync needs to know what to rewrite and what to delete.
type programmed struct {
	large    bool // comments left out of per-endpoint rules
	services map[string]*serviceState
	// natRules and filterRules count the rules we own in each table
	// (the jumps from the built-in chains aside, as kube-proxy counts).
	natRules, filterRules int
}

// serviceState is what one Service wrote.
type serviceState struct {
	// chains names its nat chains, in the order written, each followed
	// by a newline (see chainNames): one string rather than a slice of
	// them, as the state holds every chain of the table (250,000 at
	// 250,000 endpoints), and a string each costs twice the memory.
	chains string
	hash   uint64 // of its chains' declarations and rules
	// Its lines in the dispatch chains (nat PP-SERVICES and PP-NODEPORTS)
	// and in the filter table, reused verbatim by partial syncs that do
	// not touch the Service.
	dispatch, filter           []byte
	dispatchLines, filterLines int
	// natLines is the number of rules in its own chains.
	natLines int
}

// chainNames yields the names of s's chains, in the order written.
func (s *serviceState) chainNames() iter.Seq[string] {
	return func(yield func(string) bool) {
		for rest := s.chains; rest != ""; {
			name, after, _ := strings.Cut(rest, "\n")
			if !yield(name) {
				return
			}
			rest = after
		}
	}
}

// hasChain reports whether c is one of s's chains.
func (s *serviceState) hasChain(c string) bool {
	for name := range s.chainNames() {
		if name == c {
			return true
		}
	}
	return false
}

// sameChains reports whether s's chains are names, in order.
func (s *serviceState) sameChains(names []string) bool {
	i := 0
	for c := range s.chainNames() {
		if i == len(names) || names[i] != c {
			return false
		}
		i++
	}
	return i == len(names)
}

// rules returns how many rules s owns in nat and filter; none for nil.
func (s *serviceState) rules() (nat, filter int) {
	if s == nil {
		return 0, 0
	}
	return s.dispatchLines + s.natLines, s.filterLines
}

// renderInput is what one sync renders.
type renderInput struct {
	table  *proxytable.Table
	params params
	full   bool
	// changed are the keys to rewrite in a partial sync.
	changed []string
	// prev is the state in the kernel; required for partial syncs. A
	// full sync uses it (when set) only to find stale chains.
	prev *programmed
	// refreshJumps re-asserts the jumps from the built-in chains inside
	// the restore (full syncs once they are known to be installed).
	refreshJumps bool
	// existing lists more service chains that may be in the kernel, for a
	// full sync to delete unless it keeps them: those iptables-save found
	// when prev is unknown, and those a failed restore may have created.
	// Deleting a chain that is not there is harmless: its declaration
	// creates it just before the -X.
	existing []string
}

// ruleset is one sync's restore input and the state it leaves once
// applied. newRuleset plans it: it renders every Service it writes once,
// keeping only what the state needs (chain names, dispatch and filter
// lines, a hash of the rest) and what the input's shape needs (which
// Services, how many lines). WriteTo then writes the input, rendering
// the Services' chains again one at a time, so that the input (over 70
// MB at 250,000 endpoints) is never whole in memory: it goes to
// iptables-restore as it is written.
type ruleset struct {
	in   *renderInput
	r    *renderer
	keys []string // the table's, sorted
	// next is the state after a successful restore. For a partial sync it
	// shares unchanged services with the input's prev.
	next *programmed
	// written are the Services whose chains the input declares and
	// fills, in key order.
	written []string
	// chainDecls and natRuleLines count the declarations and rules of
	// written's chains.
	chainDecls, natRuleLines int
	// stale chains deleted by this input.
	stale []string
	// dispatchEdits are a partial sync's in-place edits of the dispatch
	// chains.
	dispatchEdits lineBuffer
	// top (PP-POSTROUTING, PP-MARK-MASQ), nodePortJumps (the end of nat
	// PP-SERVICES) and filterTail (PP-FORWARD, PP-LOCALNET) are the lines
	// of no Service, when the input writes them.
	top, nodePortJumps, filterTail lineBuffer
	// wroteDispatch and wroteFilter say whether the input rewrites the
	// dispatch chains and the filter table whole.
	wroteDispatch, wroteFilter bool
	// natEmpty says the input has nothing for the nat table.
	natEmpty bool
	// dispatchInserts counts the rules dispatchEdits adds.
	dispatchInserts int
	// natWritten and filterWritten count the rules the input adds to
	// each table, the jumps from the built-in chains aside.
	natWritten, filterWritten int
}

// counts returns the rules of rs per table, for the
// sync_proxy_rules_iptables metrics.
func (rs *ruleset) counts() []dataplane.TableRules {
	return []dataplane.TableRules{
		{Table: "nat", Total: rs.next.natRules, Written: rs.natWritten},
		{Table: "filter", Total: rs.next.filterRules, Written: rs.filterWritten},
	}
}

// empty reports whether the input has nothing for either table.
func (rs *ruleset) empty() bool { return rs.natEmpty && !rs.wroteFilter }

// newRuleset plans the iptables-restore input for in (see ruleset). It
// is pure: no I/O, no goroutines, the same input gives the same bytes.
func newRuleset(in *renderInput) *ruleset {
	r := &renderer{p: &in.params}
	keys := in.table.Keys()
	next := &programmed{services: make(map[string]*serviceState, len(keys))}
	rs := &ruleset{in: in, r: r, keys: keys, next: next}
	// write records a Service whose chains the input writes.
	write := func(k string, st *serviceState) {
		rs.written = append(rs.written, k)
		rs.chainDecls += strings.Count(st.chains, "\n")
		rs.natRuleLines += st.natLines
	}
	changed := map[string]bool{}
	if in.full {
		next.large = largeCluster(in.table, keys, in.params.family)
		r.large = next.large
		rs.written = make([]string, 0, len(keys))
		var prev map[string]*serviceState
		if in.prev != nil {
			prev = in.prev.services
		}
		for _, k := range keys {
			if plan, ok := planService(in.table.Entries[k], in.params.family); ok {
				st := r.service(plan, prev[k])
				next.services[k] = st
				write(k, st)
			}
		}
	} else {
		next.large, r.large = in.prev.large, in.prev.large
		// Updated below by the changed Services' difference.
		next.natRules, next.filterRules = in.prev.natRules, in.prev.filterRules
		for _, k := range in.changed {
			changed[k] = true
		}
		for _, k := range keys {
			prev := in.prev.services[k]
			if !changed[k] {
				if prev != nil {
					next.services[k] = prev
				}
				continue
			}
			if e := in.table.Entries[k]; e != nil {
				if plan, ok := planService(e, in.params.family); ok {
					st := r.service(plan, prev)
					next.services[k] = st
					// Same chains, same rules: nothing to rewrite.
					if prev == nil || prev.hash != st.hash {
						write(k, st)
					}
				}
			}
		}
	}
	rs.stale = staleChains(in, next, changed)

	// Dispatch chains: rewritten whole by full syncs. Partial syncs edit
	// them in place instead, deleting the changed Services' old lines and
	// inserting their new ones: rewriting 10k-rule chains would make
	// every added or removed Service cost seconds (iptables-nft looks up
	// each jump target), and an endpoint change (the common case) does
	// not touch them at all. Rules of different Services match disjoint
	// destinations, so their order does not matter, except that the
	// NodePort jump stays last: new PP-SERVICES lines go to the top.
	// The filter table is small and jump-free: rewritten whole when a
	// changed Service's lines in it changed.
	rs.wroteDispatch, rs.wroteFilter = in.full, in.full
	if !in.full {
		for _, k := range slices.Sorted(maps.Keys(changed)) {
			prev, cur := in.prev.services[k], next.services[k]
			if prev == cur {
				continue
			}
			oldNat, oldFilter := prev.rules()
			newNat, newFilter := cur.rules()
			next.natRules += newNat - oldNat
			next.filterRules += newFilter - oldFilter
			var oldD, newD, oldF, newF []byte
			if prev != nil {
				oldD, oldF = prev.dispatch, prev.filter
			}
			if cur != nil {
				newD, newF = cur.dispatch, cur.filter
			}
			rs.wroteFilter = rs.wroteFilter || !bytes.Equal(oldF, newF)
			if bytes.Equal(oldD, newD) {
				continue
			}
			rs.dispatchEdits.owner(k)
			for _, line := range lines(oldD) {
				rs.dispatchEdits.write("-D", line[len("-A "):])
			}
			for _, line := range lines(newD) {
				if rest, ok := strings.CutPrefix(line, "-A "+chainServices+" "); ok {
					rs.dispatchEdits.write("-I", chainServices, "1", rest)
				} else {
					rs.dispatchEdits.write(line)
				}
				rs.dispatchInserts++
			}
		}
	}
	rs.fixedLines()
	rs.count()
	return rs
}

// largeCluster tells whether the table has more endpoints (per-endpoint
// chains) of the family than largeClusterEndpoints. It plans Services
// only until the count passes the threshold, so it costs little more
// than planning a thousand endpoints, and it counts what rendering
// them writes.
func largeCluster(t *proxytable.Table, keys []string, family dataplane.Family) bool {
	total := 0
	for _, k := range keys {
		if plan, ok := planService(t.Entries[k], family); ok {
			for i := range plan.ports {
				total += len(plan.ports[i].allEps)
			}
			if total > largeClusterEndpoints {
				return true
			}
		}
	}
	return false
}

// staleChains returns the service chains the input deletes, sorted:
// those that were there (prev's, in.existing) and next does not use.
// Chain names hash the service port's name, so a chain of one Service
// is never another's: prev's are compared Service by Service, and only
// in.existing (no Service known) against every chain of next.
func staleChains(in *renderInput, next *programmed, changed map[string]bool) []string {
	var stale []string
	// gone appends prev's chains that cur does not have.
	gone := func(prev, cur *serviceState) {
		if prev == nil || prev == cur || cur != nil && prev.chains == cur.chains {
			return
		}
		for c := range prev.chainNames() {
			if cur == nil || !cur.hasChain(c) {
				stale = append(stale, c)
			}
		}
	}
	if in.full {
		if in.prev != nil {
			for k, prev := range in.prev.services {
				gone(prev, next.services[k])
			}
		}
		if len(in.existing) > 0 {
			left := make(map[string]bool, len(in.existing))
			for _, c := range in.existing {
				left[c] = true
			}
			for _, s := range next.services {
				for c := range s.chainNames() {
					delete(left, c)
				}
			}
			for _, c := range in.existing {
				if left[c] {
					stale = append(stale, c)
				}
			}
		}
	} else {
		for k := range changed {
			gone(in.prev.services[k], next.services[k])
		}
	}
	stale = slices.DeleteFunc(stale, func(c string) bool { return !isServiceChain(c) })
	slices.Sort(stale)
	return slices.Compact(stale)
}

// fixedLines renders the lines of no Service that the input writes.
func (rs *ruleset) fixedLines() {
	p := rs.r.p
	if rs.in.full {
		top := &rs.top
		// Clear the mark so that a packet that traverses the stack again
		// (a tunnel, a bridge) is not masqueraded twice.
		top.write("-A", chainPostrouting, "-m", "mark", "!", "--mark", p.mark+"/"+p.mark, "-j", "RETURN")
		top.write("-A", chainPostrouting, "-j", "MARK", "--xor-mark", p.mark)
		masq := []string{"-A", chainPostrouting, "-m", "comment", "--comment", `"proxyplane service traffic requiring SNAT"`, "-j", "MASQUERADE"}
		if p.randomFully {
			masq = append(masq, "--random-fully")
		}
		top.write(masq...)
		top.write("-A", chainMarkMasq, "-j", "MARK", "--or-mark", p.mark)
	}
	if rs.wroteDispatch {
		rs.r.nodePortJumps(&rs.nodePortJumps)
	}
	if rs.wroteFilter {
		f := &rs.filterTail
		if p.dropInvalid {
			// Out-of-window packets conntrack marks INVALID would be
			// forwarded un-NATed and reset the connection (kubernetes
			// #74839); drop them unless the node is liberal.
			f.write("-A", chainForward, "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
		}
		// Accept service traffic even when FORWARD's policy is DROP.
		f.write("-A", chainForward, "-m", "comment", "--comment", `"proxyplane forwarding rules"`,
			"-m", "mark", "--mark", p.mark+"/"+p.mark, "-j", "ACCEPT")
		f.write("-A", chainForward, "-m", "comment", "--comment", `"proxyplane forwarding conntrack rule"`,
			"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
		if p.localhostNodePorts {
			// route_localnet lets packets to 127.0.0.0/8 in from any
			// interface (kubernetes#90259): drop those that come from
			// outside the node, except replies and the DNATed NodePort
			// connections themselves, as kube-proxy's (and kubelet's)
			// KUBE-FIREWALL rule, word for word.
			f.write("-A", chainLocalnet, "-m", "comment", "--comment", `"block incoming localnet connections"`,
				"-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8",
				"-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP")
		}
	}
}

// count counts the rules the input writes to each table, and whether
// it writes anything to nat, as write will write them.
func (rs *ruleset) count() {
	in := rs.in
	rs.natWritten = rs.top.lines + rs.dispatchInserts + rs.natRuleLines
	if rs.wroteDispatch {
		for _, s := range rs.next.services {
			rs.natWritten += s.dispatchLines
		}
		rs.natWritten += rs.nodePortJumps.lines
	}
	if rs.wroteFilter {
		for _, s := range rs.next.services {
			rs.filterWritten += s.filterLines
		}
		rs.filterWritten += rs.filterTail.lines
	}
	if in.full {
		rs.next.natRules, rs.next.filterRules = rs.natWritten, rs.filterWritten
	}
	// Every part of the nat input below is there only under one of
	// these; jumpsFor always holds nat jumps.
	rs.natEmpty = !in.full && !rs.wroteDispatch && len(rs.written) == 0 && len(rs.stale) == 0 &&
		rs.dispatchEdits.lines == 0 && !in.refreshJumps
}

// WriteTo writes the restore input to w: nat first, so that a nat failure
// leaves both tables as they were (each table commits on its own; filter
// rules reference no nat chain, so new nat with old filter is the only
// mixed state, and it only happens if the small filter table fails). It
// renders the written Services' chains again, one at a time, and fails
// if one renders differently from what newRuleset planned (which would
// make the state wrong). It may be called more than once.
func (rs *ruleset) WriteTo(w io.Writer) (int64, error) {
	out := newRestoreWriter(w, 0)
	rs.write(out)
	return out.finish()
}

// locate returns the owner (a Service key, ownerJumps or "") and the text
// of the input's line (1-based), by writing the input again; ok is false
// when the input has no such line.
func (rs *ruleset) locate(line int) (owner, text string, ok bool) {
	out := newRestoreWriter(io.Discard, line)
	rs.write(out)
	return out.foundKey, out.foundText, out.found
}

// errRenderChanged says a Service rendered differently when written than
// when planned: a bug, or a table changed during the sync.
var errRenderChanged = errors.New("a service's rules rendered differently when written than when planned")

func (rs *ruleset) write(out *restoreWriter) {
	if rs.empty() {
		return
	}
	in, p := rs.in, rs.r.p
	if !rs.natEmpty {
		out.raw("*nat")
		if p.backend == xtables.BackendNFT && rs.chainDecls+len(rs.stale) > nftCacheAllChains {
			// iptables-nft-restore --noflush (1.8.x) records every chain a
			// command names in a sorted list, inserting by linear search:
			// quadratic in the chains of the input (10k services: minutes).
			// One command naming no chain makes it cache all chains instead
			// and skip that list; "-S" is the harmless one (it lists the nat
			// table as it was to stdout, which the runner discards). Small
			// partial syncs do without: listing would cost more than it saves.
			out.raw("-S")
		}
		if rs.wroteDispatch {
			out.raw(chainLine(chainServices))
			out.raw(chainLine(chainNodePorts))
		}
		if in.full {
			out.raw(chainLine(chainPostrouting))
			out.raw(chainLine(chainMarkMasq))
		}
		for _, k := range rs.written {
			for c := range rs.next.services[k].chainNames() {
				out.chainDecl(k, c)
			}
		}
		for _, c := range rs.stale {
			// Declaring a chain in a --noflush restore flushes it, so it
			// drops its references before -X deletes it.
			out.raw(chainLine(c))
		}
		out.add(&rs.top)
		if rs.wroteDispatch {
			for _, k := range rs.keys {
				if s := rs.next.services[k]; s != nil && s.dispatchLines > 0 {
					out.owned(k, s.dispatch, s.dispatchLines)
				}
			}
			out.add(&rs.nodePortJumps)
		}
		out.add(&rs.dispatchEdits)
		rs.writeChains(out)
		for _, c := range rs.stale {
			out.raw("-X " + c)
		}
		if in.refreshJumps {
			writeJumps(out, "nat", jumpsFor(p.localhostNodePorts))
		}
		out.raw("COMMIT")
	}

	if rs.wroteFilter {
		out.raw("*filter")
		for _, c := range [...]string{chainServices, chainExternalServices, chainForward, chainNodePorts, chainFirewall} {
			out.raw(chainLine(c))
		}
		if p.localhostNodePorts {
			out.raw(chainLine(chainLocalnet))
		}
		for _, k := range rs.keys {
			if s := rs.next.services[k]; s != nil && s.filterLines > 0 {
				out.owned(k, s.filter, s.filterLines)
			}
		}
		out.add(&rs.filterTail)
		if in.refreshJumps {
			writeJumps(out, "filter", jumpsFor(p.localhostNodePorts))
		}
		out.raw("COMMIT")
	}
}

// writeChains writes the rules of written's chains, rendering each
// Service again.
func (rs *ruleset) writeChains(out *restoreWriter) {
	r := rs.r
	for _, k := range rs.written {
		if out.err != nil {
			return
		}
		st := rs.next.services[k]
		plan, ok := planService(rs.in.table.Entries[k], rs.in.params.family)
		if !ok {
			out.fail(fmt.Errorf("%s: %w", k, errRenderChanged))
			return
		}
		r.natRules.truncate(bufMark{})
		r.natRules.owner(k)
		if hash, lines := r.chains(plan); hash != st.hash || lines != st.natLines {
			out.fail(fmt.Errorf("%s: %w", k, errRenderChanged))
			return
		}
		out.add(&r.natRules)
	}
}

// ownerJumps owns the jump lines of an input, so that a restore failing on
// one is recognised (see engine.full).
const ownerJumps = "\x00jumps"

// writeJumps re-asserts the jumps of table inside the restore: each is
// deleted and inserted again at the top, which costs nothing next to a
// full restore, keeps them first in their built-in chain, and is atomic
// with the rest. It requires the jumps to be there: the -D fails the
// restore otherwise (someone flushed a built-in chain), and the
// engine then installs them one by one and retries.
func writeJumps(out *restoreWriter, table string, jumps []xtables.Jump) {
	l := &lineBuffer{}
	l.owner(ownerJumps)
	for _, j := range jumps {
		if j.Table != table {
			continue
		}
		rule := strings.Join(quoteRestore(j.Rule()), " ")
		l.write("-D", j.From, rule)
		l.write("-I", j.From, "1", rule)
	}
	out.add(l)
}

// quoteRestore quotes arguments holding spaces for iptables-restore.
func quoteRestore(args []string) []string {
	out := make([]string, len(args))
	for i, arg := range args {
		if strings.ContainsRune(arg, ' ') {
			arg = `"` + arg + `"`
		}
		out[i] = arg
	}
	return out
}

func chainLine(c string) string { return ":" + c + " - [0:0]" }

// lines splits b into its lines, without newlines.
func lines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// renderer writes Services' rules.
type renderer struct {
	p     *params
	large bool
	// Scratch buffers for one Service: natChains declares its chains,
	// natRules fills them; dispatch and filter hold its lines in the
	// dispatch chains and the filter table; chains names its chains.
	natChains, natRules lineBuffer
	dispatch, filter    lineBuffer
	chainNames          []string
}

// service renders plan and returns what the state keeps of it: its lines
// in the dispatch chains and the filter table, the names of its chains
// and a hash of their declarations and rules, which are not kept (the
// input renders them again as it is written). That is prev, the
// Service's state in the kernel (nil for none), when nothing of it
// changed: a full sync over the table in force then holds one state,
// not two.
func (r *renderer) service(plan *svcPlan, prev *serviceState) *serviceState {
	r.dispatch.truncate(bufMark{})
	r.filter.truncate(bufMark{})
	for i := range plan.ports {
		r.portDispatch(plan, &plan.ports[i])
	}
	if plan.HealthCheckNodePort != 0 {
		// The health check server answers whether or not there are local
		// endpoints; the port must be open whatever the node's INPUT
		// policy.
		r.filter.write("-A", chainNodePorts, "-m", "comment", "--comment", `"`+commentText(plan.Key)+` health check node port"`,
			"-m", "tcp", "-p", "tcp", "--dport", itoa(plan.HealthCheckNodePort), "-j", "ACCEPT")
	}
	r.natRules.truncate(bufMark{})
	// Counted whether or not a partial sync writes the chains:
	// kube-proxy's total includes the rules of chains a partial sync
	// leaves alone.
	hash, natLines := r.chains(plan)
	if prev != nil && prev.hash == hash && prev.natLines == natLines &&
		bytes.Equal(prev.dispatch, r.dispatch.b) && prev.dispatchLines == r.dispatch.lines &&
		bytes.Equal(prev.filter, r.filter.b) && prev.filterLines == r.filter.lines &&
		prev.sameChains(r.chainNames) {
		return prev
	}
	st := &serviceState{hash: hash, natLines: natLines}
	st.dispatch, st.dispatchLines = bytes.Clone(r.dispatch.b), r.dispatch.lines
	st.filter, st.filterLines = bytes.Clone(r.filter.b), r.filter.lines
	size := 0
	for _, c := range r.chainNames {
		size += len(c) + 1
	}
	var b strings.Builder
	b.Grow(size)
	for _, c := range r.chainNames {
		b.WriteString(c)
		b.WriteByte('\n')
	}
	st.chains = b.String()
	return st
}

// chains renders plan's own chains: their declarations into natChains
// (reset first) and their names into chainNames, their rules appended to
// natRules. It returns the hash of the declarations and rules, and the
// number of rules.
func (r *renderer) chains(plan *svcPlan) (hash uint64, rules int) {
	r.natChains.truncate(bufMark{})
	rm := r.natRules.mark()
	r.chainNames = r.chainNames[:0]
	for i := range plan.ports {
		r.chainNames = r.portChains(plan, &plan.ports[i], r.chainNames)
	}
	d := xxhash.New()
	_, _ = d.Write(r.natChains.b)
	_, _ = d.Write(r.natRules.since(rm))
	return d.Sum64(), r.natRules.lines - rm.lines
}

// portDispatch writes the port's rules in the dispatch chains (nat
// PP-SERVICES and PP-NODEPORTS) and in the filter table.
func (r *renderer) portDispatch(plan *svcPlan, pp *portPlan) {
	d, f := &r.dispatch, &r.filter
	proto := []string{"-m", pp.proto, "-p", pp.proto}

	internalFilter, externalFilter, internalComment, externalComment := "", "", "", ""
	if !pp.HasEndpoints {
		// No endpoint anywhere: reject, so clients fail fast.
		internalFilter, externalFilter = "REJECT", "REJECT"
		internalComment = `"` + pp.Name + ` has no endpoints"`
		externalComment = internalComment
	} else {
		// Endpoints exist but not on this node (policy Local): drop, so
		// the client retries or the load balancer's health check moves
		// traffic elsewhere, rather than seeing the service as down.
		if !pp.HasInternalEndpoints {
			internalFilter, internalComment = "DROP", `"`+pp.Name+` has no local endpoints"`
		}
		if !pp.HasExternalEndpoints {
			externalFilter, externalComment = "DROP", `"`+pp.Name+` has no local endpoints"`
		}
	}

	if pp.HasInternalEndpoints {
		d.writeN([]string{"-A", chainServices, "-m", "comment", "--comment", `"` + pp.Name + ` cluster IP"`}, proto,
			[]string{"-d", plan.clusterIP, "--dport", pp.port, "-j", pp.internalChain})
	} else {
		f.writeN([]string{"-A", chainServices, "-m", "comment", "--comment", internalComment}, proto,
			[]string{"-d", plan.clusterIP, "--dport", pp.port, "-j", internalFilter})
	}

	for _, ip := range plan.externalIPs {
		if pp.HasEndpoints {
			d.writeN([]string{"-A", chainServices, "-m", "comment", "--comment", `"` + pp.Name + ` external IP"`}, proto,
				[]string{"-d", ip, "--dport", pp.port, "-j", pp.extChain})
		}
		if !pp.HasExternalEndpoints {
			// Traffic the EXT chain did not short-circuit ends here.
			f.writeN([]string{"-A", chainExternalServices, "-m", "comment", "--comment", externalComment}, proto,
				[]string{"-d", ip, "--dport", pp.port, "-j", externalFilter})
		}
	}

	lbTarget := pp.extChain
	if pp.UsesFirewall {
		lbTarget = pp.fwChain
	}
	for _, ip := range plan.lbIPs {
		if pp.HasEndpoints {
			d.writeN([]string{"-A", chainServices, "-m", "comment", "--comment", `"` + pp.Name + ` loadbalancer IP"`}, proto,
				[]string{"-d", ip, "--dport", pp.port, "-j", lbTarget})
		}
		if pp.UsesFirewall {
			// A packet the FW chain let through was DNATed and no longer
			// matches; anything else still to the LB IP is dropped.
			f.writeN([]string{"-A", chainFirewall, "-m", "comment", "--comment", `"` + pp.Name + ` traffic not accepted by ` + pp.fwChain + `"`}, proto,
				[]string{"-d", ip, "--dport", pp.port, "-j", "DROP"})
		}
	}
	if !pp.HasExternalEndpoints {
		for _, ip := range plan.lbIPs {
			f.writeN([]string{"-A", chainExternalServices, "-m", "comment", "--comment", externalComment}, proto,
				[]string{"-d", ip, "--dport", pp.port, "-j", externalFilter})
		}
	}

	if pp.nodePort != "" {
		if pp.HasEndpoints {
			// NodePorts are not subject to loadBalancerSourceRanges, as
			// upstream: a load balancer may deliver to them.
			d.writeN([]string{"-A", chainNodePorts, "-m", "comment", "--comment", pp.Name}, proto,
				[]string{"--dport", pp.nodePort, "-j", pp.extChain})
		}
		if !pp.HasExternalEndpoints {
			f.writeN([]string{
				"-A", chainExternalServices, "-m", "comment", "--comment", externalComment,
				"-m", "addrtype", "--dst-type", "LOCAL",
			}, proto,
				[]string{"--dport", pp.nodePort, "-j", externalFilter})
		}
	}
}

// portChains writes the port's own chains and appends their names.
func (r *renderer) portChains(plan *svcPlan, pp *portPlan, chains []string) []string {
	c, w := &r.natChains, &r.natRules
	p := r.p

	// Internal traffic: masquerade what does not come from a local pod,
	// so that replies from an endpoint on another node come back through
	// this node (a ClusterIP route pointed at any node works).
	if pp.HasInternalEndpoints {
		match := []string{
			"-m", "comment", "--comment", `"` + pp.Name + ` cluster IP"`, "-m", pp.proto, "-p", pp.proto,
			"-d", plan.clusterIP, "--dport", pp.port,
		}
		switch {
		case p.masqueradeAll:
			w.writeN([]string{"-A", pp.internalChain}, match, []string{"-j", chainMarkMasq})
		case p.localCIDR != "":
			w.writeN([]string{"-A", pp.internalChain}, match, []string{"!", "-s", p.localCIDR, "-j", chainMarkMasq})
		}
	}

	if pp.UsesExternal {
		c.write(chainLine(pp.extChain))
		chains = append(chains, pp.extChain)
		if !plan.ExternalLocal {
			// Endpoints may be on other nodes: masquerade so replies
			// return through this node.
			w.write("-A", pp.extChain, "-m", "comment", "--comment", `"masquerade traffic for `+pp.Name+` external destinations"`,
				"-j", chainMarkMasq)
		} else {
			// Local endpoints only: keep the client's address. Pods and
			// the node itself reaching an external address take the
			// Cluster path, as if they had gone out to the load
			// balancer and come back.
			if p.localCIDR != "" {
				w.write("-A", pp.extChain, "-m", "comment", "--comment", `"pod traffic for `+pp.Name+` external destinations"`,
					"-s", p.localCIDR, "-j", pp.svcChain)
			}
			// The node's own traffic has a local (often the external)
			// source address, which an endpoint could not answer.
			w.write("-A", pp.extChain, "-m", "comment", "--comment", `"masquerade LOCAL traffic for `+pp.Name+` external destinations"`,
				"-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq)
			w.write("-A", pp.extChain, "-m", "comment", "--comment", `"route LOCAL traffic for `+pp.Name+` external destinations"`,
				"-m", "addrtype", "--src-type", "LOCAL", "-j", pp.svcChain)
		}
		if pp.HasExternalEndpoints {
			w.write("-A", pp.extChain, "-j", pp.externalPolicyChain)
		}
	}

	if pp.UsesFirewall {
		c.write(chainLine(pp.fwChain))
		chains = append(chains, pp.fwChain)
		comment := []string{"-A", pp.fwChain, "-m", "comment", "--comment", `"` + pp.Name + ` loadbalancer IP"`}
		allowFromNode := false
		for _, cidr := range plan.sourceRanges {
			w.writeN(comment, []string{"-s", cidr, "-j", pp.extChain})
			pr := netip.MustParsePrefix(cidr) // masked by planService
			for _, ip := range p.nodeIPs {
				allowFromNode = allowFromNode || pr.Contains(ip)
			}
		}
		if allowFromNode {
			// A VIP-style load balancer IP is often local to the node:
			// the node's own requests to it loop back with the LB IP as
			// source and must be let in when the node itself is allowed.
			for _, ip := range plan.lbIPs {
				w.writeN(comment, []string{"-s", ip, "-j", pp.extChain})
			}
		}
		// Falls through un-DNATed; PP-FIREWALL (filter) drops it.
		w.write("-A", pp.fwChain, "-m", "comment", "--comment", `"other traffic to `+pp.Name+` will be dropped by `+chainFirewall+`"`)
	}

	if len(pp.clusterEps) > 0 {
		c.write(chainLine(pp.svcChain))
		chains = append(chains, pp.svcChain)
		r.endpointRules(plan, pp, pp.svcChain, pp.clusterEps)
	}
	if len(pp.localEps) > 0 {
		c.write(chainLine(pp.svlChain))
		chains = append(chains, pp.svlChain)
		r.endpointRules(plan, pp, pp.svlChain, pp.localEps)
	}

	for _, ep := range pp.allEps {
		c.write(chainLine(ep.chain))
		chains = append(chains, ep.chain)
		head := []string{"-A", ep.chain}
		if !r.large {
			head = append(head, "-m", "comment", "--comment", pp.Name)
		}
		// Hairpin: a pod reaching itself through the service must be
		// masqueraded, or it would answer itself directly.
		w.writeN(head, []string{"-s", ep.ip, "-j", chainMarkMasq})
		if plan.affinity != "" {
			head = append(head, "-m", "recent", "--name", ep.chain, "--set")
		}
		w.writeN(head, []string{"-m", pp.proto, "-p", pp.proto, "-j", "DNAT", "--to-destination", ep.ipPort})
	}
	return chains
}

// endpointRules fills a PP-SVC or PP-SVL chain: affinity first (a client
// seen recently goes back to its endpoint), then a random spread where
// rule i of n matches with probability 1/(n-i), which gives each endpoint
// 1/n overall.
func (r *renderer) endpointRules(plan *svcPlan, pp *portPlan, chain string, eps []epPlan) {
	w := &r.natRules
	comment := func(ep epPlan) []string {
		if r.large {
			return nil
		}
		return []string{"-m", "comment", "--comment", `"` + pp.Name + ` -> ` + ep.ipPort + `"`}
	}
	if plan.affinity != "" {
		for _, ep := range eps {
			w.writeN([]string{"-A", chain}, comment(ep),
				[]string{"-m", "recent", "--name", ep.chain, "--rcheck", "--seconds", plan.affinity, "--reap", "-j", ep.chain})
		}
	}
	n := len(eps)
	for i, ep := range eps {
		if i < n-1 {
			w.writeN([]string{"-A", chain}, comment(ep),
				[]string{"-m", "statistic", "--mode", "random", "--probability", probability(n - i), "-j", ep.chain})
			continue
		}
		w.writeN([]string{"-A", chain}, comment(ep), []string{"-j", ep.chain})
	}
}

// nodePortJumps ends nat PP-SERVICES with the jump to PP-NODEPORTS. It
// must be last: a ClusterIP or external IP rule above must win over a
// NodePort that happens to share the port number. addrtype LOCAL matches
// every address of the node, present and future, without listing
// interfaces (and so without a resync when an address appears).
func (r *renderer) nodePortJumps(d *lineBuffer) {
	p := r.p
	comment := []string{"-A", chainServices, "-m", "comment", "--comment", `"proxyplane service nodeports; NOTE: this must be the last rule in this chain"`}
	if p.nodePortAll {
		if p.localhostNodePorts {
			d.writeN(comment, []string{"-m", "addrtype", "--dst-type", "LOCAL", "-j", chainNodePorts})
			return
		}
		// Loopback NodePorts need route_localnet (a security hole,
		// kubernetes#90259) and its anti-martian rule: only with
		// localhostNodePorts, and never on IPv6.
		d.writeN(comment, []string{"-m", "addrtype", "--dst-type", "LOCAL", "!", "-d", p.family.Loopback().String(), "-j", chainNodePorts})
		return
	}
	for _, cidr := range p.nodePortCIDRs {
		// Only the node's own addresses in the CIDR, as kube-proxy's
		// interface lookup gives, without having to watch interfaces.
		d.writeN(comment, []string{"-d", cidr, "-m", "addrtype", "--dst-type", "LOCAL", "-j", chainNodePorts})
	}
}

// probability formats 1/n as kube-proxy does ("%0.10f"), so that rule
// text matches upstream's and iptables-save round-trips it.
func probability(n int) string {
	if n < len(probabilities) {
		return probabilities[n]
	}
	return fmt.Sprintf("%0.10f", 1.0/float64(n))
}

var probabilities = func() []string {
	out := make([]string, 129)
	for n := 1; n < len(out); n++ {
		out[n] = fmt.Sprintf("%0.10f", 1.0/float64(n))
	}
	return out
}()

func itoa(i int32) string { return strconv.Itoa(int(i)) }
