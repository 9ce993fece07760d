// Package hashtable is what a simulated agent keeps of its table: the hash
// of every entry by key, and their sum, never the entries themselves.
//
// Thousands of simulated agents live in one process, and most of them hold
// the same entries: every node of a zone sees the same view of every
// Service, and a node hosting an endpoint of an externalTrafficPolicy
// Local Service differs from its zone in that one entry. So a Table is
// immutable and shared:
//
//   - Tables are interned by the sum of their entry hashes (the version
//     without the node's own hash, which differs on every node), so agents
//     holding the same entries hold one Table, and an agent applying a
//     delta that another agent already applied to the same entries finds
//     the result interned.
//   - A Table is split into buckets by key; a delta copies the bucket
//     array and the buckets it touches (copy-on-write), and buckets are
//     interned by content too, so tables that differ in one entry share
//     every other bucket, whether they came from a snapshot or a delta.
//
// Interning holds weak pointers: a Table or bucket no agent holds any more
// is collected and leaves the intern maps.
package hashtable

import (
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// nBuckets splits a table: at 10,000 entries a bucket holds about 40, so
// a one-entry delta copies 2 KiB of bucket array and one small map, not
// the whole table.
const nBuckets = 256

// ErrUnknownRemoval is returned when a delta removes a key the table does
// not hold; the agent rejects such a delta.
var ErrUnknownRemoval = errors.New("removal of an entry the agent does not hold")

// seed places keys in buckets; one per process, which is all that sharing
// needs.
var seed = maphash.MakeSeed()

// bucket is an immutable part of a table: the entries whose keys hash to
// it, and a digest of its content for interning.
type bucket struct {
	entries map[string]uint64
	digest  uint64
	// hello caches the entries encoded as Hello.entry_hashes fields, built
	// on first use (see HelloParts).
	hello atomic.Pointer[[]byte]
}

// Table is one agent's held entries, by key. It is immutable and shared
// by every agent that holds the same entries.
type Table struct {
	buckets [nBuckets]*bucket // nil is an empty bucket
	sum     uint64
	n       int
}

// Sum is the sum of the entry hashes modulo 2^64: the table's version
// without its node's hash.
func (t *Table) Sum() uint64 { return t.sum }

// Len is the number of entries.
func (t *Table) Len() int { return t.n }

// Get returns the hash of key's entry.
func (t *Table) Get(key string) (uint64, bool) {
	b := t.buckets[bucketOf(key)]
	if b == nil {
		return 0, false
	}
	h, ok := b.entries[key]
	return h, ok
}

// Range calls f for every entry until f returns false.
func (t *Table) Range(f func(key string, hash uint64) bool) {
	for _, b := range t.buckets {
		if b == nil {
			continue
		}
		for k, h := range b.entries {
			if !f(k, h) {
				return
			}
		}
	}
}

// Stats counts what interning saved. Built counts objects created,
// Shared lookups answered by an interned one.
type Stats struct {
	TablesBuilt, TablesShared, BucketsBuilt, BucketsShared uint64
	// LiveTables and LiveBuckets are the interned objects not yet
	// collected.
	LiveTables, LiveBuckets int
}

// Interner builds and shares Tables. It is safe for concurrent use.
type Interner struct {
	mu      sync.Mutex                      // guards everything below
	tables  map[uint64]weak.Pointer[Table]  // by Sum
	buckets map[uint64]weak.Pointer[bucket] // by digest
	keys    map[string]string               // canonical key strings
	stats   Stats
}

// NewInterner returns an empty Interner.
func NewInterner() *Interner {
	return &Interner{
		tables:  map[uint64]weak.Pointer[Table]{},
		buckets: map[uint64]weak.Pointer[bucket]{},
		keys:    map[string]string{},
	}
}

// Empty is the table of an agent that holds nothing.
func Empty() *Table { return &Table{} }

// Stats returns the counters.
func (in *Interner) Stats() Stats {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.stats
	s.LiveTables, s.LiveBuckets = len(in.tables), len(in.buckets)
	return s
}

// Snapshot returns the table holding exactly entries, which the caller
// has validated (no duplicate keys).
func (in *Interner) Snapshot(entries []*pb.ServiceEntry) *Table {
	var sum uint64
	for _, e := range entries {
		sum += e.GetHash()
	}
	if t := in.lookupTable(sum); t != nil && t.n == len(entries) && holdsAll(t, entries) {
		return t
	}
	var parts [nBuckets]map[string]uint64
	for _, e := range entries {
		i := bucketOf(e.GetKey())
		if parts[i] == nil {
			parts[i] = make(map[string]uint64, 2*len(entries)/nBuckets+1)
		}
		parts[i][e.GetKey()] = e.GetHash()
	}
	t := &Table{sum: sum, n: len(entries)}
	for i, m := range parts {
		if m != nil {
			t.buckets[i] = in.internBucket(m, digestOf(m))
		}
	}
	return in.internTable(t)
}

// Apply returns base with removals, then upserts, applied, as the agent
// applies a delta (proxytable.Table.Apply): removing a key not held is an
// error, and an upsert replaces an entry or adds one.
func (in *Interner) Apply(base *Table, upserts []*pb.ServiceEntry, removals []string) (*Table, error) {
	// overlay holds the delta's result per touched key; absent means removed.
	type state struct {
		hash    uint64
		present bool
	}
	overlay := make(map[string]state, len(upserts)+len(removals))
	get := func(k string) (uint64, bool) {
		if s, ok := overlay[k]; ok {
			return s.hash, s.present
		}
		return base.Get(k)
	}
	sum, n := base.sum, base.n
	for _, k := range removals {
		h, ok := get(k)
		if !ok {
			return nil, fmt.Errorf("%s: %w", k, ErrUnknownRemoval)
		}
		sum -= h
		n--
		overlay[k] = state{}
	}
	for _, e := range upserts {
		if h, ok := get(e.GetKey()); ok {
			sum -= h
			n--
		}
		sum += e.GetHash()
		n++
		overlay[e.GetKey()] = state{hash: e.GetHash(), present: true}
	}
	if t := in.lookupTable(sum); t != nil && t.n == n && matches(t, func(yield func(string, uint64, bool) bool) {
		for k, s := range overlay {
			if !yield(k, s.hash, s.present) {
				return
			}
		}
	}) {
		return t, nil
	}
	// Copy-on-write: only the touched buckets are copied.
	next := &Table{buckets: base.buckets, sum: sum, n: n}
	touched := map[int]map[string]uint64{}
	for k, s := range overlay {
		i := bucketOf(k)
		m, ok := touched[i]
		if !ok {
			if b := base.buckets[i]; b != nil {
				m = maps.Clone(b.entries)
			} else {
				m = map[string]uint64{}
			}
			touched[i] = m
		}
		if s.present {
			m[k] = s.hash
		} else {
			delete(m, k)
		}
	}
	for i, m := range touched {
		if len(m) == 0 {
			next.buckets[i] = nil
			continue
		}
		next.buckets[i] = in.internBucket(m, digestOf(m))
	}
	return in.internTable(next), nil
}

// holdsAll reports whether t holds every entry with its hash.
func holdsAll(t *Table, entries []*pb.ServiceEntry) bool {
	for _, e := range entries {
		if h, ok := t.Get(e.GetKey()); !ok || h != e.GetHash() {
			return false
		}
	}
	return true
}

// matches reports whether t agrees with every (key, hash, present) of seq.
func matches(t *Table, seq func(yield func(string, uint64, bool) bool)) bool {
	ok := true
	seq(func(k string, h uint64, present bool) bool {
		got, held := t.Get(k)
		ok = held == present && (!present || got == h)
		return ok
	})
	return ok
}

func bucketOf(key string) int { return int(maphash.String(seed, key) % nBuckets) }

// digestOf sums a mix of each key and hash: order does not matter, and
// equal content gives equal digests. A collision only costs a comparison.
func digestOf(m map[string]uint64) uint64 {
	var d uint64
	for k, h := range m {
		d += mix(maphash.String(seed, k) ^ h)
	}
	return d
}

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func (in *Interner) lookupTable(sum uint64) *Table {
	in.mu.Lock()
	defer in.mu.Unlock()
	if wp, ok := in.tables[sum]; ok {
		if t := wp.Value(); t != nil {
			in.stats.TablesShared++
			return t
		}
	}
	return nil
}

// internTable returns the interned table with t's sum if one appeared
// meanwhile (built by another agent), else interns t. A different table
// with the same sum (a collision) stays un-interned.
func (in *Interner) internTable(t *Table) *Table {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.stats.TablesBuilt++
	if wp, ok := in.tables[t.sum]; ok && wp.Value() != nil {
		return t
	}
	in.tables[t.sum] = weak.Make(t)
	runtime.AddCleanup(t, in.forgetTable, t.sum)
	return t
}

func (in *Interner) forgetTable(sum uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if wp, ok := in.tables[sum]; ok && wp.Value() == nil {
		delete(in.tables, sum)
	}
}

// internBucket returns an interned bucket equal to m, or interns a new
// one holding m (which the caller gives up).
func (in *Interner) internBucket(m map[string]uint64, digest uint64) *bucket {
	in.mu.Lock()
	defer in.mu.Unlock()
	if wp, ok := in.buckets[digest]; ok {
		if b := wp.Value(); b != nil && maps.Equal(b.entries, m) {
			in.stats.BucketsShared++
			return b
		}
	}
	in.stats.BucketsBuilt++
	// Canonical key strings: a bucket built from a decoded snapshot would
	// otherwise keep that message's strings alive.
	canon := make(map[string]uint64, len(m))
	for k, h := range m {
		canon[in.keyLocked(k)] = h
	}
	b := &bucket{entries: canon, digest: digest}
	if wp, ok := in.buckets[digest]; !ok || wp.Value() == nil {
		in.buckets[digest] = weak.Make(b)
		runtime.AddCleanup(b, in.forgetBucket, digest)
	}
	return b
}

func (in *Interner) forgetBucket(digest uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if wp, ok := in.buckets[digest]; ok && wp.Value() == nil {
		delete(in.buckets, digest)
	}
}

// keyLocked returns the canonical copy of k. The key set is the cluster's
// Services, which bounds the map.
func (in *Interner) keyLocked(k string) string {
	if c, ok := in.keys[k]; ok {
		return c
	}
	in.keys[k] = k
	return k
}
