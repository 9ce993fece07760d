package client

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// A snapshot's entries may come compressed (Snapshot.zstd_entries, which
// the agent asks for with Capabilities.zstd_entries): runs of encoded
// entries, each a zstd frame, that the control plane compresses once and
// sends to every agent of a zone. Inflate puts each frame's content in
// place of its field, so the result is the plain SyncResponse the control
// plane would have sent without compression: it is decoded, validated and
// its hashes checked against its version exactly as one.
//
// Runs may also come without their entries' hashes
// (Snapshot.zstd_entries_unhashed, asked for with
// Capabilities.zstd_entries_unhashed): the hashes are most of what zstd
// cannot shrink. Inflate then computes each entry's hash from its key and
// encoded service (tablehash.EncodedEntry) and puts it in after the key,
// so the result is again the plain response, whose version, the sum of
// the hashes, checks the whole table: an entry changed on the way adds up
// to another version and the snapshot is refused.
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
	unhashedField    = (&pb.Snapshot{}).ProtoReflect().Descriptor().Fields().ByName("zstd_entries_unhashed").Number()
	entriesField     = (&pb.Snapshot{}).ProtoReflect().Descriptor().Fields().ByName("entries").Number()
	entryKeyField    = (&pb.ServiceEntry{}).ProtoReflect().Descriptor().Fields().ByName("key").Number()
	entryHashField   = (&pb.ServiceEntry{}).ProtoReflect().Descriptor().Fields().ByName("hash").Number()
	entryServiceFld  = (&pb.ServiceEntry{}).ProtoReflect().Descriptor().Fields().ByName("service").Number()
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
// compressed entries inflated in place, and the hashes of those that came
// without put in, or msg itself when it holds none. The result is at most
// limit bytes; an error means msg is refused.
func Inflate(msg []byte, limit int) ([]byte, error) {
	out, _, err := inflate(msg, limit)
	return out, err
}

// hashOrigins says which of an inflated snapshot's entries, numbered in
// the order Snapshot.entries decodes them, have hashes Inflate computed
// from the bytes received and which came with the control plane's.
type hashOrigins struct {
	entries  int   // every entry
	computed int   // those whose hashes were computed
	given    []int // the indices of those that came with a hash
}

// ownHashes reports whether every hash of the snapshot o describes is
// known from the bytes received: some were computed, and the rest can be
// checked (verifyGiven) instead of all of them re-encoded.
func (o hashOrigins) ownHashes() bool { return o.computed > 0 }

// inflate is Inflate, and where the hashes of the snapshot's entries come
// from when it has compressed runs (the zero hashOrigins otherwise). Two
// snapshot fields decode merged, their entries in order: they are
// counted on.
func inflate(msg []byte, limit int) ([]byte, hashOrigins, error) {
	var origins hashOrigins
	snap, ok := snapshotOf(msg)
	if !ok || !hasField(snap, zstdEntriesField) && !hasField(snap, unhashedField) {
		return msg, origins, nil
	}
	// The inflated size: every field as it is, every frame as the
	// content size it declares, within limit; entries that come without
	// their hashes grow by one (9 bytes) each, which only their content
	// says: room for one per 72 bytes is made at first, and the output
	// grows if it needs more, never past limit.
	size, unhashed, err := inflatedSize(msg, limit)
	if err != nil {
		return nil, origins, err
	}
	// A snapshot's length is known once it is inflated: room is left for
	// the longest one within limit, and what comes before the snapshot
	// (its tag and the nonce, a few bytes) moved up over what its length
	// did not take.
	lenRoom := protowire.SizeVarint(uint64(limit))
	out := make([]byte, 0, min(size+unhashed/8, limit)+lenRoom)
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
		out = protowire.AppendTag(out, snapshotField, protowire.BytesType)
		at := len(out)
		out = append(out, make([]byte, lenRoom)...)
		if out, err = inflateInto(out, v, limit+lenRoom, &origins); err != nil {
			return nil, hashOrigins{}, err
		}
		inner := uint64(len(out) - at - lenRoom)
		gap := lenRoom - protowire.SizeVarint(inner)
		protowire.AppendVarint(out[at+gap:at+gap], inner)
		copy(out[gap:at+gap], out[:at])
		out = out[gap:]
	}
	if len(out) > limit {
		return nil, hashOrigins{}, fmt.Errorf("%w (%d bytes)", errInflatedTooLarge, limit)
	}
	return out, origins, nil
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
// as the frames declare it, and how much of it is entries that come
// without their hashes; an error when a snapshot does not parse, a frame
// declares no content size, or the total exceeds limit.
func inflatedSize(msg []byte, limit int) (size, unhashed int, err error) {
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
		inner, u, err := snapshotSize(v, limit)
		if err != nil {
			return 0, 0, err
		}
		size += protowire.SizeTag(snapshotField) + protowire.SizeBytes(inner)
		unhashed += u
		if size > limit {
			return 0, 0, fmt.Errorf("%w (%d bytes)", errInflatedTooLarge, limit)
		}
	}
	return size, unhashed, nil
}

// snapshotSize is the size of an encoded Snapshot with its frames inflated
// (without the hashes to put in), and how much of it is unhashed entries.
func snapshotSize(b []byte, limit int) (size, unhashed int, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, fmt.Errorf("snapshot: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return 0, 0, fmt.Errorf("snapshot: %w", protowire.ParseError(m))
		}
		if (num == zstdEntriesField || num == unhashedField) && typ == protowire.BytesType {
			frame, _ := protowire.ConsumeBytes(b[n:])
			want, err := contentSize(frame, limit)
			if err != nil {
				return 0, 0, err
			}
			size += want
			if num == unhashedField {
				unhashed += want
			}
		} else {
			size += n + m
		}
		if size > limit {
			return 0, 0, fmt.Errorf("%w (%d bytes)", errInflatedTooLarge, limit)
		}
		b = b[n+m:]
	}
	return size, unhashed, nil
}

// contentSize is the content size frame declares, at most limit.
func contentSize(frame []byte, limit int) (int, error) {
	var h zstd.Header
	if err := h.Decode(frame); err != nil {
		return 0, fmt.Errorf("compressed entries: %w", err)
	}
	if !h.HasFCS || h.FrameContentSize > uint64(limit) {
		return 0, fmt.Errorf("%w (%d bytes), or of unknown size", errInflatedTooLarge, limit)
	}
	return int(h.FrameContentSize), nil
}

// inflateInto appends the encoded Snapshot b to out with its frames
// inflated in place, and hashes put in the entries of unhashed ones,
// counting its entries in origins; an error when out would grow past
// most. The frames' declared sizes were checked by snapshotSize: the
// decoder writes only into what is allocated for them.
func inflateInto(out, b []byte, most int, origins *hashOrigins) ([]byte, error) {
	// An unhashed frame's content, before its hashes: one buffer for
	// the largest.
	scratch := make([]byte, 0, largestUnhashed(b, most))
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		field := b[:n+m]
		b = b[n+m:]
		if (num != zstdEntriesField && num != unhashedField) || typ != protowire.BytesType {
			if num == entriesField && typ == protowire.BytesType {
				origins.given = append(origins.given, origins.entries)
				origins.entries++
			}
			out = append(out, field...)
			continue
		}
		frame, _ := protowire.ConsumeBytes(field[n:])
		want, _ := contentSize(frame, most) // checked by snapshotSize
		if num == zstdEntriesField {
			var err error
			if out, err = reserve(out, want, most); err != nil {
				return nil, err
			}
			run, err := decodeFrame(frame, out[len(out):len(out):len(out)+want])
			if err != nil {
				return nil, err
			}
			origins.countGiven(run)
			out = out[:len(out)+want]
			continue
		}
		content, err := decodeFrame(frame, scratch[:0:want])
		if err != nil {
			return nil, err
		}
		// What the entries take with their hashes is known now.
		hashed, err := hashedSize(content)
		if err != nil {
			return nil, err
		}
		if out, err = reserve(out, hashed, most); err != nil {
			return nil, err
		}
		var computed int
		if out, computed, err = appendHashed(out, content); err != nil {
			return nil, err
		}
		origins.entries += computed
		origins.computed += computed
	}
	return out, nil
}

// countGiven counts the entries of a run that came with their hashes,
// Snapshot fields as encoded; what is not an entry is left for decoding
// to judge.
func (o *hashOrigins) countGiven(run []byte) {
	for len(run) > 0 {
		num, typ, n := protowire.ConsumeTag(run)
		if n < 0 {
			return
		}
		m := protowire.ConsumeFieldValue(num, typ, run[n:])
		if m < 0 {
			return
		}
		if num == entriesField {
			o.given = append(o.given, o.entries)
			o.entries++
		}
		run = run[n+m:]
	}
}

// largestUnhashed is the largest content size an unhashed frame of the
// encoded Snapshot b declares (checked by snapshotSize: at most limit).
func largestUnhashed(b []byte, limit int) int {
	largest := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if num == unhashedField && typ == protowire.BytesType {
			frame, _ := protowire.ConsumeBytes(b[n:])
			want, _ := contentSize(frame, limit)
			largest = max(largest, want)
		}
		b = b[n+m:]
	}
	return largest
}

// reserve returns out with room for n more bytes, grown (when the first
// guess of the inflated size was short) to at most most bytes; an error
// when n more would take it past most.
func reserve(out []byte, n, most int) ([]byte, error) {
	need := len(out) + n
	if need > most {
		return nil, fmt.Errorf("%w (%d bytes)", errInflatedTooLarge, most)
	}
	if need > cap(out) {
		grown := make([]byte, len(out), min(max(need, 2*cap(out)), most))
		copy(grown, out)
		out = grown
	}
	return out, nil
}

// decodeFrame inflates frame into dst, whose capacity is the content size
// the frame declares. With the cap limit the decoder fails rather than
// grow the slice: a frame that holds more than it declares cannot take
// more memory than was allocated for what it declares.
func decodeFrame(frame, dst []byte) ([]byte, error) {
	got, err := decoder().DecodeAll(frame, dst)
	if err != nil {
		return nil, fmt.Errorf("inflating compressed entries: %w", err)
	}
	if len(got) != cap(dst) {
		return nil, fmt.Errorf("compressed entries inflated to %d bytes, not the %d declared", len(got), cap(dst))
	}
	return got, nil
}

// hashedSize is the size of the Snapshot.entries fields b, which come
// without their hashes, with them; an error when b holds anything else.
// appendHashed checks the entries themselves.
func hashedSize(b []byte) (int, error) {
	size := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("compressed entries: %w", protowire.ParseError(n))
		}
		if num != entriesField || typ != protowire.BytesType {
			return 0, fmt.Errorf("compressed entries without hashes hold field %d, not only entries", num)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return 0, fmt.Errorf("compressed entries: %w", protowire.ParseError(m))
		}
		size += m + hashSize + protowire.SizeVarint(uint64(m+hashSize)) - protowire.SizeVarint(uint64(m))
		size += n
		b = b[n+m:]
	}
	return size, nil
}

// hashSize is what a hash takes in an encoded entry: its tag and 8 bytes.
var hashSize = protowire.SizeTag(entryHashField) + protowire.SizeFixed64()

// appendHashed appends the Snapshot.entries fields b, which come without
// their hashes and which hashedSize found to be only entries, to out with
// each entry's hash computed from its key and encoded service and put in
// after its key, as the control plane encodes an entry, and how many
// entries it appended; an error when an
// entry carries a hash, names its key or service twice, or does not parse.
func appendHashed(out, b []byte) ([]byte, int, error) {
	entries := 0
	for ; len(b) > 0; entries++ {
		_, _, n := protowire.ConsumeTag(b)
		e, m := protowire.ConsumeBytes(b[n:])
		b = b[n+m:]
		key, svc, at, err := entryParts(e)
		if err != nil {
			return nil, 0, err
		}
		h, err := tablehash.EncodedEntry(key, svc)
		if err != nil {
			return nil, 0, fmt.Errorf("compressed entries: %w", err)
		}
		out = protowire.AppendTag(out, entriesField, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(len(e)+hashSize))
		out = append(out, e[:at]...)
		out = protowire.AppendTag(out, entryHashField, protowire.Fixed64Type)
		out = protowire.AppendFixed64(out, h)
		out = append(out, e[at:]...)
	}
	return out, entries, nil
}

// entryParts returns the key and encoded service of the encoded
// ServiceEntry e, which must carry no hash, and where its hash goes: before
// its first field numbered after the hash's, as in field order.
func entryParts(e []byte) (key, svc []byte, at int, err error) {
	at = -1
	var seenKey, seenSvc bool
	for off := 0; off < len(e); {
		num, typ, n := protowire.ConsumeTag(e[off:])
		if n < 0 {
			return nil, nil, 0, fmt.Errorf("compressed entry: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, e[off+n:])
		if m < 0 {
			return nil, nil, 0, fmt.Errorf("compressed entry: %w", protowire.ParseError(m))
		}
		if at < 0 && num > entryHashField {
			at = off
		}
		switch {
		case num == entryHashField:
			return nil, nil, 0, errors.New("a compressed entry without hashes carries a hash")
		case num == entryKeyField && typ == protowire.BytesType && !seenKey:
			v, _ := protowire.ConsumeBytes(e[off+n:])
			key, seenKey = v, true
		case num == entryServiceFld && typ == protowire.BytesType && !seenSvc:
			svc, _ = protowire.ConsumeBytes(e[off+n:])
			seenSvc = true
		case num == entryKeyField || num == entryServiceFld:
			// Decoding would merge or replace what was hashed.
			return nil, nil, 0, fmt.Errorf("compressed entry %q has its field %d twice, or of another type", key, num)
		}
		off += n + m
	}
	if at < 0 {
		at = len(e)
	}
	return key, svc, at, nil
}
