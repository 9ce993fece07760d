// Package server serves node tables over gRPC: the agents' Sync streams,
// the read-only WatchTable debug stream, the ListNodes and ListEvents
// status RPCs and Explain.
//
// Each Sync stream is owned by one goroutine, which holds the agent's
// table.Cursor and is the only one to send on the stream. A receive
// goroutine feeds it the agent's messages, and a send goroutine performs
// the (possibly blocking) writes so the owner can enforce a write deadline:
// a peer that stops reading is cut off instead of pinning the stream. The
// store never waits for any stream, so one slow or dead agent delays no
// other.
package server
