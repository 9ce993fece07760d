// Package contract is what the fleet harness and its child processes (the
// simulated agents, the peer's informer sets and the gRPC floor) agree
// on: node names, the ready line a child prints, the local control
// endpoint it serves, and the JSON reports it serves there.
package contract

import "fmt"

// NodeName is the name of node i.
func NodeName(prefix string, i int) string { return fmt.Sprintf("%s%05d", prefix, i) }

// Ready is the one JSON line a child prints on stdout once its control
// endpoint listens.
type Ready struct {
	// Control is the child's HTTP control endpoint, 127.0.0.1:port.
	Control string `json:"control"`
}

// Counters are cumulative since the agents' process started; the harness
// subtracts them between phases.
type Counters struct {
	// Snapshots, Deltas and Keepalives received.
	Snapshots, Deltas, Keepalives uint64
	// SnapshotBytes and DeltaBytes are table response payload bytes, as
	// encoded on the wire before gRPC's framing.
	SnapshotBytes, DeltaBytes uint64
	// WireBytes are bytes read from the agents' TCP connections: every
	// response, keepalive and HTTP/2 frame.
	WireBytes uint64
	// Acks and Nacks sent.
	Acks, Nacks uint64
	// Sessions opened (hello sent); Reconnects are sessions after each
	// agent's first; Failures are sessions that could not open.
	Sessions, Reconnects, Failures uint64
	// TrackDropped counts changes seen beyond the tracker's bound.
	TrackDropped uint64
}

// AgentsReport is the simulated agents' state, served at /report.
type AgentsReport struct {
	// Now is when the report was built (Unix nanoseconds).
	Now int64 `json:"now"`
	// Agents is the number of agents; Started when they were started
	// (0 before /start).
	Agents  int   `json:"agents"`
	Started int64 `json:"started"`
	// Connected agents have an open stream (hello sent).
	Connected int `json:"connected"`
	// Valid agents hold a validated table they ACKed.
	Valid int `json:"valid"`
	// FirstAckMax is the latest first ACK among the agents, 0 while one
	// has none.
	FirstAckMax int64 `json:"firstAckMax"`
	// SessionStartMax is the latest hello among connected agents;
	// Disconnected agents are not counted.
	SessionStartMax int64 `json:"sessionStartMax"`
	// LastAckMax is the latest ACK of any agent.
	LastAckMax int64 `json:"lastAckMax"`
	// Counters are the totals.
	Counters Counters `json:"counters"`
	// NackErrors are the first few NACK messages.
	NackErrors []string `json:"nackErrors,omitempty"`
	// SessionEnds counts why sessions ended, by error message (the
	// first few distinct ones).
	SessionEnds map[string]uint64 `json:"sessionEnds,omitempty"`
	// Versions is each agent's held version, by node name (on request).
	Versions map[string]string `json:"versions,omitempty"`
	// SessionStarts is each connected agent's hello time, by node name
	// (on request, with Versions).
	SessionStarts map[string]int64 `json:"sessionStarts,omitempty"`
	// Replicas counts the agents with an open stream to each control
	// plane address; Addresses is each such agent's address, by node
	// name (on request, with Versions).
	Replicas  map[string]int    `json:"replicas,omitempty"`
	Addresses map[string]string `json:"addresses,omitempty"`
	// Tables describes the shared hash tables.
	Tables TableStats `json:"tables"`
	// Changes are the tracked changes, oldest first.
	Changes []ChangeReport `json:"changes,omitempty"`
	// HeapInuse is the agents' process's Go heap in use.
	HeapInuse uint64 `json:"heapInuse"`
}

// TableStats counts the agents' shared tables.
type TableStats struct {
	Built, Shared, BucketsBuilt, BucketsShared uint64
	Live, LiveBuckets                          int
}

// ChangeReport is what the agents saw of one change: every entry
// carrying its trigger time, or a later one of the same Service (a later
// change superseding it before it reached an agent).
type ChangeReport struct {
	// Trigger is the change's trigger time (Unix nanoseconds), Key its
	// Service.
	Trigger int64  `json:"trigger"`
	Key     string `json:"key"`
	// Reached agents received a response containing it; Acked ACKed one.
	Reached int `json:"reached"`
	Acked   int `json:"acked"`
	// LastReach and LastAck are the latest such times among the agents
	// (Unix nanoseconds).
	LastReach int64 `json:"lastReach"`
	LastAck   int64 `json:"lastAck"`
	// AckedBy is a bitmap of agent indexes that ACKed it (on request).
	AckedBy []byte `json:"ackedBy,omitempty"`
}

// PeerReport is the peer's informer sets' state, served at /report.
type PeerReport struct {
	// Now is when the report was built (Unix nanoseconds).
	Now int64 `json:"now"`
	// Sets is the number of informer sets; Synced how many have synced
	// all four informers, SyncedMax when the last did (Unix nanoseconds).
	Sets      int   `json:"sets"`
	Synced    int   `json:"synced"`
	Started   int64 `json:"started"`
	SyncedMax int64 `json:"syncedMax"`
	// WireBytes are bytes read from the sets' connections to the API
	// server (TLS records: every list, watch event and HTTP/2 frame).
	WireBytes uint64 `json:"wireBytes"`
	// BodyBytes are response body bytes as the clients read them.
	BodyBytes uint64 `json:"bodyBytes"`
	// SliceUpdatesMin is the fewest EndpointSlice update events any set
	// has seen; Events counts every event of every set.
	SliceUpdatesMin uint64 `json:"sliceUpdatesMin"`
	Events          uint64 `json:"events"`
	// Errors are the first few watch errors.
	Errors []string `json:"errors,omitempty"`
	// HeapInuse is the peer process's Go heap in use.
	HeapInuse uint64 `json:"heapInuse"`
}
