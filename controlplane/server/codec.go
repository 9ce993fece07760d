package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/wire"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// frame is a message encoded ahead of time. Table responses are assembled
// from pre-encoded parts (see package table); re-encoding them through
// generated types would cost a full marshal per agent.
type frame struct {
	head []byte
	body table.Body // shared with other frames: referenced, never copied
}

func (f *frame) size() int { return len(f.head) + f.body.Len() }

// MaxSmallMessageBytes bounds every message a client sends except the
// agents' Sync messages: health and reflection requests, WatchTable's,
// ListNodes' and ListEvents' requests. The largest of them legitimately
// is a reflection request naming a symbol or file, or a WatchTable
// request naming a node (at most 253 bytes); 4 KiB is ample.
//
// grpc-go has one receive limit for the whole server (MaxRecvMsgSize),
// and it must fit an agent's hello, which lists every entry's hash: at
// most 141 bytes an entry, 1.4 MB at 10,000 Services. So this bound is
// the codec's: a larger message of any other type is refused before it
// is decoded, and its bytes are freed at once. What grpc-go reads before
// that is bounded by the server-wide limit times the calls that may be
// read before anyone proved anything (limit.Config.MaxUnverified);
// Sync's messages are read only after authentication.
const MaxSmallMessageBytes = 4 << 10

// codec is the standard proto codec that also passes frames through
// untouched, and refuses messages over MaxSmallMessageBytes but the
// agents'. On the wire a frame is an ordinary protobuf message, so any
// client (grpcurl included) decodes it with the generated types.
//
// grpc-go turns any error of a codec into Internal, so the codec does not
// fail an oversized message: it leaves it undecoded and marks it, and the
// interceptors GRPCOptions installs with it refuse a marked message with
// ResourceExhausted, as grpc-go's own size limit does.
type codec struct {
	encoding.CodecV2
	// oversized holds the messages left undecoded, until the interceptor
	// that refuses them takes them out.
	oversized *sync.Map
}

func newCodec() codec { return newCodecOf(encoding.GetCodecV2(proto.Name)) }

func newCodecOf(c encoding.CodecV2) codec { return codec{CodecV2: c, oversized: &sync.Map{}} }

// Marshal implements encoding.CodecV2.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		out := make(mem.BufferSlice, 0, 1+len(f.body))
		out = append(out, mem.SliceBuffer(f.head))
		for _, p := range f.body {
			out = append(out, mem.SliceBuffer(p))
		}
		return out, nil
	}
	return c.CodecV2.Marshal(v)
}

// syncMessage receives an agent's Sync message, decoded by
// decodeRequest, or the reason it is undecodable: grpc-go would end the
// stream with Internal on a codec's error, and a malformed message is
// the agent's error (InvalidArgument), which the stream must say.
type syncMessage struct {
	req     *pb.SyncRequest
	entries []byte // a hello's entry hashes, encoded (see decodeRequest)
	err     error
	// isAck says the message is an ACK and nothing else, decoded into
	// ack without protobuf, and req is nil.
	isAck bool
	ack   ackFields
}

// ackFields is an ACK as decodeAck reads it: what protobuf's decoding
// would give, without its five allocations per ACK of every agent.
type ackFields struct {
	version  uint64
	nonce    [20]byte // the digits of a uint64 at most, as formatNonce writes them
	nonceLen uint8
}

func (a *ackFields) nonceBytes() []byte { return a.nonce[:a.nonceLen] }

// Field numbers of what decodeAck reads (proto/proxyplane/v1/sync.proto;
// TestDecodeAck checks them against protobuf's decoding).
const (
	syncRequestAck protowire.Number = 2 // SyncRequest.ack
	ackVersion     protowire.Number = 1 // Ack.version
	ackNonce       protowire.Number = 2 // Ack.nonce
)

// decodeAck decodes b into a when it is an ACK in the form every agent
// sends: a SyncRequest holding only its ack, whose version is 16 hex
// digits (what compute.ParseVersion accepts) and whose nonce is at most
// 20 decimal digits, each once, and nothing else. It reports false for
// anything else, which protobuf decodes as before: an ACK with a
// malformed version or nonce, or a field repeated or unknown, is left to
// decodeRequest, so that decoding errors and what an unusual ACK means
// stay protobuf's.
func decodeAck(b []byte, a *ackFields) bool {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num != syncRequestAck || typ != protowire.BytesType {
		return false
	}
	body, m := protowire.ConsumeBytes(b[n:])
	if m < 0 || n+m != len(b) {
		return false
	}
	var haveVersion, haveNonce bool
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		v, m := protowire.ConsumeBytes(body[n:])
		if m < 0 {
			return false
		}
		switch {
		case num == ackVersion && !haveVersion:
			var ok bool
			if a.version, ok = parseHex16(v); !ok {
				return false
			}
			haveVersion = true
		case num == ackNonce && !haveNonce:
			if len(v) == 0 || len(v) > len(a.nonce) || !allDigits(v) {
				return false
			}
			a.nonceLen = uint8(copy(a.nonce[:], v))
			haveNonce = true
		default:
			return false
		}
		body = body[n+m:]
	}
	return haveVersion && haveNonce
}

// parseHex16 parses what compute.ParseVersion accepts, 16 hex digits of
// either case, without a string.
func parseHex16(b []byte) (uint64, bool) {
	if len(b) != 16 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	return v, true
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Unmarshal implements encoding.CodecV2.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch r := v.(type) {
	case *syncMessage:
		// An ACK, a few dozen bytes, is decoded from gRPC's own buffer,
		// which neither decoding retains; a hello is copied, since its
		// entry hashes are kept encoded (decodeRequest).
		var b []byte
		if len(data) == 1 && !hasField(data[0].ReadOnlyData(), wire.SyncRequestHello) {
			b = data[0].ReadOnlyData()
			if decodeAck(b, &r.ack) {
				r.isAck = true
				return nil
			}
		} else {
			b = data.Materialize()
		}
		r.req, r.entries, r.err = decodeRequest(b)
		return nil
	case *pb.SyncRequest:
	default:
		if data.Len() > MaxSmallMessageBytes {
			c.oversized.Store(v, struct{}{})
			return nil
		}
	}
	return c.CodecV2.Unmarshal(data, v)
}

var errOversized = status.Errorf(codes.ResourceExhausted, "message larger than %d bytes", MaxSmallMessageBytes)

// refuseOversized refuses a unary request the codec left undecoded. It
// is the outermost interceptor, so it runs before any other sees the
// empty request.
func (c codec) refuseOversized(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if _, ok := c.oversized.LoadAndDelete(req); ok {
		return nil, errOversized
	}
	return handler(ctx, req)
}

// refuseOversizedStream does the same for the messages of streams, the
// Sync stream's aside (their messages are never marked).
func (c codec) refuseOversizedStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod == pb.TableService_Sync_FullMethodName {
		return handler(srv, ss)
	}
	return handler(srv, &sizedStream{ServerStream: ss, oversized: c.oversized})
}

type sizedStream struct {
	grpc.ServerStream
	oversized *sync.Map
}

func (s *sizedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if _, ok := s.oversized.LoadAndDelete(m); ok {
		return errOversized
	}
	return nil
}
