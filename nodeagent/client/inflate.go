package client

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// A snapshot's entries may come compressed (Snapshot.zstd_entries, which
// the agent asks for with Capabilities.zstd_entries): runs of encoded
// entries, each a zstd frame, that the control plane compresses once and
// sends to every agent of a zone. Inflate puts each frame's content in
// place of its field, so the result is the plain SyncResponse the control
// plane would have sent without compression: it is decoded, validated and
// its hashes checked against its version exactly as one.
//
// A frame is data from the network: a rogue or broken replica could send
// one that inflates to gigabytes. Nothing is inflated beyond the limit
// that bounds a response on the wire (MaxRecvMessageBytes): every frame
// must declare its content size, the output is allocated for what the
// frames declare within that limit, and the decoder refuses to write past
// the allocation whatever the frame holds.

// Field numbers, from the generated descriptors rather than by hand.
var (
	snapshotField    = (&pb.SyncResponse{}).ProtoReflect().Descriptor().Fields().ByName("snapshot").Number()
	zstdEntriesField = (&pb.Snapshot{}).ProtoReflect().Descriptor().Fields().ByName("zstd_entries").Number()
)

// maxWindow bounds the history a frame may ask the decoder to keep. The
// control plane's frames are single segments, whose window is their
// content: a run of entries, tens of KiB, or one large entry. Inflating
// into the output (DecodeAll) keeps no history apart from it.
const maxWindow = 64 << 20

// decoder inflates frames. DecodeAll is safe for concurrent use; with its
// cap limit it writes only into the capacity it is given.
var decoder = sync.OnceValue(func() *zstd.Decoder {
	d, err := zstd.NewReader(nil,
		zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxWindow(maxWindow),
		zstd.WithDecoderConcurrency(0),
	)
	if err != nil {
		panic("zstd decoder: " + err.Error()) // fixed, valid options
	}
	return d
})

// errInflatedTooLarge is returned for compressed entries whose content
// would take the response over its limit.
var errInflatedTooLarge = errors.New("compressed entries inflate beyond the response size limit")

// Inflate returns the encoded SyncResponse msg with its snapshot's
// compressed entries inflated in place, or msg itself when it holds none.
// The result is at most limit bytes; an error means msg is refused.
func Inflate(msg []byte, limit int) ([]byte, error) {
	snap, ok := snapshotOf(msg)
	if !ok || !hasField(snap, zstdEntriesField) {
		return msg, nil
	}
	// The inflated size: every field as it is, every frame as the
	// content size it declares, within limit.
	size, err := inflatedSize(msg, limit)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, size)
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		field := b[:n+m]
		b = b[n+m:]
		if num != snapshotField || typ != protowire.BytesType {
			out = append(out, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		inner, _ := snapshotSize(v, limit) // checked by inflatedSize
		out = protowire.AppendTag(out, snapshotField, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(inner))
		if out, err = inflateInto(out, v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// snapshotOf returns the content of msg's last snapshot field, and whether
// msg parses and has one. A message that does not parse is left to the
// decoder, which says why.
func snapshotOf(msg []byte) ([]byte, bool) {
	var snap []byte
	found := false
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, false
		}
		if num == snapshotField && typ == protowire.BytesType {
			snap, _ = protowire.ConsumeBytes(b[n:])
			found = true
		}
		b = b[n+m:]
	}
	return snap, found
}

// hasField reports whether message b has a length-delimited field num
// (b parses: snapshotOf checked the message around it, not b itself).
func hasField(b []byte, num protowire.Number) bool {
	for len(b) > 0 {
		n, typ, tl := protowire.ConsumeTag(b)
		if tl < 0 {
			return false
		}
		vl := protowire.ConsumeFieldValue(n, typ, b[tl:])
		if vl < 0 {
			return false
		}
		if n == num && typ == protowire.BytesType {
			return true
		}
		b = b[tl+vl:]
	}
	return false
}

// inflatedSize is the size of msg with every snapshot's frames inflated,
// as the frames declare it; an error when a snapshot does not parse, a
// frame declares no content size, or the total exceeds limit.
func inflatedSize(msg []byte, limit int) (int, error) {
	size := 0
	for b := msg; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		field := b[:n+m]
		b = b[n+m:]
		if num != snapshotField || typ != protowire.BytesType {
			size += len(field)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		inner, err := snapshotSize(v, limit)
		if err != nil {
			return 0, err
		}
		size += protowire.SizeTag(snapshotField) + protowire.SizeBytes(inner)
		if size > limit {
			return 0, fmt.Errorf("%w (%d bytes)", errInflatedTooLarge, limit)
		}
	}
	return size, nil
}

// snapshotSize is the size of an encoded Snapshot with its frames inflated.
func snapshotSize(b []byte, limit int) (int, error) {
	size := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("snapshot: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return 0, fmt.Errorf("snapshot: %w", protowire.ParseError(m))
		}
		if num == zstdEntriesField && typ == protowire.BytesType {
			frame, _ := protowire.ConsumeBytes(b[n:])
			var h zstd.Header
			if err := h.Decode(frame); err != nil {
				return 0, fmt.Errorf("compressed entries: %w", err)
			}
			if !h.HasFCS || h.FrameContentSize > uint64(limit) {
				return 0, fmt.Errorf("%w (%d bytes), or of unknown size", errInflatedTooLarge, limit)
			}
			size += int(h.FrameContentSize)
		} else {
			size += n + m
		}
		if size > limit {
			return 0, fmt.Errorf("%w (%d bytes)", errInflatedTooLarge, limit)
		}
		b = b[n+m:]
	}
	return size, nil
}

// inflateInto appends the encoded Snapshot b to out with its frames
// inflated in place. out has the capacity snapshotSize says b needs: the
// decoder writes only into it.
func inflateInto(out, b []byte) ([]byte, error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		field := b[:n+m]
		b = b[n+m:]
		if num != zstdEntriesField || typ != protowire.BytesType {
			out = append(out, field...)
			continue
		}
		frame, _ := protowire.ConsumeBytes(field[n:])
		var h zstd.Header
		_ = h.Decode(frame) // checked by snapshotSize
		want := int(h.FrameContentSize)
		// With the cap limit the decoder fails rather than grow the
		// slice: a frame that holds more than it declares cannot take
		// more memory than was allocated for what it declares.
		got, err := decoder().DecodeAll(frame, out[len(out):len(out):len(out)+want])
		if err != nil {
			return nil, fmt.Errorf("inflating compressed entries: %w", err)
		}
		if len(got) != want {
			return nil, fmt.Errorf("compressed entries inflated to %d bytes, not the %d declared", len(got), want)
		}
		out = out[:len(out)+want]
	}
	return out, nil
}
