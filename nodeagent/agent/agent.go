// Package agent is the node agent's core: one goroutine owns the table in
// force, the cache and the dataplane. Each table response is validated,
// persisted, programmed, and only then reported as applied (for the ACK);
// a failure at any step leaves the previous table in force in the kernel
// and in the cache (for the NACK).
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/failpoint"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Store persists tables; cache.Cache implements it. Save writes a table
// atomically: entirely or not at all.
type Store interface {
	Save(t *proxytable.Table, changed []string, full bool) error
}

// Config configures an Agent.
type Config struct {
	// SyncPeriod is the interval between full syncs, which repair rules
	// changed behind the agent's back.
	SyncPeriod time.Duration
	// RetryMin and RetryMax bound the backoff of a failed full sync.
	RetryMin, RetryMax time.Duration
	// ControlPlaneTimeout is how long /healthz stays healthy while no
	// control plane answers (Health); 0 forever. Used when Health is nil.
	ControlPlaneTimeout time.Duration
	// Health is the tracker the agent reports table changes and syncs to;
	// nil makes one with twice SyncPeriod as its timeout, as kube-proxy's.
	// The caller passes its own to report each family's syncs to it as
	// well (Health.Synced, from the dataplane's Observer).
	Health *Health
	// AfterSync run, in order on the agent's goroutine, after each table is
	// programmed (deltas and full syncs alike), as kube-proxy updates its
	// healthCheckNodePort server and cleans stale conntrack entries after
	// each rule sync. They report their own errors: the rules are in force
	// whatever they do.
	AfterSync []func(ctx context.Context, t *proxytable.Table)
	// Families are the IP families the dataplane programs, for the
	// metrics kube-proxy labels with ip_family.
	Families []dataplane.Family
	// Policy is what the agent requires of a table beyond its structure:
	// hashes that are their content's, and nothing that captures the
	// control plane or the node's own ports. Tables it refuses are
	// NACKed, and a cached one is not programmed. Nil checks nothing.
	Policy *proxytable.Policy
}

// Agent owns the table in force. Create it with New and run it with Run.
type Agent struct {
	cfg     Config
	dp      dataplane.Dataplane
	store   Store
	log     *slog.Logger
	health  *Health
	reqs    chan request
	inForce atomic.Pointer[proxytable.Table] // the table programmed last, for hellos
	started chan struct{}                    // closed once the cache was programmed (or tried)

	// saved, owned by the Run goroutine, is the table in the cache: the
	// base deltas apply to and what full syncs program. From the start it
	// is the cached table, in force only once a sync programmed it.
	saved *proxytable.Table

	// needFull, owned by the Run goroutine, makes the next sync full: after
	// a failed sync the kernel may hold part of the rejected table (one
	// family programmed, the other not), which only a full sync repairs.
	needFull bool
	// reported, owned by the Run goroutine, is the version last exported
	// as applied_version_info.
	reported string
}

type request struct {
	resp        *pb.SyncResponse
	hashesKnown bool
	reply       chan error
}

// New returns an agent starting from cached, the table loaded from the
// cache (nil when none), whose hashes the cache verified. Run programs it
// before anything else.
func New(cfg Config, dp dataplane.Dataplane, store Store, cached *proxytable.Table, log *slog.Logger) *Agent {
	health := cfg.Health
	if health == nil {
		health = NewHealth(2*cfg.SyncPeriod, cfg.ControlPlaneTimeout, cfg.Families, time.Now())
	}
	a := &Agent{cfg: cfg, dp: dp, store: store, log: log, health: health, reqs: make(chan request), started: make(chan struct{})}
	if cached != nil {
		// The cache verified its hashes when it loaded it.
		if err := cfg.Policy.CheckVerified(cached); err != nil {
			// Programming it could cut the node off from the control
			// plane for good (it would be programmed again at every
			// start): start empty, as with a corrupt cache, and wait
			// for a table.
			log.Error("the cached table breaks the agent's policy; not programming it, waiting for the control plane", "version", cached.Version, "err", err)
			cached = nil
		}
	}
	if cached == nil {
		cached = proxytable.Empty()
	}
	a.saved = cached
	a.inForce.Store(proxytable.Empty())
	return a
}

// Health reports the agent's sync health for /healthz and /livez.
func (a *Agent) Health() *Health { return a.health }

// Started is closed once Run has tried to program the cached table (at
// once when there is none), so that a control plane is contacted after it.
func (a *Agent) Started() <-chan struct{} { return a.started }

// Held returns the table in force: persisted and programmed, and what the
// agent tells a control plane it holds. It is empty until a sync succeeded:
// a cached table the kernel refused is not claimed, so that a control
// plane sends the whole table rather than a delta to rules that are not
// there. Safe for concurrent use.
func (a *Agent) Held() *proxytable.Table { return a.inForce.Load() }

// Apply validates, persists and programs a Snapshot or Delta response and
// returns the version now in force. On error nothing changed: the caller
// NACKs. hashesKnown says that every hash of a snapshot was computed
// from, or checked against, the bytes it was decoded from (the client
// does so for snapshots with runs without hashes): they are not
// recomputed. Safe for concurrent use; responses are applied one at a
// time.
func (a *Agent) Apply(ctx context.Context, resp *pb.SyncResponse, hashesKnown bool) (string, error) {
	req := request{resp: resp, hashesKnown: hashesKnown, reply: make(chan error, 1)}
	select {
	case a.reqs <- req:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case err := <-req.reply:
		return a.Held().Version, err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Run programs the cached table, then applies responses and runs periodic
// full syncs until ctx ends. It never flushes rules: a table that cannot
// be programmed leaves the kernel as it was, and is retried.
func (a *Agent) Run(ctx context.Context) error {
	retry := a.cfg.RetryMin
	timer := time.NewTimer(a.cfg.SyncPeriod)
	defer timer.Stop()
	// fullSync reprograms the table in force and schedules the next full
	// sync: after the sync period, or sooner, with backoff, after a failure.
	fullSync := func() {
		wait := a.cfg.SyncPeriod
		// With no table at all (no cache) the kernel is left alone rather
		// than flushed of rules nothing can replace.
		if a.saved.Version != "" {
			if err := a.sync(ctx, a.saved, nil, true); err != nil {
				a.log.Error("full sync failed; previous rules stay in force", "err", err, "retryIn", retry)
				wait, retry = retry, min(2*retry, a.cfg.RetryMax)
			} else {
				retry = a.cfg.RetryMin
			}
		}
		timer.Reset(wait)
	}
	if a.saved.Version != "" {
		// The cached table is a change to program, as kube-proxy's first
		// sync after its informers synced: if the kernel refuses it for
		// longer than the timeout, /livez fails. Without a cache nothing
		// is pending, and the agent is live while it waits for a table.
		a.health.Queued(time.Now())
	}
	fullSync() // the cached table, before anything else
	close(a.started)
	for {
		select {
		case <-ctx.Done():
			return nil
		case req := <-a.reqs:
			req.reply <- a.apply(ctx, req.resp, req.hashesKnown)
		case <-timer.C:
			fullSync()
		}
	}
}

// apply is Apply's work, on the Run goroutine.
func (a *Agent) apply(ctx context.Context, resp *pb.SyncResponse, hashesKnown bool) error {
	cur := a.saved
	var next *proxytable.Table
	var changed []string
	var err error
	switch {
	case resp.GetSnapshot() != nil:
		next, err = proxytable.FromSnapshot(resp.GetSnapshot())
	case resp.GetDelta() != nil:
		next, changed, err = cur.Apply(resp.GetDelta())
	default:
		err = fmt.Errorf("%w: not a table response", proxytable.ErrInvalidTable)
	}
	if err == nil {
		// The whole table for a snapshot, the upserts for a delta: the
		// rest was checked when it came, unless the replicas the table
		// names moved, which every entry must leave alone.
		check := changed
		if cur != nil && !slices.Equal(cur.Node.GetControlPlaneAddresses(), next.Node.GetControlPlaneAddresses()) {
			check = nil
		}
		if resp.GetSnapshot() != nil && hashesKnown {
			err = a.cfg.Policy.CheckVerified(next)
		} else {
			err = a.cfg.Policy.Check(next, check)
		}
	}
	if err != nil {
		return err // nothing to program: health is unaffected
	}
	a.health.Queued(time.Now())
	metrics.ObserveQueued(a.cfg.Families)
	// A response the agent fails to program is NACKed, not retried: its
	// changes are pending only while it is being programmed.
	services, endpoints := changes(cur, next, changed)
	metrics.ServiceChangesTotal.Add(float64(services))
	metrics.EndpointChangesTotal.Add(float64(endpoints))
	metrics.ServiceChangesPending.Set(float64(services))
	metrics.EndpointChangesPending.Set(float64(endpoints))
	defer metrics.ServiceChangesPending.Set(0)
	defer metrics.EndpointChangesPending.Set(0)
	full := changed == nil || a.needFull
	if err := a.store.Save(next, changed, changed == nil); err != nil {
		return fmt.Errorf("persisting table: %w", err)
	}
	failpoint.Hit(failpoint.AfterPersist)
	if err := a.sync(ctx, next, changed, full); err != nil {
		// The kernel kept the previous rules; make the cache agree.
		if rerr := a.store.Save(cur, changed, changed == nil); rerr != nil {
			a.log.Error("restoring the cache after a failed sync", "err", rerr)
		}
		return fmt.Errorf("programming table: %w", err)
	}
	failpoint.Hit(failpoint.AfterProgram)
	if changed != nil {
		observeTriggerTimes(resp.GetDelta().GetUpserts(), a.cfg.Families)
	}
	metrics.CacheSavedTimestamp.SetToCurrentTime()
	return nil
}

// sync programs t and, on success, makes it the table in force.
func (a *Agent) sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error {
	start := time.Now()
	if err := a.dp.Sync(ctx, t, changed, full); err != nil {
		a.needFull = true
		return err
	}
	a.needFull = false
	// Sync durations are each family's, observed by its Driver.
	a.saved = t
	a.inForce.Store(t)
	if a.reported != t.Version {
		metrics.AppliedVersion.Reset()
		metrics.AppliedVersion.WithLabelValues(t.Version).Set(1)
		a.reported = t.Version
	}
	a.health.Updated(time.Now(), t.Node.GetToBeDeleted() || t.Node.GetUnregistered())
	for _, f := range a.cfg.AfterSync {
		f(ctx, t)
	}
	a.log.Debug("synced", "version", t.Version, "services", len(t.Entries), "full", full, "changed", len(changed), "took", time.Since(start))
	return nil
}

// observeTriggerTimes records network programming latency for changed
// entries, as kube-proxy does from the endpoints' trigger time: once per
// family of the node that the Service has a cluster IP of, as each of
// kube-proxy's per-family proxiers does for the Services it programs.
func observeTriggerTimes(entries []*pb.ServiceEntry, families []dataplane.Family) {
	now := time.Now()
	for _, e := range entries {
		ts := e.GetTriggerTime()
		if ts == nil || !ts.IsValid() {
			continue
		}
		for _, f := range families {
			if len(f.Addrs(e.GetService().GetClusterIps())) > 0 {
				metrics.NetworkProgrammingDuration.WithLabelValues(f.String()).Observe(now.Sub(ts.AsTime()).Seconds())
			}
		}
	}
}
