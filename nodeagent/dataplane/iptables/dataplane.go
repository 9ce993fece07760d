package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// mode is the Dataplane's name, as kube-proxy's --proxy-mode.
const mode = "iptables"

// Dataplane programs one IP family of a node's proxy table into iptables
// with iptables-restore. Its Sync is the Driver's, which decides full or
// partial and handles failures; the rendering and the record of what the
// kernel holds are the Dataplane's own. Sync's errors are a
// *xtables.RestoreError (nothing new in force but possibly the nat table,
// see README), a *xtables.LockError, a *xtables.CommandError or a
// *xtables.MissingBinaryError, wrapped.
type Dataplane struct {
	*dataplane.Driver
	b *engine
}

// Tools returns every binary the Dataplane may execute: what an image
// must ship for iptables mode.
func Tools() []string { return xtables.AllBinaries() }

// New returns a Dataplane for cfg, which reports every sync to observe
// (nil for none). It checks the configuration and that the iptables tools
// exist; it changes nothing in the kernel until the first Sync (which also
// detects the backend when cfg.Backend is auto).
func New(cfg Config, observe dataplane.Observer) (*Dataplane, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	runners, err := xtables.NewRunners(cfg.tools())
	if err != nil {
		return nil, fmt.Errorf("iptables %v dataplane: %w", cfg.Family, err)
	}
	sys, err := newSysctls(cfg.CommandPrefix)
	if err != nil {
		return nil, fmt.Errorf("iptables %v dataplane: %w", cfg.Family, err)
	}
	return newDataplane(cfg, runners, sys, observe), nil
}

// newDataplane is New's seam: the runners and sysctls are given. With one
// runner of a fixed backend no detection happens.
func newDataplane(cfg Config, runners map[xtables.Backend]xtables.Runner, sys sysctls, observe dataplane.Observer) *Dataplane {
	b := &engine{cfg: cfg, tools: xtables.NewTools(chainServices, cfg.Backend, runners), sysctls: sys}
	return &Dataplane{Driver: dataplane.NewDriver(b, mode, cfg.Family, observe), b: b}
}

// engine is the iptables dataplane.Backend: it renders restore input
// and knows what its last restore left in the kernel.
type engine struct {
	cfg     Config
	tools   *xtables.Tools
	sysctls sysctls

	// The fields below belong to the Driver's Sync caller.
	//
	// r and params are Prepare's, for the sync under way.
	r      xtables.Runner
	params params
	// state is what the kernel holds from our last successful restore;
	// nil until a full sync succeeds, and after Forget: the next full
	// sync then lists the nat chains with iptables-save, so that it also
	// deletes chains a failed restore created.
	state *programmed
	// rules counts the rules of the input the sync under way rendered;
	// Prepare clears it, so a sync that fails before rendering reports
	// none.
	rules []dataplane.TableRules
	// jumpsOK is set once every jump from the built-in chains is in. It
	// outlives Forget: full syncs verify the jumps inside the restore
	// anyway (see writeJumps).
	jumpsOK bool
	// repaired says what the sync under way found changed behind our back
	// and put back (see Repaired); Prepare clears it.
	repaired string
}

var (
	_ dataplane.Backend        = (*engine)(nil)
	_ dataplane.Cleaner        = (*engine)(nil)
	_ dataplane.RuleCounter    = (*engine)(nil)
	_ dataplane.RepairReporter = (*engine)(nil)
)

// Repaired implements dataplane.RepairReporter: a full sync that found a
// jump from a built-in chain gone (a firewall reload, an operator's
// iptables -F) and put it back. Other changes to our chains are undone by
// every full sync's restore without being noticed.
func (e *engine) Repaired() string { return e.repaired }

// RuleCounts implements dataplane.RuleCounter.
func (e *engine) RuleCounts() []dataplane.TableRules { return e.rules }

// Cleanup implements dataplane.Cleaner: it deletes the iptables mode's
// chains (ownsChain) and the jumps to them from the nat and filter tables
// of every backend the Dataplane has tools for: both with backend auto,
// only its own otherwise. The IPVS mode's PP-IPVS- chains stay.
func (e *engine) Cleanup(ctx context.Context) error {
	e.jumpsOK = false
	return e.tools.Cleanup(ctx, ownsChain)
}

// Leftovers lists what Cleanup would remove, each prefixed with its
// backend ("legacy nat/PP-SERVICES"): for logs. Read-only.
func (d *Dataplane) Leftovers(ctx context.Context) ([]string, error) {
	return d.b.tools.Leftovers(ctx, ownsChain)
}

// IPTablesBackend returns the iptables backend the Dataplane writes to:
// the configured one, or the detected one once a sync has run; "" before
// then with backend auto. Not safe for concurrent use with Sync.
func (d *Dataplane) IPTablesBackend() xtables.Backend { return d.b.tools.Backend() }

// ownsChain tells the iptables mode's chains: every proxyplane chain but
// the IPVS mode's.
func ownsChain(name string) bool {
	return strings.HasPrefix(name, xtables.ChainPrefix) && !strings.HasPrefix(name, xtables.IPVSChainPrefix)
}

// Prepare implements dataplane.Backend: it detects the backend at the
// first call, and resolves the parameters every rule depends on (the
// node's pod CIDR in NodeCIDR mode among them).
func (e *engine) Prepare(ctx context.Context, t *proxytable.Table) (string, error) {
	e.rules, e.repaired = nil, ""
	r, err := e.tools.Runner(ctx)
	if err != nil {
		return "", err
	}
	e.r = r
	e.params = newParams(&e.cfg, t.Node)
	e.params.backend = e.tools.Backend()
	return e.params.fingerprint(), nil
}

// Full implements dataplane.Backend. Jumps are checked on every full
// sync, as kube-proxy does: a host firewall reload may have flushed the
// built-in chains, and full syncs are the repair. Once installed, the
// restore itself re-asserts them (refreshJumps); one by one, each check
// costs a whole-table load with legacy iptables, over a second at 10k
// services.
func (e *engine) Full(ctx context.Context, t *proxytable.Table) error {
	if e.params.localhostNodePorts {
		// Before the rules that rely on it, and on every full sync, which
		// repairs a value reset behind our back. Never set back to 0: a
		// later run without localhost NodePorts cannot know whether
		// anyone else relies on it (kube-proxy leaves it too).
		if err := ensureSysctl(ctx, e.sysctls, sysctlRouteLocalnet, "1"); err != nil {
			return err
		}
	}
	var existing []string
	if e.state == nil {
		// Leftovers of an earlier run, or of a failed restore: list them
		// once, then trust what we write.
		out, err := e.r.Save(ctx, "nat")
		if err != nil {
			return fmt.Errorf("listing nat chains: %w", err)
		}
		chains, _ := xtables.ScanSave(out)
		for _, c := range chains {
			if isServiceChain(c) {
				existing = append(existing, c)
			}
		}
	}
	return e.full(ctx, t, existing)
}

// full is Full once the chains to delete beyond those of state are
// known.
func (e *engine) full(ctx context.Context, t *proxytable.Table, existing []string) error {
	in := &renderInput{table: t, params: e.params, full: true, prev: e.state, refreshJumps: e.jumpsOK, existing: existing}
	rs := newRuleset(in)
	e.rules = rs.counts()
	if owner, err := e.restore(ctx, rs); err != nil {
		if in.refreshJumps && owner == ownerJumps {
			// A jump is gone (a firewall reload flushed a built-in
			// chain): restore without the jumps, then install them one
			// by one. nat may hold the failed input's chains if only
			// filter failed.
			e.jumpsOK = false
			e.repaired = fmt.Sprintf("%v: a jump from a built-in chain was gone", e.cfg.Family)
			for _, s := range rs.next.services {
				existing = slices.AppendSeq(existing, s.chainNames())
			}
			return e.full(ctx, t, existing)
		}
		return err
	}
	e.state = rs.next
	if !e.jumpsOK {
		if err := xtables.EnsureJumps(ctx, e.r, jumpsFor(e.params.localhostNodePorts)); err != nil {
			return err
		}
		e.jumpsOK = true
	}
	return nil
}

// Partial implements dataplane.Backend: it rewrites the changed
// Services' chains and edits the dispatch chains in place.
func (e *engine) Partial(ctx context.Context, t *proxytable.Table, changed []string) error {
	rs := newRuleset(&renderInput{table: t, params: e.params, changed: changed, prev: e.state})
	e.rules = rs.counts()
	if _, err := e.restore(ctx, rs); err != nil {
		return err
	}
	e.state = rs.next
	return nil
}

// Forget implements dataplane.Backend.
func (e *engine) Forget() { e.state = nil }

// restore applies rs, if it holds anything. --noflush: the tables hold
// other programs' rules; only the chains the input declares are flushed
// and rewritten. The input is written to iptables-restore as it is
// rendered. A RestoreError comes back naming the failing rule and the
// Service that wrote it, found by rendering the input again up to that
// line; owner is that line's owner as the ruleset knows it (ownerJumps
// for a jump).
func (e *engine) restore(ctx context.Context, rs *ruleset) (owner string, err error) {
	if rs.empty() {
		return "", nil
	}
	err = xtables.RestoreFrom(ctx, e.r, rs, "--noflush")
	var re *xtables.RestoreError
	if errors.As(err, &re) && re.Line > 0 {
		var text string
		var ok bool
		if owner, text, ok = rs.locate(re.Line); ok {
			re.Rule = text
		}
		if re.Key = owner; re.Key == ownerJumps {
			re.Key = ""
		}
	}
	return owner, err
}
