// Package dataplane declares what the node agent needs from a kernel
// backend. Backends live in subpackages (iptables, and later nftables and
// ipvs); each has a fake for tests.
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
