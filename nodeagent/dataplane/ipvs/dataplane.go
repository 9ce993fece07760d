package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Dataplane programs one IP family of a node's proxy table into IPVS, with
// the service addresses on a dummy link and the few ipsets and iptables
// rules IPVS mode needs. It implements dataplane.Dataplane.
type Dataplane struct {
	cfg Config
	k   *seams

	// The fields below belong to the Sync caller (Sync is not safe for
	// concurrent use, as dataplane.Dataplane says).
	ipt iptablesRunner
	// plans caches each Service's plan for the params with fingerprint
	// fp, so that a partial sync replans only the changed keys.
	plans map[string]*svcPlan
	fp    string
	// applied is what the kernel holds after the last successful sync,
	// real servers being drained included; nil until a full sync
	// succeeded.
	applied *kernelState
	// needFull forces the next sync to be full: a sync failed, so the
	// kernel holds some mix of the old and new state.
	needFull bool

	mu    sync.Mutex // guards stats, read by Stats from any goroutine
	stats Stats
}

var _ dataplane.Dataplane = (*Dataplane)(nil)

// Stats counts what the Dataplane did, for the agent's metrics.
type Stats struct {
	dataplane.SyncStats
	// Backend is the iptables backend in use; "" until the first Sync
	// detects it.
	Backend Backend
	// Failures counts failed syncs.
	Failures uint64
	// VirtualServers and RealServers count what is in force; Draining is
	// the real servers among them kept at weight 0 until their
	// connections end.
	VirtualServers, RealServers, Draining int
}

// seams are the Dataplane's ways into the kernel.
type seams struct {
	ipvs   ipvsKernel
	links  linkKernel
	sysctl sysctlKernel
	ipset  ipsetRunner
	// iptables holds a runner per candidate backend until detection picks
	// one.
	iptables map[Backend]iptablesRunner
}

// CheckKernel reports whether this kernel has IPVS: nil, or an error
// matching IsIPVSUnavailable that names the missing feature (or another
// error when it cannot tell). It needs no privilege and changes nothing:
// callers can decide before building anything, as New does first.
func CheckKernel() error { return checkIPVSFamily() }

// New returns a Dataplane for cfg. It checks the configuration, that the
// kernel has IPVS (an error matching IsIPVSUnavailable when not: the agent
// cannot run in IPVS mode on that kernel and should exit non-zero), and
// that ipset and the iptables tools exist. It changes nothing in the kernel
// until the first Sync.
func New(cfg Config) (*Dataplane, error) {
	return newChecked(cfg, checkIPVSFamily, openSeams)
}

// newChecked is New with the IPVS check and the kernel access as seams.
func newChecked(cfg Config, check familyChecker, open func(*Config) (*seams, error)) (*Dataplane, error) {
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
	return newDataplane(cfg, k), nil
}

// openSeams opens the real kernel interfaces for cfg.
func openSeams(cfg *Config) (*seams, error) {
	k := &seams{sysctl: procSysctl{ns: cfg.NetNS}, iptables: map[Backend]iptablesRunner{}}
	t, err := tool.New(cfg.CommandPrefix, "ipset")
	if err != nil {
		return nil, err
	}
	k.ipset = execIPSet{t}
	backends := []Backend{cfg.Backend}
	if cfg.Backend == BackendAuto {
		backends = []Backend{BackendNFT, BackendLegacy}
	}
	var errs []error
	for _, b := range backends {
		r, err := newExecIPTables(cfg, b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		k.iptables[b] = r
	}
	if len(k.iptables) == 0 {
		return nil, errors.Join(errs...)
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
func newDataplane(cfg Config, k *seams) *Dataplane {
	cfg = withDefaults(cfg)
	d := &Dataplane{cfg: cfg, k: k}
	if cfg.Backend != BackendAuto {
		d.ipt = k.iptables[cfg.Backend]
		d.stats.Backend = cfg.Backend
	}
	return d
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

// Sync implements dataplane.Dataplane. A partial sync becomes full when
// nothing is known of the kernel yet, after a failed sync, and when
// something every Service depends on changed (a node address, the pod CIDR
// in NodeCIDR mode). A full sync reads the kernel (virtual and real
// servers, the dummy link's addresses, our sets) and repairs any drift,
// rewrites our iptables chains and re-asserts their jumps; a partial sync
// trusts what the last sync left and touches only what differs.
//
// IPVS has no transactions: objects are changed one by one, additions
// before removals, so that traffic always meets a complete virtual server.
// When a change fails Sync carries on with the others and returns them
// all (each a *KernelError, *RestoreError, *CommandError or
// *MissingBinaryError, joined and wrapped); the next Sync is then full.
func (d *Dataplane) Sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return err
	}
	if t == nil {
		t = proxytable.Empty()
	}
	err := d.sync(ctx, t, changed, full, start)
	if err != nil {
		d.needFull = true
		d.mu.Lock()
		d.stats.Failures++
		d.mu.Unlock()
		return fmt.Errorf("syncing %v IPVS: %w", d.cfg.Family, err)
	}
	return nil
}

func (d *Dataplane) sync(ctx context.Context, t *proxytable.Table, changed []string, full bool, start time.Time) error {
	if d.ipt == nil {
		b, err := iptables.DetectBackend(ctx, chainServices, d.k.iptables[BackendNFT], d.k.iptables[BackendLegacy])
		if err != nil {
			return err
		}
		d.ipt = d.k.iptables[b]
		d.mu.Lock()
		d.stats.Backend = b
		d.mu.Unlock()
	}
	nodeAddrs, err := d.k.links.NodeAddrs(d.cfg.Interface, d.cfg.Family)
	if err != nil {
		return kernelOp("list", "node addresses", "", err)
	}
	p := newParams(&d.cfg, t.Node, nodeAddrs)
	fp := p.fingerprint()
	full = full || d.applied == nil || d.needFull || fp != d.fp
	if full || d.plans == nil || fp != d.fp {
		d.plans, d.fp = planAll(t, p), fp
	} else {
		for _, k := range changed {
			if e := t.Entries[k]; e != nil {
				if plan, ok := planService(e, p); ok {
					d.plans[k] = plan
					continue
				}
			}
			delete(d.plans, k)
		}
	}
	want := aggregate(d.plans)

	cur := d.applied
	if full {
		if err := d.prepare(); err != nil {
			return err
		}
		if cur, err = d.readKernel(ctx); err != nil {
			return err
		}
	}
	if err := d.reconcile(ctx, p, cur, want, full); err != nil {
		return err
	}
	for _, v := range cur.vss {
		v.connsKnown = false // counts go stale from now on
	}
	d.applied, d.needFull = cur, false

	d.mu.Lock()
	defer d.mu.Unlock()
	d.stats.Succeeded(full, start, len(d.plans))
	d.stats.VirtualServers, d.stats.RealServers, d.stats.Draining = len(cur.vss), 0, 0
	for _, v := range cur.vss {
		d.stats.RealServers += len(v.dests)
		for _, rs := range v.dests {
			if rs.Weight == 0 {
				d.stats.Draining++
			}
		}
	}
	return nil
}

// prepare sets what the kernel needs once and may have lost: sysctls,
// timeouts and the dummy link.
func (d *Dataplane) prepare() error {
	var errs []error
	for _, s := range sysctls {
		errs = append(errs, kernelOp("set sysctl", s.name+"="+s.value, "", d.k.sysctl.Ensure(s.name, s.value)))
	}
	if d.cfg.Family == IPv4 {
		// IPVS NAT forwards replies back to remote clients. IPv6
		// forwarding is left to the node: turning it on changes how every
		// interface treats router advertisements.
		errs = append(errs, kernelOp("set sysctl", "net/ipv4/ip_forward=1", "", d.k.sysctl.Ensure("net/ipv4/ip_forward", "1")))
	}
	if c := &d.cfg; c.TCPTimeout > 0 || c.TCPFinTimeout > 0 || c.UDPTimeout > 0 {
		errs = append(errs, kernelOp("set", "IPVS timeouts", "", d.k.ipvs.SetTimeouts(c.TCPTimeout, c.TCPFinTimeout, c.UDPTimeout)))
	}
	if err := d.k.links.EnsureLink(d.cfg.Interface); err != nil {
		errs = append(errs, kernelOp("ensure", "link "+d.cfg.Interface, "", err))
	}
	return errors.Join(errs...)
}

// readKernel reads what the kernel holds of our family: every virtual
// server (but those in ExcludeCIDRs) with its real servers, the dummy
// link's addresses, and our sets' members.
func (d *Dataplane) readKernel(ctx context.Context) (*kernelState, error) {
	st := &kernelState{vss: map[vsKey]*kernelVS{}, addrs: map[netip.Addr]struct{}{}}
	vss, err := d.k.ipvs.VirtualServers()
	if err != nil {
		return nil, kernelOp("list", "virtual servers", "", err)
	}
	exclude := plan.Family(d.cfg.Family).Prefixes(d.cfg.ExcludeCIDRs)
	for _, vs := range vss {
		if !d.cfg.Family.has(vs.Addr) || slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(vs.Addr) }) {
			continue
		}
		rss, err := d.k.ipvs.RealServers(vs)
		if err != nil {
			return nil, kernelOp("list real servers of", vs.key().String(), "", err)
		}
		kv := &kernelVS{vs: vs, dests: make(map[netip.AddrPort]*RealServer, len(rss)), connsKnown: true}
		for i := range rss {
			kv.dests[rss[i].addrPort()] = &rss[i]
		}
		st.vss[vs.key()] = kv
	}
	addrs, err := d.k.links.LinkAddrs(d.cfg.Interface, d.cfg.Family)
	if err != nil {
		return nil, kernelOp("list addresses of", d.cfg.Interface, "", err)
	}
	for _, a := range addrs {
		st.addrs[a] = struct{}{}
	}
	out, err := d.k.ipset.Save(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	found := parseIPSetSave(d.cfg.Family, out)
	for id := range numSets {
		st.sets[id] = found[id]
		if st.sets[id] == nil {
			st.sets[id] = members{}
		}
	}
	return st, nil
}

// reconcile changes the kernel from cur to want, updating cur as it goes;
// see Sync for the order and the error handling.
func (d *Dataplane) reconcile(ctx context.Context, p *params, cur *kernelState, want *desired, full bool) error {
	var errs []error
	wantKeys := slices.SortedFunc(maps.Keys(want.vss), vsKey.compare)

	// Virtual servers and their new real servers first: a new address is
	// bound, and traffic arrives, only once its virtual server is whole.
	for _, k := range wantKeys {
		if err := ctx.Err(); err != nil {
			return err
		}
		errs = append(errs, d.addVirtualServer(cur, want.vss[k]))
	}
	for _, a := range sortedAddrs(want.addrs) {
		if _, ok := cur.addrs[a]; !ok {
			if err := d.k.links.AddAddr(d.cfg.Interface, a); err != nil {
				errs = append(errs, kernelOp("bind", a.String()+" to "+d.cfg.Interface, "", err))
				continue
			}
			cur.addrs[a] = struct{}{}
		}
	}
	// Sets: creates (full syncs: a set may have been destroyed), then
	// members added and removed, in one restore.
	if data := renderIPSet(d.cfg.Family, &cur.sets, &want.sets, full); len(data) > 0 {
		if err := d.k.ipset.Restore(ctx, data); err != nil {
			errs = append(errs, fmt.Errorf("updating ipsets: %w", describeRestore(err, data)))
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
		if err := d.ipt.Restore(ctx, data, "--noflush"); err != nil {
			errs = append(errs, fmt.Errorf("writing iptables rules: %w", describeRestore(err, data)))
		} else if err := ensureJumps(ctx, d.ipt); err != nil {
			errs = append(errs, err)
		}
	}

	// Removals last: first the addresses (their traffic stops being
	// local), then virtual servers, then real servers, drained gently.
	for _, a := range sortedAddrs(cur.addrs) {
		if _, ok := want.addrs[a]; !ok {
			if err := d.k.links.DelAddr(d.cfg.Interface, a); err != nil {
				errs = append(errs, kernelOp("unbind", a.String()+" from "+d.cfg.Interface, "", err))
				continue
			}
			delete(cur.addrs, a)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(cur.vss), vsKey.compare) {
		if _, ok := want.vss[k]; ok {
			continue
		}
		if err := d.k.ipvs.DeleteVirtualServer(cur.vss[k].vs); err != nil {
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
			errs = append(errs, d.removeRealServers(kv, want.vss[k]))
		}
	}
	return errors.Join(errs...)
}

// addVirtualServer creates or updates w's virtual server and adds its
// missing real servers, or restores the weight of ones being drained.
func (d *Dataplane) addVirtualServer(cur *kernelState, w *vsPlan) error {
	k := w.vs.key()
	kv := cur.vss[k]
	switch {
	case kv == nil:
		if err := d.k.ipvs.AddVirtualServer(w.vs); err != nil {
			return kernelOp("add virtual server", k.String(), w.key, err)
		}
		kv = &kernelVS{vs: w.vs, dests: map[netip.AddrPort]*RealServer{}, connsKnown: true}
		cur.vss[k] = kv
	case kv.vs != w.vs:
		// Scheduler or persistence changed: IPVS updates in place, and
		// the virtual server never goes away.
		if err := d.k.ipvs.UpdateVirtualServer(w.vs); err != nil {
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
			if err := d.k.ipvs.AddRealServer(w.vs, *rs); err != nil {
				errs = append(errs, kernelOp("add real server", describeRS(k, ap), w.key, err))
				continue
			}
			kv.dests[ap] = rs
		case rs.Weight != 1:
			// Back before it drained (or a weight someone else set):
			// its connections carry on.
			up := *rs
			up.Weight = 1
			if err := d.k.ipvs.UpdateRealServer(w.vs, up); err != nil {
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
func (d *Dataplane) removeRealServers(kv *kernelVS, w *vsPlan) error {
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
		rss, err := d.k.ipvs.RealServers(kv.vs)
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
			if err := d.k.ipvs.DeleteRealServer(kv.vs, *rs); err != nil {
				errs = append(errs, kernelOp("delete real server", describeRS(k, ap), w.key, err))
				continue
			}
			delete(kv.dests, ap)
			continue
		}
		if rs.Weight != 0 {
			down := *rs
			down.Weight = 0
			if err := d.k.ipvs.UpdateRealServer(kv.vs, down); err != nil {
				errs = append(errs, kernelOp("drain real server", describeRS(k, ap), w.key, err))
				continue
			}
			rs.Weight = 0
		}
	}
	return errors.Join(errs...)
}

// describeRestore completes a RestoreError with the failing input line.
func describeRestore(err error, data []byte) error {
	var re *RestoreError
	if errors.As(err, &re) && re.Line > 0 {
		re.Rule = inputLine(data, re.Line)
	}
	return err
}

// inputLine returns line n (1-based) of data.
func inputLine(data []byte, n int) string {
	for i, line := range splitLines(data) {
		if i+1 == n {
			return line
		}
	}
	return ""
}

func splitLines(data []byte) []string {
	var out []string
	for len(data) > 0 {
		i := slices.Index(data, '\n')
		if i < 0 {
			out = append(out, string(data))
			break
		}
		out = append(out, string(data[:i]))
		data = data[i+1:]
	}
	return out
}

func sortedAddrs(m map[netip.Addr]struct{}) []netip.Addr {
	return slices.SortedFunc(maps.Keys(m), netip.Addr.Compare)
}

// Stats returns the counters. Safe for concurrent use with Sync.
func (d *Dataplane) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}
