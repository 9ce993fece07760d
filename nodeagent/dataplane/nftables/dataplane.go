package nftables

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Dataplane programs one IP family of a node's proxy table into its own
// nf_tables table over netlink. It implements dataplane.Dataplane.
type Dataplane struct {
	cfg Config
	k   kernel

	// The fields below belong to the Sync caller (Sync is not safe for
	// concurrent use, as dataplane.Dataplane says).
	//
	// state is what the kernel holds from our last successful
	// transaction; nil when unknown (before the first sync, or after a
	// transaction whose outcome is unknown), in which case the next full
	// sync lists the table first.
	state *state
	// needFull forces the next sync to be full: a transaction was
	// refused, and the caller expects the retry to repair everything.
	needFull bool

	mu    sync.Mutex // guards stats, read by Stats from any goroutine
	stats Stats
}

var _ dataplane.Dataplane = (*Dataplane)(nil)

// Stats counts what the Dataplane did, for the agent's metrics.
type Stats struct {
	dataplane.SyncStats
	// Failures counts failed transactions, of which PartialFailures were
	// partial syncs.
	Failures, PartialFailures uint64
	// LastOps is the number of operations of the last transaction.
	LastOps int
}

// New returns a Dataplane for cfg. It checks the configuration; it opens
// no socket and changes nothing in the kernel until the first Sync.
func New(cfg Config) (*Dataplane, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newDataplane(cfg, newNetlinkKernel(cfg.Family, cfg.NetNS)), nil
}

// newDataplane is New's seam: the kernel is given.
func newDataplane(cfg Config, k kernel) *Dataplane {
	if cfg.LocalMode == "" {
		cfg.LocalMode = LocalNone
	}
	return &Dataplane{cfg: cfg, k: k}
}

// Sync implements dataplane.Dataplane. Every Sync is one nf_tables
// transaction. A partial sync rewrites the changed Services' chains and
// map elements; it becomes full when nothing is known of the kernel yet,
// after a failure, and when something every Service's rules depend on
// changed (the node's pod CIDR in NodeCIDR mode). A full sync rewrites
// the whole table and deletes what it does not use, keeping the affinity
// sets that stay. Errors are a *TransactionError (nothing changed) or a
// *SocketError, wrapped.
func (d *Dataplane) Sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return err
	}
	if t == nil {
		t = proxytable.Empty()
	}
	p := newParams(&d.cfg, t.Node)
	if !full && (d.state == nil || d.needFull || d.state.fingerprint != p.fingerprint()) {
		full = true
	}

	var tx *transaction
	var next *state
	var ch *change
	if full {
		next = buildState(t, &p)
		existing, reset := (*inventory)(nil), false
		if d.state != nil {
			// Transactions are atomic: after a refused one the kernel
			// still holds exactly the last successful state.
			existing = d.state.inventory()
		} else {
			var err error
			if existing, err = d.k.List(ctx); err != nil {
				return d.failed(fmt.Errorf("listing the %v table: %w", d.cfg.Family, err), false)
			}
			reset = true
		}
		tx = fullTransaction(next, existing, reset)
	} else {
		ch = computeChange(d.state, t, changed, &p)
		tx = partialTransaction(d.state, ch)
	}

	if err := d.k.Run(ctx, tx); err != nil {
		if IsOutcomeUnknown(err) {
			d.state = nil
		}
		return d.failed(fmt.Errorf("syncing %v nftables rules: %w", d.cfg.Family, markPartial(err, !full)), !full)
	}
	if full {
		d.state = next
	} else {
		d.state.apply(ch)
	}
	d.needFull = false

	d.mu.Lock()
	d.stats.Succeeded(full, start, len(d.state.services))
	d.stats.LastOps = len(tx.ops)
	d.mu.Unlock()
	return nil
}

// failed records a failure and forces the next sync to be full.
func (d *Dataplane) failed(err error, partial bool) error {
	d.needFull = true
	d.mu.Lock()
	d.stats.Failures++
	if partial {
		d.stats.PartialFailures++
	}
	d.mu.Unlock()
	if d.cfg.OnTransactionFailure != nil {
		d.cfg.OnTransactionFailure(partial)
	}
	return err
}

func markPartial(err error, partial bool) error {
	var te *TransactionError
	if errors.As(err, &te) {
		te.Partial = partial
	}
	return err
}

// Stats returns the counters. Safe for concurrent use with Sync.
func (d *Dataplane) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// Ruleset returns the nft script of the table as the last successful Sync
// left it ("" before the first one): what "nft list table" would show,
// for debugging endpoints. Not safe for concurrent use with Sync.
func (d *Dataplane) Ruleset() string {
	if d.state == nil {
		return ""
	}
	return rulesetText(d.state, d.cfg.Family)
}
