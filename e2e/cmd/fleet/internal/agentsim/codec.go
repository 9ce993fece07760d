package agentsim

import (
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/client"
)

// rawMessage is a request already encoded, sent as is: the hello, whose
// entry hashes are shared encoded parts (hashtable.HelloParts).
type rawMessage struct{ parts mem.BufferSlice }

// codec is one agent's gRPC codec. It decodes responses into the
// generated types as grpc's proto codec does, but first takes a decode
// slot: with thousands of agents on a few cores, unbounded concurrent
// decoding would hold thousands of decoded snapshots at once. The slot is
// held until the agent has processed the message (release). It also
// records each response's size and arrival time. Compressed snapshot
// entries are inflated first, within maxBytes, by nodeagent's own code
// (client.Inflate).
type codec struct {
	slots    chan struct{} // shared by every agent; a token is a slot
	maxBytes int
	held     atomic.Bool // this agent holds a slot
	// size and arrived describe the last message decoded; written by
	// Unmarshal and read after RecvMsg returns, on the same goroutine.
	size    int
	arrived time.Time
}

// Name is the content-subtype; the control plane's server selects its
// codec by it, so it must be the proto codec's.
func (*codec) Name() string { return "proto" }

func (*codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *rawMessage:
		return m.parts, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encoding %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	default:
		return nil, fmt.Errorf("cannot encode %T", v)
	}
}

func (c *codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*pb.SyncResponse)
	if !ok {
		return fmt.Errorf("cannot decode into %T", v)
	}
	c.arrived = time.Now()
	c.slots <- struct{}{} // a slot frees as soon as another agent has processed its message
	c.held.Store(true)
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	c.size = buf.Len() // as received: compressed, when it was
	plain, err := client.Inflate(buf.ReadOnlyData(), c.maxBytes)
	if err != nil {
		return fmt.Errorf("inflating response: %w", err)
	}
	if err := proto.Unmarshal(plain, m); err != nil {
		return fmt.Errorf("decoding response: %w", err)
	}
	return nil
}

// release gives the decode slot back, if held.
func (c *codec) release() {
	if c.held.CompareAndSwap(true, false) {
		<-c.slots
	}
}
