package dataplane

import (
	"context"
	"fmt"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Backend is one IP family's way of programming the kernel: the rendering
// and the kernel seam, and nothing a Driver does for every backend. Its
// methods are called by one Driver, one at a time, from the Driver's Sync
// caller.
type Backend interface {
	// Prepare computes, for t's node, what every Service's rules depend
	// on beyond the Service itself (the settings applied to the node and,
	// for some backends, kernel facts such as the node's addresses), and
	// returns its fingerprint. Full and Partial use what Prepare computed.
	// A fingerprint other than the last successful sync's makes the sync
	// full. An error fails the sync.
	Prepare(ctx context.Context, t *proxytable.Table) (fingerprint string, err error)
	// Full makes the kernel forward exactly as t says: it rewrites every
	// rule the backend owns and deletes what it does not write. Unless the
	// backend knows what the kernel holds (a sync succeeded and Forget was
	// not called since), it reads the kernel first. On error the rules of
	// the last successful sync may stay in force, in part or whole, as
	// the backend documents.
	Full(ctx context.Context, t *proxytable.Table) error
	// Partial rewrites only what the keys in changed need: the keys
	// upserted into or removed from the table since the last successful
	// sync, which the Driver guarantees is complete. The Driver calls it
	// only after a successful sync with the same fingerprint and no
	// Forget since.
	Partial(ctx context.Context, t *proxytable.Table, changed []string) error
	// Forget drops what the backend believes the kernel holds, so that the
	// next Full reads the kernel rather than trusting its memory. The
	// Driver calls it after every failed sync (the outcome may be unknown)
	// and when a DriftChecker finds drift.
	Forget()
}

// DriftChecker is implemented by a Backend that, trusting its memory,
// would not notice rules changed behind its back (another program, an
// operator's nft command, a CNI reinstall), and that can tell cheaply
// whether they were. A Backend without it repairs drift in every Full by
// itself.
type DriftChecker interface {
	// Drifted reports whether the kernel may no longer hold what the
	// backend last wrote. It is called before a full sync, only after a
	// successful one. After an error the Driver re-reads the kernel in
	// Full as it does after drift, but reports no repair: it cannot say
	// there was one.
	Drifted(ctx context.Context) (bool, error)
}

// DriftDescriber is implemented by a DriftChecker that can say what the
// drift it last found was, for the operator (SyncResult.DriftDetail).
type DriftDescriber interface {
	// DriftDetail describes what the last Drifted call that reported
	// drift found changed, in a line; "" when it cannot say.
	DriftDetail() string
}

// RepairReporter is implemented by a Backend that is not a DriftChecker
// but whose full syncs notice some changes made behind its back while
// they put them back (the iptables backend, a jump gone from a built-in
// chain). The Driver reports them as drift.
type RepairReporter interface {
	// Repaired describes, in a line, what the sync under way found
	// changed and put back; "" when nothing. The Driver asks after a
	// successful full sync that followed a successful sync.
	Repaired() string
}

// Cleaner is implemented by a Backend that can remove everything it and
// earlier runs programmed, for the agent's --cleanup (kube-proxy's): a
// node leaving proxyplane, or going back to kube-proxy; and by the Driver,
// which runs it. Cleanup is idempotent and leaves other programs' rules
// alone.
type Cleaner interface {
	Cleanup(ctx context.Context) error
}

// RuleCounter is implemented by a Backend that counts the rules it owns,
// as kube-proxy's iptables proxier does for its
// sync_proxy_rules_iptables_total and _last metrics.
type RuleCounter interface {
	// RuleCounts returns, per table, the rules of the input the sync under
	// way rendered, whether or not the kernel took it (kube-proxy sets its
	// metrics before restoring); nil when the sync failed before
	// rendering. The Driver calls it after Full or Partial returns.
	RuleCounts() []TableRules
}

// TableRules counts a backend's rules in one kernel table.
type TableRules struct {
	// Table is the kernel table, "nat" or "filter".
	Table string
	// Total is every rule the backend owns in the table once the sync is
	// in force, those of chains the sync left alone included.
	Total int
	// Written is the rules the sync's input adds to the table.
	Written int
}

// SyncResult describes one sync a Driver ran, for metrics and logs.
type SyncResult struct {
	// Mode and Family name the dataplane, as Driver's constructor was
	// given them.
	Mode   string
	Family Family
	// Full reports whether the sync was full as run: a partial sync the
	// Driver made full counts as full.
	Full bool
	// Drifted reports that the backend found its rules changed behind its
	// back and re-read the kernel. A drift check that failed is no repair:
	// the kernel is re-read all the same, and DriftDetail says why.
	Drifted bool
	// DriftDetail says what changed, when Drifted and the backend is a
	// DriftDescriber, or why the drift check failed, when not Drifted.
	DriftDetail string
	// Took is how long the sync took, Prepare included.
	Took time.Duration
	// Rules counts the rules per table, from a Backend that is a
	// RuleCounter; nil otherwise, or when the sync rendered nothing.
	Rules []TableRules
	// Err is the sync's error, nil on success.
	Err error
}

// Observer hears of every sync a Driver runs. It is called on the Sync
// caller's goroutine and must not block.
type Observer func(SyncResult)

// Driver runs a Backend as a Dataplane: it owns what every backend would
// otherwise repeat. It checks the context, treats a nil table as empty,
// decides full or partial, forgets the kernel after a failure, checks for
// drift before full syncs, wraps errors with the mode and family, and
// reports each sync to one Observer.
type Driver struct {
	b       Backend
	mode    string
	family  Family
	observe Observer

	// The fields below belong to the Sync caller (Sync is not safe for
	// concurrent use, as Dataplane says).
	//
	// synced is set after a successful sync, cleared by a failure: only
	// then may a sync be partial.
	synced bool
	// fingerprint is Prepare's answer at the last successful sync.
	fingerprint string
}

var _ Dataplane = (*Driver)(nil)

// NewDriver returns a Driver that runs b, the family part of dataplane
// mode (kube-proxy's --proxy-mode name: "iptables", "nftables", "ipvs").
// observe may be nil.
func NewDriver(b Backend, mode string, family Family, observe Observer) *Driver {
	return &Driver{b: b, mode: mode, family: family, observe: observe}
}

// Backend returns the Backend the Driver runs, for debugging endpoints
// and tests that look inside it.
func (d *Driver) Backend() Backend { return d.b }

// Cleanup removes everything the backend programs (it must be a Cleaner)
// and forgets it: a later sync is full.
func (d *Driver) Cleanup(ctx context.Context) error {
	c, ok := d.b.(Cleaner)
	if !ok {
		return fmt.Errorf("the %s dataplane cannot clean up", d.mode)
	}
	d.synced = false
	d.b.Forget()
	if err := c.Cleanup(ctx); err != nil {
		return fmt.Errorf("cleaning up %v %s rules: %w", d.family, d.mode, err)
	}
	return nil
}

// Sync implements Dataplane. A partial sync becomes full before the first
// successful sync, after a failed one, and when the backend's fingerprint
// changed. Errors are the backend's, wrapped with the mode and family.
func (d *Driver) Sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error {
	res := SyncResult{Mode: d.mode, Family: d.family}
	start := time.Now()
	res.Full, res.Drifted, res.DriftDetail, res.Err = d.sync(ctx, t, changed, full)
	res.Took = time.Since(start)
	if rc, ok := d.b.(RuleCounter); ok {
		res.Rules = rc.RuleCounts()
	}
	if res.Err != nil {
		d.synced = false
		d.b.Forget()
		res.Err = fmt.Errorf("syncing %v %s rules: %w", d.family, d.mode, res.Err)
	}
	if d.observe != nil {
		d.observe(res)
	}
	return res.Err
}

func (d *Driver) sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) (ranFull, drifted bool, detail string, err error) {
	if err := ctx.Err(); err != nil {
		return full, false, "", err
	}
	if t == nil {
		t = proxytable.Empty()
	}
	fp, err := d.b.Prepare(ctx, t)
	if err != nil {
		return full, false, "", err
	}
	full = full || !d.synced || fp != d.fingerprint
	if full && d.synced {
		if dc, ok := d.b.(DriftChecker); ok {
			found, checkErr := dc.Drifted(ctx)
			switch {
			case checkErr != nil:
				// Not the sync's error: reading the kernel in Full
				// answers the question the check could not. Nor a
				// repair: nothing says anyone changed the rules.
				detail = "drift check failed: " + checkErr.Error()
				d.b.Forget()
			case found:
				if dd, ok := d.b.(DriftDescriber); ok {
					detail = dd.DriftDetail()
				}
				drifted = true
				d.b.Forget()
			}
		}
	}
	if full {
		err = d.b.Full(ctx, t)
	} else {
		err = d.b.Partial(ctx, t, changed)
	}
	if err != nil {
		return full, drifted, detail, err
	}
	if rr, ok := d.b.(RepairReporter); ok && full && d.synced && !drifted {
		if what := rr.Repaired(); what != "" {
			drifted, detail = true, what
		}
	}
	d.synced, d.fingerprint = true, fp
	return full, drifted, detail, nil
}
