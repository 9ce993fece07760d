// Package status is `controlplane status`: an operator's view of every
// node's sync state across the control plane's replicas.
//
// Each replica knows only the agents connected to it, so the command asks
// every replica given for ListNodes (Query), merges the answers into one
// row per node (Merge: the replica the node's agent is connected to,
// what it acknowledged, how long it has been behind that replica's
// current world, its last NACK) and prints them as a table or as JSON
// (WriteTable, WriteJSON). Merging and rendering are pure; only Query
// does I/O.
package status
