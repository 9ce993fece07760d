// Package dataplane is the core every kernel backend of the node agent
// shares: the Dataplane the agent drives, the Settings every backend takes
// (one Family, one masquerade bit, one validation), and the Driver that
// runs a Backend (the context, full or partial, failure accounting through
// one Observer, drift checks). A backend implements the small Backend
// interface and holds only its own rendering and kernel seam.
//
// The backends live in subpackages iptables, nftables and ipvs, each with
// fakes for its tests. Beside them, plan holds what the backends compute
// alike from the proxy table, xtables what the iptables and IPVS backends
// share of iptables, tool runs command-line tools, and dptest is what the
// backends' tests share.
//
// # Adding a dataplane
//
// A new dataplane is one package and two lines elsewhere. The package
// holds a Config that embeds Settings beside its own fields (with
// DefaultConfig and Validate), a type implementing Backend (Prepare
// returns the fingerprint of what every rule depends on, Full and Partial
// render and program, Forget drops what it believes the kernel holds; a
// DriftChecker when trusting that memory could miss changes made behind
// its back), New returning a Driver over it, its kernel seam with a fake,
// and a README. The lines are its mode in nodeagent/app's modes and in
// internal/flowsuite's dataplaneKinds, which runs every Service feature
// through it with real packets. Everything the Driver does (context,
// full or partial, failure accounting, drift checks, the metrics hook)
// comes with it.
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
