// Package cache persists the node agent's proxy table in a bbolt file, so
// that a restarted agent programs the kernel before it reaches the control
// plane ("persist, then program, then ACK").
//
// # Layout
//
// The file holds two buckets:
//
//	meta     schema    format version of this layout, "1" (decimal)
//	         version   the table's version (16 hex digits)
//	         node      the NodeInfo, protobuf
//	         saved_at  when the table was saved, RFC 3339 with nanoseconds
//	entries  <key>     the ServiceEntry stored under its "namespace/name",
//	                   protobuf (deterministic)
//
// A file with neither bucket is an empty cache: the agent never saved a
// table, or saved the empty one.
//
// # Atomicity and durability
//
// Save writes the meta keys and the changed entries in one bbolt
// transaction, so the file always holds one whole table, and it returns
// only after bbolt has fsynced the data and then the meta page (NoSync is
// left false): a table is on disk before the agent programs or ACKs it.
//
// # Corruption
//
// Load trusts nothing it reads: every entry is decoded, the whole table
// is validated with proxytable.FromEntries, which checks that the entries
// add up to the stored version, and every hash is recomputed from its
// content (proxytable.VerifyHashes): a planted entry under an honest hash
// is corruption like any other. bbolt itself trusts its pages and may
// panic, or fault on memory beyond the end of a truncated file; Open and
// Load turn both into errors (debug.SetPanicOnFault and recover). Open
// moves a cache it cannot read aside to "<path>.corrupt-<UTC time>", logs
// why at Error level and starts empty: the agent then waits for the
// control plane. Nothing is deleted, so an operator can still inspect the
// old file.
//
// # Locking
//
// bbolt takes an flock on the file: exclusive for the agent, shared for
// OpenReadOnly. Two agents on one node therefore cannot both write the
// cache: the second fails with ErrLocked after a few seconds instead of
// hanging. The same lock makes OpenReadOnly fail while the agent runs; see
// OpenReadOnly for why the package does not copy the file instead.
package cache
