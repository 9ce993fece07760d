package compute

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Hashes must be equal on every replica and across restarts, so they use a
// fixed, unseeded function (xxHash64) over deterministic encodings. They
// detect change; they are not a security boundary.

// entryHash derives a ServiceEntry's hash from its key and its parts.
func entryHash(key string, shared, local uint64) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString(key)
	var b [17]byte // a zero byte keeps the key from running into the hashes
	binary.LittleEndian.PutUint64(b[1:], shared)
	binary.LittleEndian.PutUint64(b[9:], local)
	_, _ = d.Write(b[:])
	return d.Sum64()
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
