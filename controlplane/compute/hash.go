package compute

import (
	"fmt"
	"strconv"

	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// Hashes must be equal on every replica and across restarts, and agents
// recompute them from what they receive: their definition lives in
// package tablehash, shared with the node agent.

// entryHash derives a ServiceEntry's hash from its key and its parts.
func entryHash(key string, shared, local uint64) uint64 {
	return tablehash.Combine(key, shared, local)
}

// FormatVersion renders a table version: the sum, modulo 2^64, of the
// table's entry hashes and its node hash. A sum, unlike a hash of the whole
// table, can be updated in O(1) when one entry changes.
func FormatVersion(sum uint64) string { return fmt.Sprintf("%016x", sum) }

// ParseVersion is the inverse of FormatVersion.
func ParseVersion(v string) (uint64, error) {
	if len(v) != 16 {
		return 0, fmt.Errorf("version %q: want 16 hex digits", v)
	}
	sum, err := strconv.ParseUint(v, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("version %q: %w", v, err)
	}
	return sum, nil
}
