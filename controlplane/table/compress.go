package table

import (
	"sync"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// A zone view is compressed once, the first time an agent that announced
// Capabilities.zstd_entries needs a snapshot of it, and every such agent's
// snapshot references the same frames: a cold start of thousands of agents
// costs one compression per view, as it costs one encoding.
//
// The view is cut into runs of whole entries, each its own zstd frame
// (Snapshot.zstd_entries), so that a node with entries special to it
// replaces only the runs that hold them, sent plain with its own entries
// spliced in, and shares the rest. zstd's fastest level compresses these
// tables as well as its default does, in a few milliseconds per view. At
// 10,000 Services (1.6 MB a view) in runs of 32 KiB the view compresses
// 6.6x; a node's whole snapshot 5.6x on average at 1,000 nodes and 6.4x
// at 5,000, where fewer nodes have special entries (eTP Local endpoints,
// hints): runs of 8 KiB lose on the shared runs, runs of 64 KiB on the
// plain ones. Runs without hashes, for agents that compute them, are 60%
// of that; fastest at 32 KiB is still the choice there
// (BenchmarkCompressView: zstd's best level saves 8% of a node's
// snapshot at 5,000 nodes for ten times the CPU per view, and a view is
// compressed again in every world a snapshot is needed of).

// runBytes is the plain size after which a run is cut.
const runBytes = 32 << 10

// encoder compresses runs. EncodeAll is safe for concurrent use. Single
// segments declare their content size however small (zstd leaves it out
// of other frames under 256 bytes), which the agent needs to bound what
// it inflates, and need no window beyond the content.
var encoder = sync.OnceValue(func() *zstd.Encoder {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithSingleSegment(true))
	if err != nil {
		panic("zstd encoder: " + err.Error()) // fixed, valid options
	}
	return e
})

// compression is how a cursor's snapshots carry the zone view's entries.
type compression uint8

const (
	// plain entries (Snapshot.entries): the agent announced no compression.
	uncompressed compression = iota
	// hashed runs (Snapshot.zstd_entries), for Capabilities.zstd_entries.
	hashed
	// unhashed runs (Snapshot.zstd_entries_unhashed), for
	// Capabilities.zstd_entries_unhashed: every entry without its hash
	// field, which the agent computes from the entry. The hashes are 8
	// bytes of entropy per entry that zstd cannot shrink, 40% of a
	// hashed run compressed.
	unhashed
)

// run is one compressed run of a zone view: entries [first, end), encoded
// as one Snapshot.zstd_entries or zstd_entries_unhashed field, tag and
// length included.
type run struct {
	first, end int
	field      []byte
}

// runs returns the view's compressed runs of kind c (hashed or unhashed),
// compressing on first use.
func (zv *zoneView) runs(c compression) []run {
	k := c - hashed
	zv.runsOnce[k].Do(func() { zv.compressed[k] = zv.cut(c, encoder(), runBytes) })
	return zv.compressed[k]
}

// cut cuts the view into runs of whole entries of at most size plain bytes
// (or one entry), each compressed by enc as one frame of kind c.
func (zv *zoneView) cut(c compression, enc *zstd.Encoder, size int) []run {
	num := wire.SnapshotZstdEntries
	if c == unhashed {
		num = wire.SnapshotZstdEntriesUnhashed
	}
	var runs []run
	var stripped []byte // a run without hashes, reused
	n := len(zv.hashes)
	for first := 0; first < n; {
		end := first + 1
		for end < n && zv.offsets[end+1]-zv.offsets[first] <= size {
			end++
		}
		content := zv.body[zv.offsets[first]:zv.offsets[end]]
		if c == unhashed {
			stripped = stripHashes(stripped[:0], content)
			content = stripped
		}
		frame := enc.EncodeAll(content, nil)
		field := protowire.AppendTag(make([]byte, 0, len(frame)+8), num, protowire.BytesType)
		field = protowire.AppendBytes(field, frame)
		runs = append(runs, run{first: first, end: end, field: field})
		first = end
	}
	return runs
}

// stripHashes appends the encoded Snapshot.entries fields b to dst with
// every entry's hash field left out. b is a zone view's body, which this
// package wrote (appendEntry): it parses.
func stripHashes(dst, b []byte) []byte {
	for len(b) > 0 {
		_, _, n := protowire.ConsumeTag(b)
		entry, m := protowire.ConsumeBytes(b[n:])
		b = b[n+m:]
		size := len(entry)
		if i, j := hashField(entry); i < j {
			size -= j - i
			dst = protowire.AppendTag(dst, wire.SnapshotEntries, protowire.BytesType)
			dst = protowire.AppendVarint(dst, uint64(size))
			dst = append(dst, entry[:i]...)
			dst = append(dst, entry[j:]...)
			continue
		}
		dst = protowire.AppendTag(dst, wire.SnapshotEntries, protowire.BytesType)
		dst = protowire.AppendBytes(dst, entry)
	}
	return dst
}

// hashField returns where the encoded ServiceEntry e holds its hash field,
// e[i:j], or i == j when it holds none.
func hashField(e []byte) (i, j int) {
	for off := 0; off < len(e); {
		num, typ, n := protowire.ConsumeTag(e[off:])
		m := protowire.ConsumeFieldValue(num, typ, e[off+n:])
		if n < 0 || m < 0 {
			return 0, 0
		}
		if num == wire.ServiceEntryHash {
			return off, off + n + m
		}
		off += n + m
	}
	return 0, 0
}
