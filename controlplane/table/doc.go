// Package table is the control plane's versioned table store.
//
// A [World] is one immutable revision of every computed Service and known
// Node. The [Store] publishes worlds and tells each [Subscription] (one per
// connected agent) which Services changed, recording each one's state before
// the change; it never blocks on a subscriber. A [Cursor], owned by one
// agent's stream goroutine, knows what that agent holds and turns the
// latest world plus the recorded changes into the next Snapshot or Delta,
// already encoded.
//
// No per-node table is ever materialised: a node's table is implied by the
// world and the node's name and zone, and a cursor's memory grows only with
// the changes not yet sent to its agent (bounded by the store's lag limit,
// past which the agent gets a snapshot).
package table
