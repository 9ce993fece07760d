// Package dataplane declares what the node agent needs from a kernel
// backend. The backends live in subpackages iptables, nftables and ipvs,
// each with fakes for its tests. Beside them, plan holds what the backends
// compute alike from the proxy table, tool runs the command-line tools the
// iptables and IPVS backends use, and dptest is what their tests share.
package dataplane

import (
	"context"

	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Dataplane programs a node's proxy table into the kernel.
//
// Sync makes the kernel forward as t says. With full it rewrites every rule
// the backend owns and removes stale ones; otherwise it rewrites only what
// the entries in changed need (keys upserted or removed since the last
// successful Sync), which the caller guarantees is complete. A backend
// applies each Sync atomically: when Sync fails, the rules of the previous
// successful Sync stay in force, and the caller may retry (with full).
// Sync is idempotent and not safe for concurrent use: the agent's sync loop
// owns the backend.
type Dataplane interface {
	Sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error
}

// Join programs several dataplanes as one, in order: one per IP family.
// Each applies its part atomically; if a later one fails, the earlier ones
// keep the new rules, and the caller's retry (with full) converges them.
func Join(dps ...Dataplane) Dataplane { return joined(dps) }

type joined []Dataplane

func (j joined) Sync(ctx context.Context, t *proxytable.Table, changed []string, full bool) error {
	for _, dp := range j {
		if err := dp.Sync(ctx, t, changed, full); err != nil {
			return err
		}
	}
	return nil
}
