package client

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// response is a Sync response as received: decoded, or the reason it
// could not be and the nonce read from what could.
type response struct {
	msg *pb.SyncResponse
	// err is the decode error; then msg is nil and nonce is the
	// response's nonce when its top level could be read.
	err   error
	nonce string
	// hashesKnown is set for a snapshot every hash of which was computed
	// from the bytes received (runs without hashes) or checked against
	// them: the agent need not re-encode its entries to check them.
	hashesKnown bool
}

// responseCodec decodes Sync responses into a *response itself, so that
// bytes that are not a SyncResponse become a NACK and a reconnect rather
// than a transport error that says nothing to the control plane. It
// inflates compressed snapshot entries first (Inflate), to at most
// maxBytes, the bound on a response on the wire. Requests are encoded by
// the proto codec it wraps, whose name it keeps.
type responseCodec struct {
	encoding.CodecV2
	maxBytes int
}

// syncCodec is the codec the Sync stream is opened with, for responses of
// at most maxBytes, inflated or not.
func syncCodec(maxBytes int) responseCodec {
	return responseCodec{CodecV2: encoding.GetCodecV2("proto"), maxBytes: maxBytes}
}

// Unmarshal implements encoding.CodecV2.
func (c responseCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*response)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	// proto.Unmarshal copies what it keeps: the buffer can go back to
	// the pool.
	defer func() {
		if buf != nil {
			buf.Free()
		}
	}()
	plain, origins, err := inflate(buf.ReadOnlyData(), c.maxBytes)
	if err != nil {
		r.err, r.nonce = fmt.Errorf("undecodable response: %w", err), topLevelNonce(buf.ReadOnlyData())
		return nil
	}
	if len(plain) != buf.Len() {
		// Inflated into a buffer of its own, with the same top-level
		// fields: the compressed one is not needed while decoding.
		buf.Free()
		buf = nil
	}
	r.msg = &pb.SyncResponse{}
	if err := proto.Unmarshal(plain, r.msg); err != nil {
		r.msg, r.err, r.nonce = nil, fmt.Errorf("undecodable response: %w", err), topLevelNonce(plain)
		return nil
	}
	r.hashesKnown = origins.ownHashes() && verifyGiven(r.msg.GetSnapshot(), origins)
	return nil
}

// verifyGiven reports whether the hashes of snap that its control plane
// gave, the node's and those of the entries origins lists, are their
// content's, and origins counted every entry. The hashes of the rest,
// which came without, were computed from the very bytes their entries
// were decoded from: recomputing them by re-encoding would check only
// that the control plane's encoding is Go's deterministic one, and it is
// most of the cost of receiving a snapshot. When it reports false the
// agent checks every hash itself, and names what is wrong.
func verifyGiven(snap *pb.Snapshot, origins hashOrigins) bool {
	entries := snap.GetEntries()
	if len(entries) != origins.entries {
		return false
	}
	if snap.GetNode() == nil {
		return false
	}
	if h, err := tablehash.Node(snap.GetNode()); err != nil || h != snap.GetNode().GetHash() {
		return false
	}
	for _, i := range origins.given {
		e := entries[i]
		if h, err := tablehash.Entry(e.GetKey(), e.GetService()); err != nil || h != e.GetHash() {
			return false
		}
	}
	return true
}

// nonceField is SyncResponse.nonce's number, from the generated
// descriptor rather than written by hand.
var nonceField = (&pb.SyncResponse{}).ProtoReflect().Descriptor().Fields().ByName("nonce").Number()

// topLevelNonce returns the last nonce among b's top-level fields (as
// proto does for a repeated scalar), reading only as far as b parses; ""
// when none was read.
func topLevelNonce(b []byte) string {
	var nonce string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == nonceField && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				break
			}
			nonce, b = string(v), b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			break
		}
		b = b[m:]
	}
	return nonce
}
