package floor

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
)

// fullMethod is the one method: its own service, so that nothing mistakes
// the floor for the TableService.
const fullMethod = "/proxyplane.fleet.v1.Floor/Exchange"

// streamDesc describes the method to clients; serviceDesc to the server.
var streamDesc = grpc.StreamDesc{StreamName: "Exchange", ServerStreams: true, ClientStreams: true}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "proxyplane.fleet.v1.Floor",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Exchange",
		ServerStreams: true,
		ClientStreams: true,
		Handler:       func(srv any, stream grpc.ServerStream) error { return srv.(*server).exchange(stream) },
	}},
}

// frame is a message encoded ahead of time, sent as is, as the control
// plane sends its tables. The floor's messages are opaque bytes: without
// compression gRPC never looks inside.
type frame []byte

// rawMessage receives a message's bytes undecoded.
type rawMessage []byte

// codec is the control plane's passthrough (controlplane/server's codec)
// for the floor's types. It is needed because that codec passes through
// only the control plane's own, unexported frame type; for a frame both
// do the same work: hand gRPC the bytes without a copy, and copy a
// received message out of gRPC's buffers.
type codec struct{}

// Name is the content-subtype, the proto codec's as for the control
// plane's clients.
func (codec) Name() string { return "proto" }

// Marshal implements encoding.CodecV2.
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(frame)
	if !ok {
		return nil, fmt.Errorf("cannot encode %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("cannot decode into %T", v)
	}
	*r = data.Materialize()
	return nil
}

// ServerReport is the server's state, served at /report.
type ServerReport struct {
	// Address is the gRPC address, 127.0.0.1:port.
	Address string `json:"address"`
	// Streams is the number of streams open now.
	Streams int `json:"streams"`
	// Run is the last run's; nil before the first.
	Run *RunReport `json:"run,omitempty"`
	// HeapInuse is the server's heap in use now.
	HeapInuse uint64 `json:"heapInuse"`
}

// RunReport is what a run of rounds saw.
type RunReport struct {
	// Rounds asked for; Expected replies per round, the streams open
	// when the run started.
	Rounds   int `json:"rounds"`
	Expected int `json:"expected"`
	// Done: every round completed or the run failed (Failure says why).
	Done    bool   `json:"done"`
	Failure string `json:"failure,omitempty"`
	// Late counts rounds whose previous round had not completed at their
	// tick, and so started late.
	Late int `json:"late"`
	// Replies per round, and Last, each round's broadcast to its last
	// reply in nanoseconds (0 for a round that did not complete).
	Replies []int   `json:"replies"`
	Last    []int64 `json:"last"`
}

// ClientsReport is the clients' state, served at /report.
type ClientsReport struct {
	Clients int `json:"clients"`
	// Open is the number of streams open now; Received the messages
	// received (and answered) by all clients.
	Open     int    `json:"open"`
	Received uint64 `json:"received"`
	// Errors are the first few reasons a client's stream ended.
	Errors []string `json:"errors,omitempty"`
}
