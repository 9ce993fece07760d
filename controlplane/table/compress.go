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
// plain ones.

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

// run is one compressed run of a zone view: entries [first, end), encoded
// as one Snapshot.zstd_entries field, tag and length included.
type run struct {
	first, end int
	field      []byte
}

// runs returns the view's compressed runs, compressing on first use.
func (zv *zoneView) runs() []run {
	zv.runsOnce.Do(func() {
		enc := encoder()
		n := len(zv.hashes)
		for first := 0; first < n; {
			end := first + 1
			for end < n && zv.offsets[end+1]-zv.offsets[first] <= runBytes {
				end++
			}
			frame := enc.EncodeAll(zv.body[zv.offsets[first]:zv.offsets[end]], nil)
			field := protowire.AppendTag(make([]byte, 0, len(frame)+8), wire.SnapshotZstdEntries, protowire.BytesType)
			field = protowire.AppendBytes(field, frame)
			zv.compressed = append(zv.compressed, run{first: first, end: end, field: field})
			first = end
		}
	})
	return zv.compressed
}
