package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// mode is the Dataplane's name, as kube-proxy's --proxy-mode.
const mode = "ipvs"

// Dataplane programs one IP family of a node's proxy table into IPVS, with
// the service addresses on a dummy link and the few ipsets and iptables
// rules IPVS mode needs. Its Sync is the Driver's, which decides full or
// partial and handles failures; planning and reconciling the kernel are the
// Dataplane's own.
type Dataplane struct {
	*dataplane.Driver
	b *engine
}

// seams are the Dataplane's ways into the kernel.
type seams struct {
	ipvs   ipvsKernel
	links  linkKernel
	sysctl sysctlKernel
	ipset  ipsetRunner
	// iptables holds a runner per candidate backend until detection picks
	// one.
	iptables map[xtables.Backend]xtables.Runner
}

// ipsetBinary is the ipset tool the Dataplane runs.
const ipsetBinary = "ipset"

// Tools returns every binary the Dataplane may execute: what an image
// must ship for IPVS mode.
func Tools() []string { return append(xtables.AllBinaries(), ipsetBinary) }

// CheckKernel reports whether this kernel has IPVS: nil, or an error
// matching IsIPVSUnavailable that names the missing feature (or another
// error when it cannot tell). It needs no privilege and changes nothing:
// callers can decide before building anything, as New does first.
func CheckKernel() error { return checkIPVSFamily() }

// New returns a Dataplane for cfg, which reports every sync to observe
// (nil for none). It checks the configuration, that the kernel has IPVS
// (an error matching IsIPVSUnavailable when not: the agent cannot run in
// IPVS mode on that kernel and should exit non-zero), and that ipset and
// the iptables tools exist. It changes nothing in the kernel until the
// first Sync.
func New(cfg Config, observe dataplane.Observer) (*Dataplane, error) {
	return newChecked(cfg, observe, checkIPVSFamily, openSeams)
}

// newChecked is New with the IPVS check and the kernel access as seams.
func newChecked(cfg Config, observe dataplane.Observer, check familyChecker, open func(*Config) (*seams, error)) (*Dataplane, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
	// First, before anything that would hide it: moby/ipvs "succeeds" on a
	// kernel without IPVS.
	if err := check(); err != nil {
		return nil, fmt.Errorf("IPVS %v dataplane: %w", cfg.Family, err)
	}
	k, err := open(&cfg)
	if err != nil {
		return nil, fmt.Errorf("IPVS %v dataplane: %w", cfg.Family, err)
	}
	return newDataplane(cfg, k, observe), nil
}

// openSeams opens the real kernel interfaces for cfg.
func openSeams(cfg *Config) (*seams, error) {
	k := &seams{sysctl: procSysctl{ns: cfg.NetNS}}
	t, err := tool.New(cfg.CommandPrefix, ipsetBinary)
	if err != nil {
		return nil, err
	}
	k.ipset = execIPSet{t}
	if k.iptables, err = xtables.NewRunners(cfg.tools()); err != nil {
		return nil, err
	}
	if k.links, err = newNetlinkLinks(cfg.NetNS); err != nil {
		return nil, err
	}
	if k.ipvs, err = newMobyKernel(cfg.NetNS); err != nil {
		return nil, err
	}
	return k, nil
}

// newDataplane is the constructor over given seams (fakes in tests). With
// one iptables runner of a fixed backend no detection happens.
func newDataplane(cfg Config, k *seams, observe dataplane.Observer) *Dataplane {
	cfg = withDefaults(cfg)
	b := &engine{cfg: cfg, k: k, tools: xtables.NewTools(chainServices, cfg.Backend, k.iptables), sysctlWarned: map[string]bool{}}
	return &Dataplane{Driver: dataplane.NewDriver(b, mode, cfg.Family, observe), b: b}
}

// engine is the IPVS dataplane.Backend: it plans the wanted kernel state
// and reconciles the kernel with it.
//
// IPVS has no transactions: objects are changed one by one, additions
// before removals, so that traffic always meets a complete virtual server.
// When a change fails the engine carries on with the others and returns
// them all (each a *KernelError, or one of package xtables' errors for the
// ipset and iptables tools, joined).
type engine struct {
	cfg   Config
	k     *seams
	tools *xtables.Tools

	// The fields below belong to the Driver's Sync caller.
	//
	// ipt and p are Prepare's, for the sync under way.
	ipt xtables.Runner
	p   *params
	// plans caches each Service's plan for p, so that a partial sync
	// replans only the changed keys.
	plans map[string]*svcPlan
	// applied is what the kernel holds after the last successful sync,
	// real servers being drained included; nil until a full sync
	// succeeded, and after Forget.
	applied *kernelState
	// sysctlWarned holds the sysctls warned of as wrong, until they are
	// right again.
	sysctlWarned map[string]bool
}

var (
	_ dataplane.Backend = (*engine)(nil)
	_ dataplane.Cleaner = (*engine)(nil)
)

// Cleanup implements dataplane.Cleaner. It deletes the family's virtual
// servers (but those in ExcludeCIDRs, which other programs own) and the
// addresses on the dummy link, then the IPVS mode's PP-IPVS- chains and
// jumps of every iptables backend it has tools for (both with backend
// auto), leaving the iptables mode's PP- chains alone, and last the
// family's sets, which those rules matched on. It carries on past a
// failure and returns them all.
func (e *engine) Cleanup(ctx context.Context) error {
	var errs []error
	vss, err := e.k.ipvs.VirtualServers()
	if err != nil {
		errs = append(errs, kernelOp("list", "virtual servers", "", err))
	}
	for _, vs := range e.cleanable(vss) {
		errs = append(errs, kernelOp("delete", "virtual server", vs.key().String(), e.k.ipvs.DeleteVirtualServer(vs)))
	}
	addrs, err := e.k.links.LinkAddrs(e.cfg.Interface, e.cfg.Family)
	errs = append(errs, kernelOp("list addresses of", e.cfg.Interface, "", err))
	for _, a := range addrs {
		errs = append(errs, kernelOp("delete address", a.String(), "", e.k.links.DelAddr(e.cfg.Interface, a)))
	}
	errs = append(errs, xtables.CleanupAll(ctx, e.k.iptables, ownsChain))
	errs = append(errs, e.destroySets(ctx))
	return errors.Join(errs...)
}

// CleanupRules deletes the IPVS mode's chains and the jumps to them from
// the backends the Dataplane has tools for, and nothing else: for an agent
// running IPVS mode on one iptables backend, removing what a run on the
// other left (built with that backend, the Dataplane has its tools only).
// Idempotent.
func (d *Dataplane) CleanupRules(ctx context.Context) error {
	return xtables.CleanupAll(ctx, d.b.k.iptables, ownsChain)
}

// Leftovers lists what Cleanup would remove: chains and jumps (each
// prefixed with its backend), service addresses, sets and virtual
// servers; with rulesOnly, what CleanupRules would. For the agent's
// switch of modes, which removes nothing when this finds nothing: so the
// virtual servers, which carry no owner, are listed only beside evidence
// that this mode ran here (its chains, addresses or sets). Those of
// kube-proxy in IPVS mode, running beside an agent in another mode
// during a migration, are not the IPVS mode's leftovers. Read-only.
func (d *Dataplane) Leftovers(ctx context.Context, rulesOnly bool) ([]string, error) {
	e := d.b
	found, err := xtables.LeftoversAll(ctx, e.k.iptables, ownsChain)
	if rulesOnly || err != nil {
		return found, err
	}
	addrs, err := e.k.links.LinkAddrs(e.cfg.Interface, e.cfg.Family)
	if err != nil {
		return found, kernelOp("list addresses of", e.cfg.Interface, "", err)
	}
	for _, a := range addrs {
		found = append(found, "address "+a.String()+" on "+e.cfg.Interface)
	}
	sets, err := e.existingSets(ctx)
	if err != nil {
		return found, err
	}
	for _, name := range sets {
		found = append(found, "set "+name)
	}
	if len(found) == 0 {
		return nil, nil
	}
	vss, err := e.k.ipvs.VirtualServers()
	if err != nil {
		return found, kernelOp("list", "virtual servers", "", err)
	}
	for _, vs := range e.cleanable(vss) {
		found = append(found, "virtual server "+vs.key().String())
	}
	return found, nil
}

// cleanable keeps the virtual servers of vss that Cleanup removes: those
// of the family outside ExcludeCIDRs.
func (e *engine) cleanable(vss []VirtualServer) []VirtualServer {
	exclude := e.cfg.Family.Prefixes(e.cfg.ExcludeCIDRs)
	var out []VirtualServer
	for _, vs := range vss {
		if e.cfg.Family.Has(vs.Addr) && !slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(vs.Addr) }) {
			out = append(out, vs)
		}
	}
	return out
}

// existingSets returns the names of the family's sets that exist.
func (e *engine) existingSets(ctx context.Context) ([]string, error) {
	out, err := e.k.ipset.Save(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for id := range numSets {
		if name := setName(e.cfg.Family, id); strings.Contains(string(out), "create "+name+" ") {
			names = append(names, name)
		}
	}
	return names, nil
}

// IPTablesBackend returns the iptables backend the Dataplane writes to:
// the configured one, or the detected one once a sync has run; "" before
// then with backend auto. Not safe for concurrent use with Sync.
func (d *Dataplane) IPTablesBackend() xtables.Backend { return d.b.tools.Backend() }

// ownsChain tells the IPVS mode's chains from the iptables mode's, which
// an agent switching from one mode to the other must leave in place until
// it removes them itself.
func ownsChain(name string) bool { return strings.HasPrefix(name, xtables.IPVSChainPrefix) }

// destroySets destroys those of the family's sets that exist.
func (e *engine) destroySets(ctx context.Context) error {
	names, err := e.existingSets(ctx)
	if err != nil {
		return err
	}
	var in strings.Builder
	for _, name := range names {
		in.WriteString("flush " + name + "\ndestroy " + name + "\n")
	}
	if in.Len() == 0 {
		return nil
	}
	return e.k.ipset.Restore(ctx, []byte(in.String()))
}

// kernelState is what the kernel holds (or, after a successful sync, is
// known to hold) of one family.
type kernelState struct {
	vss   map[vsKey]*kernelVS
	addrs map[netip.Addr]struct{}
	sets  [numSets]members
}

// kernelVS is a virtual server and its real servers.
type kernelVS struct {
	vs    VirtualServer
	dests map[netip.AddrPort]*RealServer
	// connsKnown says the real servers' connection counts were read from
	// the kernel in this sync; otherwise they must be read before a
	// removal decision.
	connsKnown bool
}

// Sysctl is a /proc/sys setting IPVS mode needs.
type Sysctl struct {
	// Name is relative to /proc/sys: "net/ipv4/vs/conntrack".
	Name string
	// Value is what it must hold.
	Value int
	// Why is what goes wrong without it, for logs.
	Why string
}

// Sysctls returns the sysctls the family's Dataplane needs. The agent
// never writes them: its container's /proc/sys is read-only, so the
// privileged init container (nodeagent --init-only, in IPVS mode) sets
// them, and each full sync only checks them. The net/ipv4/vs ones serve
// both families.
func Sysctls(family dataplane.Family) []Sysctl {
	s := []Sysctl{
		{"net/ipv4/vs/conntrack", 1, "IPVS keeps no conntrack entries for its connections: iptables' MASQUERADE and conntrack matches miss them"},
		{"net/ipv4/vs/expire_nodest_conn", 1, "a connection whose real server was deleted is not expired: its packets go nowhere rather than to a live endpoint"},
		{"net/ipv4/vs/expire_quiescent_template", 1, "persistence templates of a weight-0 real server live on: ClientIP affinity keeps clients on a draining endpoint"},
	}
	if family == dataplane.IPv4 {
		// IPVS NAT forwards replies back to remote clients. IPv6
		// forwarding is left to the node: turning it on changes how every
		// interface treats router advertisements.
		s = append(s, Sysctl{"net/ipv4/ip_forward", 1, "replies to remote clients are not forwarded"})
	}
	return s
}

// Prepare implements dataplane.Backend: it detects the iptables backend
// at the first call, and resolves what every Service's plan depends on,
// the node's addresses among them (a new one makes the sync full, for its
// NodePorts).
func (e *engine) Prepare(ctx context.Context, t *proxytable.Table) (string, error) {
	ipt, err := e.tools.Runner(ctx)
	if err != nil {
		return "", err
	}
	nodeAddrs, err := e.k.links.NodeAddrs(e.cfg.Interface, e.cfg.Family)
	if err != nil {
		return "", kernelOp("list", "node addresses", "", err)
	}
	e.ipt, e.p = ipt, newParams(&e.cfg, t.Node, nodeAddrs)
	return e.p.fingerprint(), nil
}

// Full implements dataplane.Backend: it reads the kernel (virtual and
// real servers, the dummy link's addresses, our sets) whatever it
// remembers, and repairs any drift; it rewrites our iptables chains and
// re-asserts their jumps.
func (e *engine) Full(ctx context.Context, t *proxytable.Table) error {
	e.plans = planAll(t, e.p)
	if err := e.setUp(ctx); err != nil {
		return err
	}
	cur, err := e.readKernel(ctx)
	if err != nil {
		return err
	}
	return e.apply(ctx, cur, true)
}

// Partial implements dataplane.Backend: it trusts what the last sync left
// and touches only what differs for the changed keys. It never touches
// iptables: the rules depend on the configuration only.
func (e *engine) Partial(ctx context.Context, t *proxytable.Table, changed []string) error {
	for _, k := range changed {
		if entry := t.Entries[k]; entry != nil {
			if plan, ok := planService(entry, e.p); ok {
				e.plans[k] = plan
				continue
			}
		}
		delete(e.plans, k)
	}
	return e.apply(ctx, e.applied, false)
}

// Forget implements dataplane.Backend.
func (e *engine) Forget() { e.applied = nil }

// apply reconciles the kernel, holding cur, with the plans.
func (e *engine) apply(ctx context.Context, cur *kernelState, full bool) error {
	if err := e.reconcile(ctx, e.p, cur, aggregate(e.plans), full); err != nil {
		return err
	}
	for _, v := range cur.vss {
		v.connsKnown = false // counts go stale from now on
	}
	e.applied = cur
	return nil
}

// setUp sets what the kernel needs once and may have lost, timeouts and
// the dummy link, and checks the sysctls.
func (e *engine) setUp(ctx context.Context) error {
	e.checkSysctls(ctx)
	var errs []error
	if c := &e.cfg; c.TCPTimeout > 0 || c.TCPFinTimeout > 0 || c.UDPTimeout > 0 {
		errs = append(errs, kernelOp("set", "IPVS timeouts", "", e.k.ipvs.SetTimeouts(c.TCPTimeout, c.TCPFinTimeout, c.UDPTimeout)))
	}
	if err := e.k.links.EnsureLink(e.cfg.Interface); err != nil {
		errs = append(errs, kernelOp("ensure", "link "+e.cfg.Interface, "", err))
	}
	return errors.Join(errs...)
}

// checkSysctls warns of each sysctl of Sysctls that does not hold its
// value, once until it does: a wrong one degrades the dataplane rather
// than stops it, and writing it is the privileged init container's job
// (the agent's /proc/sys is read-only).
func (e *engine) checkSysctls(ctx context.Context) {
	for _, s := range Sysctls(e.cfg.Family) {
		got, err := e.k.sysctl.ReadInt(s.Name)
		if err == nil && got == s.Value {
			delete(e.sysctlWarned, s.Name)
			continue
		}
		if e.sysctlWarned[s.Name] {
			continue
		}
		e.sysctlWarned[s.Name] = true
		args := []any{"sysctl", s.Name, "want", s.Value, "without it", s.Why}
		if err != nil {
			args = append(args, "err", err)
		} else {
			args = append(args, "have", got)
		}
		e.cfg.Log.WarnContext(ctx, "a sysctl IPVS mode needs is not set; the agent does not write sysctls: run nodeagent --init-only in IPVS mode in a privileged init container (deploy/nodeagent.yaml does)", args...)
	}
}

// readKernel reads what the kernel holds of our family: every virtual
// server (but those in ExcludeCIDRs) with its real servers, the dummy
// link's addresses, and our sets' members.
func (e *engine) readKernel(ctx context.Context) (*kernelState, error) {
	st := &kernelState{vss: map[vsKey]*kernelVS{}, addrs: map[netip.Addr]struct{}{}}
	vss, err := e.k.ipvs.VirtualServers()
	if err != nil {
		return nil, kernelOp("list", "virtual servers", "", err)
	}
	exclude := e.cfg.Family.Prefixes(e.cfg.ExcludeCIDRs)
	for _, vs := range vss {
		if !e.cfg.Family.Has(vs.Addr) || slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(vs.Addr) }) {
			continue
		}
		rss, err := e.k.ipvs.RealServers(vs)
		if err != nil {
			return nil, kernelOp("list real servers of", vs.key().String(), "", err)
		}
		kv := &kernelVS{vs: vs, dests: make(map[netip.AddrPort]*RealServer, len(rss)), connsKnown: true}
		for i := range rss {
			kv.dests[rss[i].addrPort()] = &rss[i]
		}
		st.vss[vs.key()] = kv
	}
	addrs, err := e.k.links.LinkAddrs(e.cfg.Interface, e.cfg.Family)
	if err != nil {
		return nil, kernelOp("list addresses of", e.cfg.Interface, "", err)
	}
	for _, a := range addrs {
		st.addrs[a] = struct{}{}
	}
	out, err := e.k.ipset.Save(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	found := parseIPSetSave(e.cfg.Family, out)
	for id := range numSets {
		st.sets[id] = found[id]
		if st.sets[id] == nil {
			st.sets[id] = members{}
		}
	}
	return st, nil
}

// reconcile changes the kernel from cur to want, updating cur as it goes;
// see engine for the order and the error handling.
func (e *engine) reconcile(ctx context.Context, p *params, cur *kernelState, want *desired, full bool) error {
	var errs []error
	wantKeys := slices.SortedFunc(maps.Keys(want.vss), vsKey.compare)

	// Virtual servers and their new real servers first: a new address is
	// bound, and traffic arrives, only once its virtual server is whole.
	for _, k := range wantKeys {
		if err := ctx.Err(); err != nil {
			return err
		}
		errs = append(errs, e.addVirtualServer(cur, want.vss[k]))
	}
	for _, a := range sortedAddrs(want.addrs) {
		if _, ok := cur.addrs[a]; !ok {
			if err := e.k.links.AddAddr(e.cfg.Interface, a); err != nil {
				errs = append(errs, kernelOp("bind", a.String()+" to "+e.cfg.Interface, "", err))
				continue
			}
			cur.addrs[a] = struct{}{}
		}
	}
	// Sets: creates (full syncs: a set may have been destroyed), then
	// members added and removed, in one restore.
	if data := renderIPSet(e.cfg.Family, &cur.sets, &want.sets, full); len(data) > 0 {
		if err := e.k.ipset.Restore(ctx, data); err != nil {
			errs = append(errs, fmt.Errorf("updating ipsets: %w", tool.WithRule(err, data)))
		} else {
			for id := range numSets {
				cur.sets[id] = maps.Clone(want.sets[id])
			}
		}
	}
	if full {
		// The rules depend on the configuration only; a full sync
		// rewrites them in case someone changed them, and re-asserts the
		// jumps (a firewall reload may have flushed the built-in chains).
		data := renderRules(&p.rules)
		if err := e.ipt.Restore(ctx, data, "--noflush"); err != nil {
			errs = append(errs, fmt.Errorf("writing iptables rules: %w", tool.WithRule(err, data)))
		} else if err := xtables.EnsureJumps(ctx, e.ipt, jumps); err != nil {
			errs = append(errs, err)
		}
	}

	// Removals last: first the addresses (their traffic stops being
	// local), then virtual servers, then real servers, drained gently.
	for _, a := range sortedAddrs(cur.addrs) {
		if _, ok := want.addrs[a]; !ok {
			if err := e.k.links.DelAddr(e.cfg.Interface, a); err != nil {
				errs = append(errs, kernelOp("unbind", a.String()+" from "+e.cfg.Interface, "", err))
				continue
			}
			delete(cur.addrs, a)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(cur.vss), vsKey.compare) {
		if _, ok := want.vss[k]; ok {
			continue
		}
		if err := e.k.ipvs.DeleteVirtualServer(cur.vss[k].vs); err != nil {
			errs = append(errs, kernelOp("delete virtual server", k.String(), "", err))
			continue
		}
		delete(cur.vss, k)
	}
	for _, k := range wantKeys {
		if err := ctx.Err(); err != nil {
			return err
		}
		if kv := cur.vss[k]; kv != nil {
			errs = append(errs, e.removeRealServers(kv, want.vss[k]))
		}
	}
	return errors.Join(errs...)
}

// addVirtualServer creates or updates w's virtual server and adds its
// missing real servers, or restores the weight of ones being drained.
func (e *engine) addVirtualServer(cur *kernelState, w *vsPlan) error {
	k := w.vs.key()
	kv := cur.vss[k]
	switch {
	case kv == nil:
		if err := e.k.ipvs.AddVirtualServer(w.vs); err != nil {
			return kernelOp("add virtual server", k.String(), w.key, err)
		}
		kv = &kernelVS{vs: w.vs, dests: map[netip.AddrPort]*RealServer{}, connsKnown: true}
		cur.vss[k] = kv
	case kv.vs != w.vs:
		// Scheduler or persistence changed: IPVS updates in place, and
		// the virtual server never goes away.
		if err := e.k.ipvs.UpdateVirtualServer(w.vs); err != nil {
			return kernelOp("update virtual server", k.String(), w.key, err)
		}
		kv.vs = w.vs
	}
	var errs []error
	for _, ap := range w.dests {
		rs := kv.dests[ap]
		switch {
		case rs == nil:
			rs = &RealServer{Addr: ap.Addr(), Port: ap.Port(), Weight: 1}
			if err := e.k.ipvs.AddRealServer(w.vs, *rs); err != nil {
				errs = append(errs, kernelOp("add real server", describeRS(k, ap), w.key, err))
				continue
			}
			kv.dests[ap] = rs
		case rs.Weight != 1:
			// Back before it drained (or a weight someone else set):
			// its connections carry on.
			up := *rs
			up.Weight = 1
			if err := e.k.ipvs.UpdateRealServer(w.vs, up); err != nil {
				errs = append(errs, kernelOp("update real server", describeRS(k, ap), w.key, err))
				continue
			}
			rs.Weight = 1
		}
	}
	return errors.Join(errs...)
}

// removeRealServers removes kv's real servers that w no longer wants,
// gracefully: a TCP or SCTP real server with connections gets weight 0
// (no new connections) and stays until a later sync finds it idle, as
// kube-proxy's graceful termination does; UDP ones go at once, and
// expire_nodest_conn moves their flows.
func (e *engine) removeRealServers(kv *kernelVS, w *vsPlan) error {
	k := kv.vs.key()
	var stale []netip.AddrPort
	for ap := range kv.dests {
		if !slices.Contains(w.dests, ap) {
			stale = append(stale, ap)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	slices.SortFunc(stale, netip.AddrPort.Compare)
	if !kv.connsKnown && k.proto != UDP {
		rss, err := e.k.ipvs.RealServers(kv.vs)
		if err != nil {
			return kernelOp("list real servers of", k.String(), w.key, err)
		}
		fresh := map[netip.AddrPort]RealServer{}
		for _, rs := range rss {
			fresh[rs.addrPort()] = rs
		}
		for _, ap := range stale {
			if rs, ok := fresh[ap]; ok {
				kv.dests[ap].ActiveConns, kv.dests[ap].InactiveConns = rs.ActiveConns, rs.InactiveConns
			} else {
				delete(kv.dests, ap) // gone already
			}
		}
		kv.connsKnown = true
	}
	var errs []error
	for _, ap := range stale {
		rs := kv.dests[ap]
		if rs == nil {
			continue
		}
		if k.proto == UDP || rs.ActiveConns+rs.InactiveConns == 0 {
			if err := e.k.ipvs.DeleteRealServer(kv.vs, *rs); err != nil {
				errs = append(errs, kernelOp("delete real server", describeRS(k, ap), w.key, err))
				continue
			}
			delete(kv.dests, ap)
			continue
		}
		if rs.Weight != 0 {
			down := *rs
			down.Weight = 0
			if err := e.k.ipvs.UpdateRealServer(kv.vs, down); err != nil {
				errs = append(errs, kernelOp("drain real server", describeRS(k, ap), w.key, err))
				continue
			}
			rs.Weight = 0
		}
	}
	return errors.Join(errs...)
}

func sortedAddrs(m map[netip.Addr]struct{}) []netip.Addr {
	return slices.SortedFunc(maps.Keys(m), netip.Addr.Compare)
}
