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
	b := &engine{cfg: cfg, k: k, tools: xtables.NewTools(chainServices, cfg.Backend, k.iptables)}
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
}

var (
	_ dataplane.Backend = (*engine)(nil)
	_ dataplane.Cleaner = (*engine)(nil)
)

// Cleanup implements dataplane.Cleaner. It deletes the family's virtual
// servers (but those in ExcludeCIDRs, which other programs own) and the
// addresses on the dummy link, then the PP- chains and jumps of both
// iptables backends, and last the family's sets, which those rules
// matched on. It carries on past a failure and returns them all.
func (e *engine) Cleanup(ctx context.Context) error {
	var errs []error
	vss, err := e.k.ipvs.VirtualServers()
	if err != nil {
		errs = append(errs, kernelOp("list", "virtual servers", "", err))
	}
	exclude := e.cfg.Family.Prefixes(e.cfg.ExcludeCIDRs)
	for _, vs := range vss {
		if e.cfg.Family.Has(vs.Addr) && !slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(vs.Addr) }) {
			errs = append(errs, kernelOp("delete", "virtual server", vs.key().String(), e.k.ipvs.DeleteVirtualServer(vs)))
		}
	}
	addrs, err := e.k.links.LinkAddrs(e.cfg.Interface, e.cfg.Family)
	errs = append(errs, kernelOp("list addresses of", e.cfg.Interface, "", err))
	for _, a := range addrs {
		errs = append(errs, kernelOp("delete address", a.String(), "", e.k.links.DelAddr(e.cfg.Interface, a)))
	}
	errs = append(errs, xtables.CleanupAll(ctx, e.k.iptables))
	errs = append(errs, e.destroySets(ctx))
	return errors.Join(errs...)
}

// destroySets destroys those of the family's sets that exist.
func (e *engine) destroySets(ctx context.Context) error {
	out, err := e.k.ipset.Save(ctx)
	if err != nil {
		return err
	}
	var in strings.Builder
	for id := range numSets {
		name := setName(e.cfg.Family, id)
		if strings.Contains(string(out), "create "+name+" ") {
			in.WriteString("flush " + name + "\ndestroy " + name + "\n")
		}
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

// sysctls are set at every full sync, each with its reason. They live
// under net/ipv4/vs for both families.
var sysctls = []struct{ name, value string }{
	// IPVS keeps netfilter conntrack entries for its connections, so that
	// iptables' MASQUERADE and conntrack matches work on them.
	{"net/ipv4/vs/conntrack", "1"},
	// A connection whose real server was deleted is expired, and its next
	// packet scheduled anew, rather than sent nowhere: UDP flows move to a
	// live endpoint.
	{"net/ipv4/vs/expire_nodest_conn", "1"},
	// Persistence templates of a weight-0 real server expire, so ClientIP
	// affinity moves clients off an endpoint being drained.
	{"net/ipv4/vs/expire_quiescent_template", "1"},
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
	if err := e.setUp(); err != nil {
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

// setUp sets what the kernel needs once and may have lost: sysctls,
// timeouts and the dummy link.
func (e *engine) setUp() error {
	var errs []error
	for _, s := range sysctls {
		errs = append(errs, kernelOp("set sysctl", s.name+"="+s.value, "", e.k.sysctl.Ensure(s.name, s.value)))
	}
	if e.cfg.Family == dataplane.IPv4 {
		// IPVS NAT forwards replies back to remote clients. IPv6
		// forwarding is left to the node: turning it on changes how every
		// interface treats router advertisements.
		errs = append(errs, kernelOp("set sysctl", "net/ipv4/ip_forward=1", "", e.k.sysctl.Ensure("net/ipv4/ip_forward", "1")))
	}
	if c := &e.cfg; c.TCPTimeout > 0 || c.TCPFinTimeout > 0 || c.UDPTimeout > 0 {
		errs = append(errs, kernelOp("set", "IPVS timeouts", "", e.k.ipvs.SetTimeouts(c.TCPTimeout, c.TCPFinTimeout, c.UDPTimeout)))
	}
	if err := e.k.links.EnsureLink(e.cfg.Interface); err != nil {
		errs = append(errs, kernelOp("ensure", "link "+e.cfg.Interface, "", err))
	}
	return errors.Join(errs...)
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
