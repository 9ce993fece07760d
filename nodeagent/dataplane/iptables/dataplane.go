package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Dataplane programs one IP family of a node's proxy table into iptables
// with iptables-restore. It implements dataplane.Dataplane.
type Dataplane struct {
	cfg Config
	// runners holds a runner per candidate backend until detection
	// picks one; then r is that runner.
	runners map[Backend]runner

	// The fields below belong to the Sync caller (Sync is not safe for
	// concurrent use, as dataplane.Dataplane says).
	r       runner
	backend Backend
	// state is what the kernel holds from our last successful restore;
	// nil until the first full sync, which then learns the leftovers of
	// an earlier process from iptables-save.
	state *programmed
	// needFull forces the next sync to be full: a restore failed, so
	// nat may hold either the old or the new rules.
	needFull bool
	// suspect lists chains a failed restore may have created; the next
	// full sync deletes those it does not keep.
	suspect []string
	// jumpsOK is set once every jump from the built-in chains is in.
	jumpsOK bool

	mu    sync.Mutex // guards stats, read by Stats from any goroutine
	stats Stats
}

var _ dataplane.Dataplane = (*Dataplane)(nil)

// Stats counts what the Dataplane did, for the agent's metrics.
type Stats struct {
	dataplane.SyncStats
	// Backend is the backend in use; "" until the first Sync detects it.
	Backend Backend
	// RestoreFailures counts failed iptables-restore runs, of which
	// PartialRestoreFailures were partial syncs (kube-proxy's
	// sync_proxy_rules_iptables_restore_failures_total and
	// sync_proxy_rules_iptables_partial_restore_failures_total).
	RestoreFailures, PartialRestoreFailures uint64
	// LastRestoreBytes is the size of the last restore input.
	LastRestoreBytes int
}

// New returns a Dataplane for cfg. It checks the configuration and that
// the iptables tools exist; it changes nothing in the kernel until the
// first Sync (which also detects the backend when cfg.Backend is auto).
func New(cfg Config) (*Dataplane, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
	runners := map[Backend]runner{}
	backends := []Backend{cfg.Backend}
	if cfg.Backend == BackendAuto {
		backends = []Backend{BackendNFT, BackendLegacy}
	}
	var errs []error
	for _, b := range backends {
		r, err := newExecRunner(&cfg, b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		runners[b] = r
	}
	if len(runners) == 0 {
		return nil, fmt.Errorf("iptables %v dataplane: %w", cfg.Family, errors.Join(errs...))
	}
	return newDataplane(cfg, runners), nil
}

// newDataplane is New's seam: the runners are given. With one runner of
// a fixed backend no detection happens.
func newDataplane(cfg Config, runners map[Backend]runner) *Dataplane {
	cfg = withDefaults(cfg)
	d := &Dataplane{cfg: cfg, runners: runners}
	if cfg.Backend != BackendAuto {
		d.r, d.backend = runners[cfg.Backend], cfg.Backend
		d.stats.Backend = cfg.Backend
	}
	return d
}

func withDefaults(cfg Config) Config {
	if cfg.Backend == "" {
		cfg.Backend = BackendAuto
	}
	if cfg.LocalMode == "" {
		cfg.LocalMode = LocalNone
	}
	if cfg.LockWait == 0 {
		cfg.LockWait = DefaultLockWait
	}
	return cfg
}

// Sync implements dataplane.Dataplane. A partial sync becomes full when
// nothing is known of the kernel yet, after a failed restore, and when
// something every Service's rules depend on changed (the node's pod CIDR
// in NodeCIDR mode). Errors are a *RestoreError (nothing new in force but
// possibly the nat table, see RestoreError), a *LockError, a
// *CommandError or a *MissingBinaryError, wrapped.
func (d *Dataplane) Sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return err
	}
	if t == nil {
		t = proxytable.Empty()
	}
	if d.r == nil {
		b, err := DetectBackend(ctx, chainServices, d.runners[BackendNFT], d.runners[BackendLegacy])
		if err != nil {
			return err
		}
		d.r, d.backend = d.runners[b], b
		d.mu.Lock()
		d.stats.Backend = b
		d.mu.Unlock()
	}

	p := newParams(&d.cfg, t.Node)
	p.backend = d.backend
	if !full && (d.state == nil || d.needFull || d.state.params != p.fingerprint()) {
		full = true
	}
	in := &renderInput{table: t, params: p, full: full, changed: changed, prev: d.state, refreshJumps: full && d.jumpsOK}
	if full {
		in.existing = d.suspect
		if d.state == nil {
			// Leftovers of an earlier run (or of a run that failed
			// before we knew the kernel): list them once, then trust
			// what we write.
			out, err := d.r.Save(ctx, "nat")
			if err != nil {
				return fmt.Errorf("listing %v nat chains: %w", d.cfg.Family, err)
			}
			chains, _ := scanSave(out)
			for _, c := range chains {
				if isServiceChain(c) {
					in.existing = append(in.existing, c)
				}
			}
		}
	}

	rs := render(in)
	if len(rs.data) > 0 {
		// --noflush: the tables hold other programs' rules; only the
		// chains the input declares are flushed and rewritten.
		if err := d.r.Restore(ctx, rs.data, "--noflush"); err != nil {
			d.needFull = true
			for _, s := range rs.next.services {
				d.suspect = append(d.suspect, s.chains...)
			}
			d.mu.Lock()
			d.stats.RestoreFailures++
			if !full {
				d.stats.PartialRestoreFailures++
			}
			d.mu.Unlock()
			if d.cfg.OnRestoreFailure != nil {
				d.cfg.OnRestoreFailure(!full)
			}
			var re *RestoreError
			if in.refreshJumps && errors.As(err, &re) && rs.owners.owner(re.Line) == ownerJumps {
				// A jump is gone (a firewall reload flushed a built-in
				// chain): install the jumps one by one after a full
				// restore without them.
				d.jumpsOK = false
				return d.Sync(ctx, t, changed, true)
			}
			return fmt.Errorf("syncing %v iptables rules: %w", d.cfg.Family, describe(err, rs, !full))
		}
	}
	d.state, d.needFull, d.suspect = rs.next, false, nil

	// Jumps are checked on every full sync, as kube-proxy does: a host
	// firewall reload may have flushed the built-in chains, and full syncs
	// are the repair. Once installed, the restore itself re-asserts them
	// (refreshJumps); one by one, each check costs a whole-table load
	// with legacy iptables, over a second at 10k services.
	if !d.jumpsOK {
		d.jumpsOK = false
		if err := ensureJumps(ctx, d.r); err != nil {
			return fmt.Errorf("syncing %v iptables jumps: %w", d.cfg.Family, err)
		}
		d.jumpsOK = true
	}

	d.mu.Lock()
	d.stats.Succeeded(full, start, len(rs.next.services))
	d.stats.LastRestoreBytes = len(rs.data)
	d.mu.Unlock()
	return nil
}

// Stats returns the counters. Safe for concurrent use with Sync.
func (d *Dataplane) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// describe completes a RestoreError with the failing rule and the
// Service that wrote it.
func describe(err error, rs *ruleset, partial bool) error {
	var re *RestoreError
	if !errors.As(err, &re) {
		return err
	}
	re.Partial = partial
	if re.Line > 0 {
		if re.Key = rs.owners.owner(re.Line); re.Key == ownerJumps {
			re.Key = ""
		}
		re.Rule = inputLine(rs.data, re.Line)
	}
	return err
}

// inputLine returns line n (1-based) of data.
func inputLine(data []byte, n int) string {
	for i := 1; len(data) > 0; i++ {
		line, rest, _ := bytes.Cut(data, []byte("\n"))
		if i == n {
			return string(line)
		}
		data = rest
	}
	return ""
}
