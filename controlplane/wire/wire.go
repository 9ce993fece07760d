// Package wire holds every protobuf field number that the control plane
// encodes or decodes by hand rather than through the generated types.
//
// Table responses are spliced from parts encoded once and shared by many
// agents (package table), and a hello's entry hashes are split off
// undecoded (package server); both need field numbers at compile time.
// Keeping them in this one file, checked against the generated descriptors
// by wire_test.go, means a renamed or renumbered field in
// proto/proxyplane/v1 fails a test here instead of an agent's decode.
//
// Every constant is named after its message and field. A new hand-written
// field belongs here, with a row in the test's table.
package wire

import "google.golang.org/protobuf/encoding/protowire"

// Fields of proxyplane.v1.SyncRequest and Hello that the server splits
// apart without decoding.
const (
	// SyncRequestHello is SyncRequest.hello (Hello, in oneof kind).
	SyncRequestHello protowire.Number = 1
	// HelloEntryHashes is Hello.entry_hashes (map<string, fixed64>).
	HelloEntryHashes protowire.Number = 4
)

// Fields of the response envelopes, whose heads the server writes in front
// of a pre-encoded Snapshot or Delta.
const (
	// SyncResponseNonce is SyncResponse.nonce (string).
	SyncResponseNonce protowire.Number = 1
	// SyncResponseSnapshot is SyncResponse.snapshot (Snapshot, in oneof kind).
	SyncResponseSnapshot protowire.Number = 2
	// SyncResponseDelta is SyncResponse.delta (Delta, in oneof kind).
	SyncResponseDelta protowire.Number = 3

	// WatchTableResponseSnapshot is WatchTableResponse.snapshot (Snapshot,
	// in oneof kind).
	WatchTableResponseSnapshot protowire.Number = 1
	// WatchTableResponseDelta is WatchTableResponse.delta (Delta, in oneof
	// kind).
	WatchTableResponseDelta protowire.Number = 2
)

// Fields of proxyplane.v1.Snapshot, assembled by package table.
const (
	// SnapshotVersion is Snapshot.version (string).
	SnapshotVersion protowire.Number = 1
	// SnapshotNode is Snapshot.node (NodeInfo).
	SnapshotNode protowire.Number = 2
	// SnapshotEntries is Snapshot.entries (repeated ServiceEntry).
	SnapshotEntries protowire.Number = 3
	// SnapshotResourceVersion is Snapshot.resource_version (uint64).
	SnapshotResourceVersion protowire.Number = 4
	// SnapshotZstdEntries is Snapshot.zstd_entries (repeated bytes): runs
	// of entries compressed once per zone view (package table), which the
	// agent's codec inflates in place (nodeagent/client).
	SnapshotZstdEntries protowire.Number = 5
	// SnapshotZstdEntriesUnhashed is Snapshot.zstd_entries_unhashed
	// (repeated bytes): the same runs with every entry's hash left out.
	SnapshotZstdEntriesUnhashed protowire.Number = 6
)

// Fields of proxyplane.v1.Delta, assembled by package table.
const (
	// DeltaBaseVersion is Delta.base_version (string).
	DeltaBaseVersion protowire.Number = 1
	// DeltaVersion is Delta.version (string).
	DeltaVersion protowire.Number = 2
	// DeltaNode is Delta.node (NodeInfo).
	DeltaNode protowire.Number = 3
	// DeltaUpserts is Delta.upserts (repeated ServiceEntry).
	DeltaUpserts protowire.Number = 4
	// DeltaRemovals is Delta.removals (repeated string).
	DeltaRemovals protowire.Number = 5
	// DeltaResourceVersion is Delta.resource_version (uint64).
	DeltaResourceVersion protowire.Number = 6
)

// Fields of proxyplane.v1.ServiceEntry, assembled by package table around
// a Service encoded by package compute.
const (
	// ServiceEntryKey is ServiceEntry.key (string).
	ServiceEntryKey protowire.Number = 1
	// ServiceEntryHash is ServiceEntry.hash (fixed64).
	ServiceEntryHash protowire.Number = 2
	// ServiceEntryService is ServiceEntry.service (Service).
	ServiceEntryService protowire.Number = 3
	// ServiceEntryTriggerTime is ServiceEntry.trigger_time
	// (google.protobuf.Timestamp).
	ServiceEntryTriggerTime protowire.Number = 4
)

// Fields of google.protobuf.Timestamp, which package table writes for
// ServiceEntry.trigger_time.
const (
	// TimestampSeconds is Timestamp.seconds (int64).
	TimestampSeconds protowire.Number = 1
	// TimestampNanos is Timestamp.nanos (int32).
	TimestampNanos protowire.Number = 2
)
