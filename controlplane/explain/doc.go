// Package explain is `controlplane explain`: what one node programs for
// one Service, and why, as the control plane computed it.
//
// It asks every replica given for TableService.Explain (Query) and keeps
// the answer of the replica the node's agent is connected to, the only
// one that knows what the agent acknowledged (Pick), then prints it for a
// person or as JSON (WriteText, WriteJSON). The explanation itself is the
// control plane's: the endpoints it names are those of the node's table,
// chosen by the same computation. Picking and rendering are pure; only
// Query does I/O. Connection flags and terminal-safe escaping are
// `controlplane status`'s.
package explain
