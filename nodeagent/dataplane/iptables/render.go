package iptables

import (
	"bytes"
	"fmt"
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
	chains []string // its nat chains, in the order written
	hash   uint64   // of its chains' declarations and rules
	// Its lines in the dispatch chains (nat PP-SERVICES and PP-NODEPORTS)
	// and in the filter table, reused verbatim by partial syncs that do
	// not touch the Service.
	dispatch, filter           []byte
	dispatchLines, filterLines int
	// natLines is the number of rules in its own chains.
	natLines int
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

// ruleset is rendered restore input and the state it leaves once applied.
type ruleset struct {
	data   []byte
	owners lineOwners
	// next is the state after a successful restore. For a partial sync it
	// shares unchanged services with the input's prev.
	next *programmed
	// stale chains deleted by this input.
	stale []string
	// dispatchEdits are a partial sync's in-place edits of the dispatch
	// chains.
	dispatchEdits lineBuffer
	// wroteDispatch and wroteFilter say whether the input rewrites the
	// dispatch chains and the filter table whole.
	wroteDispatch, wroteFilter bool
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

// render produces the iptables-restore input for in. It is pure: no I/O,
// no goroutines, the same input gives the same bytes.
func render(in *renderInput) *ruleset {
	r := &renderer{p: &in.params}
	keys := in.table.Keys()
	next := &programmed{services: make(map[string]*serviceState, len(keys))}
	changed := map[string]bool{}
	if in.full {
		total := 0
		plans := make([]*svcPlan, 0, len(keys))
		for _, k := range keys {
			if plan, ok := planService(in.table.Entries[k], in.params.family); ok {
				plans = append(plans, plan)
				for i := range plan.ports {
					total += len(plan.ports[i].allEps)
				}
			}
		}
		next.large = total > largeClusterEndpoints
		r.large = next.large
		// Size the buffers once: growing a 14 MB buffer by doubling
		// copies it about twice over.
		r.natRules.b = make([]byte, 0, 200*total+700*len(plans))
		r.natChains.b = make([]byte, 0, 32*(total+2*len(plans)))
		for _, plan := range plans {
			next.services[plan.Key] = r.service(plan, nil)
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
					next.services[k] = r.service(plan, prev)
				}
			}
		}
	}

	rs := &ruleset{next: next}
	// Stale chains: what was there and is not any more.
	active := func(name string) bool { return false }
	var candidates []string
	if in.full {
		activeSet := make(map[string]bool, len(next.services)*4)
		for _, s := range next.services {
			for _, c := range s.chains {
				activeSet[c] = true
			}
		}
		active = func(name string) bool { return activeSet[name] }
		candidates = slices.Clone(in.existing)
		if in.prev != nil {
			for _, s := range in.prev.services {
				candidates = append(candidates, s.chains...)
			}
		}
	} else {
		for k := range changed {
			prev, cur := in.prev.services[k], next.services[k]
			if prev == nil || prev == cur {
				continue
			}
			if cur == nil {
				candidates = append(candidates, prev.chains...)
				continue
			}
			for _, c := range prev.chains {
				if !slices.Contains(cur.chains, c) {
					candidates = append(candidates, c)
				}
			}
		}
	}
	for _, c := range candidates {
		if isServiceChain(c) && !active(c) {
			rs.stale = append(rs.stale, c)
		}
	}
	slices.Sort(rs.stale)
	rs.stale = slices.Compact(rs.stale)

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

	rs.assemble(r, in, keys)
	return rs
}

// assemble writes the restore input: nat first, so that a nat failure
// leaves both tables as they were (each table commits on its own; filter
// rules reference no nat chain, so new nat with old filter is the only
// mixed state, and it only happens if the small filter table fails).
func (rs *ruleset) assemble(r *renderer, in *renderInput, keys []string) {
	p := r.p
	a := &assembler{}
	size := len(r.natChains.b) + len(r.natRules.b) + rs.dispatchEdits.lines*200 + 64*len(rs.stale) + 4096
	for _, s := range rs.next.services {
		if rs.wroteDispatch {
			size += len(s.dispatch)
		}
		if rs.wroteFilter {
			size += len(s.filter)
		}
	}
	a.b = make([]byte, 0, size)
	natStart := a.lines
	a.raw("*nat")
	if p.backend == xtables.BackendNFT && r.natChains.lines+len(rs.stale) > nftCacheAllChains {
		// iptables-nft-restore --noflush (1.8.x) records every chain a
		// command names in a sorted list, inserting by linear search:
		// quadratic in the chains of the input (10k services: minutes).
		// One command naming no chain makes it cache all chains instead
		// and skip that list; "-S" is the harmless one (it lists the nat
		// table as it was to stdout, which the runner discards). Small
		// partial syncs do without: listing would cost more than it saves.
		a.raw("-S")
	}
	if rs.wroteDispatch {
		a.raw(chainLine(chainServices))
		a.raw(chainLine(chainNodePorts))
	}
	if in.full {
		a.raw(chainLine(chainPostrouting))
		a.raw(chainLine(chainMarkMasq))
	}
	a.add(&r.natChains)
	for _, c := range rs.stale {
		// Declaring a chain in a --noflush restore flushes it, so it
		// drops its references before -X deletes it.
		a.raw(chainLine(c))
	}
	if in.full {
		top := &lineBuffer{}
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
		a.add(top)
		rs.natWritten += top.lines
	}
	if rs.wroteDispatch {
		d := &lineBuffer{b: make([]byte, 0, 256*len(rs.next.services))}
		for _, k := range keys {
			if s := rs.next.services[k]; s != nil && s.dispatchLines > 0 {
				d.owner(k)
				d.b = append(d.b, s.dispatch...)
				d.lines += s.dispatchLines
			}
		}
		d.owner("")
		r.nodePortJumps(d)
		a.add(d)
		rs.natWritten += d.lines
	}
	a.add(&rs.dispatchEdits)
	a.add(&r.natRules)
	// Every line of natRules adds a rule: deletions come after, as -X.
	rs.natWritten += rs.dispatchInserts + r.natRules.lines
	for _, c := range rs.stale {
		a.raw("-X " + c)
	}
	if in.refreshJumps {
		writeJumps(a, "nat", jumpsFor(p.localhostNodePorts))
	}
	if a.lines == natStart+1 {
		// Nothing for nat: drop the header.
		a.b, a.lines, a.spans = a.b[:0], natStart, a.spans[:0]
	} else {
		a.raw("COMMIT")
	}

	if rs.wroteFilter {
		a.raw("*filter")
		for _, c := range [...]string{chainServices, chainExternalServices, chainForward, chainNodePorts, chainFirewall} {
			a.raw(chainLine(c))
		}
		if p.localhostNodePorts {
			a.raw(chainLine(chainLocalnet))
		}
		f := &lineBuffer{}
		for _, k := range keys {
			if s := rs.next.services[k]; s != nil && s.filterLines > 0 {
				f.owner(k)
				f.b = append(f.b, s.filter...)
				f.lines += s.filterLines
			}
		}
		f.owner("")
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
		a.add(f)
		rs.filterWritten = f.lines
		if in.refreshJumps {
			writeJumps(a, "filter", jumpsFor(p.localhostNodePorts))
		}
		a.raw("COMMIT")
	}
	rs.data, rs.owners = a.b, lineOwners(a.spans)
	if in.full {
		rs.next.natRules, rs.next.filterRules = rs.natWritten, rs.filterWritten
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
func writeJumps(a *assembler, table string, jumps []xtables.Jump) {
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
	a.add(l)
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
	// natChains declares per-service chains; natRules fills them.
	natChains, natRules lineBuffer
	// scratch buffers for one Service's dispatch and filter lines.
	dispatch, filter lineBuffer
}

// service renders plan: its lines in the dispatch chains and the filter
// table (kept in the returned state), and its own chains (written to the
// restore buffers unless prev shows the same chains are already in the
// kernel).
func (r *renderer) service(plan *svcPlan, prev *serviceState) *serviceState {
	st := &serviceState{}
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
	st.dispatch, st.dispatchLines = bytes.Clone(r.dispatch.b), r.dispatch.lines
	st.filter, st.filterLines = bytes.Clone(r.filter.b), r.filter.lines

	cm, rm := r.natChains.mark(), r.natRules.mark()
	r.natChains.owner(plan.Key)
	r.natRules.owner(plan.Key)
	for i := range plan.ports {
		st.chains = r.portChains(plan, &plan.ports[i], st.chains)
	}
	// Counted before the truncation below: kube-proxy's total includes
	// the rules of chains a partial sync leaves alone.
	st.natLines = r.natRules.lines - rm.lines
	d := xxhash.New()
	_, _ = d.Write(r.natChains.since(cm))
	_, _ = d.Write(r.natRules.since(rm))
	st.hash = d.Sum64()
	if prev != nil && prev.hash == st.hash {
		// Same chains, same rules: nothing to rewrite.
		r.natChains.truncate(cm)
		r.natRules.truncate(rm)
	}
	return st
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
