package server

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	"github.com/proxyplane/proxyplane/controlplane/table"
)

// frame is a message encoded ahead of time. Table responses are assembled
// from pre-encoded parts (see package table); re-encoding them through
// generated types would cost a full marshal per agent.
type frame struct {
	head []byte
	body table.Body // shared with other frames: referenced, never copied
}

func (f *frame) size() int { return len(f.head) + f.body.Len() }

// codec is the standard proto codec that also passes frames through
// untouched. On the wire a frame is an ordinary protobuf message, so any
// client (grpcurl included) decodes it with the generated types.
type codec struct{ encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2(proto.Name)} }

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

// rawMessage receives a message's bytes undecoded.
type rawMessage []byte

// Unmarshal implements encoding.CodecV2.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*rawMessage); ok {
		*r = data.Materialize()
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}
