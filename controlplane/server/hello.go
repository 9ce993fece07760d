package server

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/wire"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// A hello lists a hash for every entry the agent holds: about 40 bytes per
// Service, 400 KB at 10,000. An agent that is current, as every agent is
// after a control plane restart, needs none of it: its version says it
// all. So the entry hashes are split off undecoded, and decoded only for
// an agent whose version this replica does not recognise.

// decodeRequest decodes an agent's message. For a hello it returns the
// encoded entry_hashes fields apart (a Hello message holding only them),
// for lazyEntries to decode when needed.
func decodeRequest(raw []byte) (*pb.SyncRequest, []byte, error) {
	if !hasField(raw, wire.SyncRequestHello) {
		// An ACK, a NACK or a keepalive, as nearly every message is:
		// nothing to split (nor to copy, as splitField would).
		m := &pb.SyncRequest{}
		if err := proto.Unmarshal(raw, m); err != nil {
			return nil, nil, err
		}
		return m, nil, nil
	}
	others, hellos, err := splitField(raw, wire.SyncRequestHello)
	if err != nil {
		return nil, nil, err
	}
	hello, n := lastBytesField(hellos)
	if n != 1 {
		// Not a hello, or one repeated, which proto would merge: decode
		// it all the ordinary way.
		m := &pb.SyncRequest{}
		if err := proto.Unmarshal(raw, m); err != nil {
			return nil, nil, err
		}
		return m, nil, nil
	}
	m := &pb.SyncRequest{}
	if err := proto.Unmarshal(others, m); err != nil {
		return nil, nil, err
	}
	if m.GetKind() != nil {
		return nil, nil, errors.New("a hello and another kind of request in one message")
	}
	rest, entries, err := splitField(hello, wire.HelloEntryHashes)
	if err != nil {
		return nil, nil, err
	}
	h := &pb.Hello{}
	if err := proto.Unmarshal(rest, h); err != nil {
		return nil, nil, err
	}
	m.Kind = &pb.SyncRequest_Hello{Hello: h}
	return m, entries, nil
}

// lazyEntries decodes entry hashes split off by decodeRequest.
func lazyEntries(entries []byte) func() (map[string]uint64, error) {
	return func() (map[string]uint64, error) {
		h := &pb.Hello{}
		if err := proto.Unmarshal(entries, h); err != nil {
			return nil, fmt.Errorf("%w: hello entry hashes: %w", errInvalid, err)
		}
		return h.GetEntryHashes(), nil
	}
}

// hasField says whether message b may hold a field num: true also when b
// is malformed before one is found, so that the caller's decoding reports
// the error.
func hasField(b []byte, num protowire.Number) bool {
	for len(b) > 0 {
		n, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return true
		}
		if n == num {
			return true
		}
		valLen := protowire.ConsumeFieldValue(n, typ, b[tagLen:])
		if valLen < 0 {
			return true
		}
		b = b[tagLen+valLen:]
	}
	return false
}

// lastBytesField returns the content of the last of the length-delimited
// fields b holds (as splitField leaves them), and how many there are.
func lastBytesField(b []byte) ([]byte, int) {
	var last []byte
	n := 0
	for len(b) > 0 {
		_, typ, tagLen := protowire.ConsumeTag(b)
		if typ != protowire.BytesType {
			return nil, 0
		}
		v, vLen := protowire.ConsumeBytes(b[tagLen:])
		last, n = v, n+1
		b = b[tagLen+vLen:]
	}
	return last, n
}

// splitField splits message b into its fields other than num and the
// fields num, each still encoded as fields of the same message. When the
// fields num are contiguous, as a map's entries are when proto marshals
// them, only is a slice of b rather than a copy: a hello's entry hashes
// are most of its bytes.
func splitField(b []byte, num protowire.Number) (rest, only []byte, err error) {
	whole := b
	start, end := -1, -1 // the fields num, while contiguous, are whole[start:end]
	var copied []byte    // or, once they are not, a copy of them
	for off := 0; off < len(whole); {
		b = whole[off:]
		n, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return nil, nil, protowire.ParseError(tagLen)
		}
		valLen := protowire.ConsumeFieldValue(n, typ, b[tagLen:])
		if valLen < 0 {
			return nil, nil, protowire.ParseError(valLen)
		}
		field := b[:tagLen+valLen]
		switch {
		case n != num:
			rest = append(rest, field...)
		case copied != nil:
			copied = append(copied, field...)
		case start < 0:
			start, end = off, off+len(field)
		case off == end:
			end += len(field)
		default:
			copied = append(append(copied, whole[start:end]...), field...)
		}
		off += len(field)
	}
	switch {
	case copied != nil:
		only = copied
	case start >= 0:
		only = whole[start:end:end]
	}
	return rest, only, nil
}
