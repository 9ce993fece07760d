package server

import (
	"context"
	"runtime"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestHeldPerConnection: what grpc-go holds for each connection as long
// as it is open, in buffers that GRPCOptions bounds, counted exactly
// (every allocation is profiled while the test runs).
//
// The read buffer: grpc-go cannot pool it where it cannot read the
// socket itself (TLS, and a listener that wraps connections, as the
// connection limits' does), so at 5,000 agents each KiB of it is 5 MiB
// of live heap, twice that with the collector's headroom. Agents send
// ACKs and keepalives of a few dozen bytes: 1 KiB is ample.
//
// HPACK's dynamic table: agents open one stream per connection, so it
// saves nothing, and held each connection's first headers.
func TestHeldPerConnection(t *testing.T) {
	rate := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	t.Cleanup(func() { runtime.MemProfileRate = rate })

	_, _, dial := newTestServer(t, cluster(t), Options{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	const conns = 8
	for range conns {
		if _, err := dial().ListNodes(ctx, &pb.ListNodesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// The profile is as of the last collection but one.
	runtime.GC()
	runtime.GC()
	n, _ := runtime.MemProfile(nil, true)
	records := make([]runtime.MemProfileRecord, n+100)
	n, ok := runtime.MemProfile(records, true)
	if !ok {
		t.Fatal("memory profile grew while read")
	}
	var reader, headers int64
	for _, r := range records[:n] {
		var isReader, isHeaders, server bool
		frames := runtime.CallersFrames(r.Stack())
		for {
			f, more := frames.Next()
			isReader = isReader || f.Function == "bufio.NewReaderSize"
			isHeaders = isHeaders || strings.HasSuffix(f.Function, "hpack.(*headerFieldTable).addEntry")
			// The server's connections: built by, and read in, these.
			server = server || strings.HasSuffix(f.Function, "transport.NewServerTransport") ||
				strings.HasSuffix(f.Function, "transport.(*http2Server).HandleStreams")
			if !more {
				break
			}
		}
		switch {
		case isReader && server:
			reader += r.InUseBytes()
		case isHeaders && server:
			headers += r.InUseBytes()
		}
	}
	// The connection newTestServer dials never connects: no call uses it.
	if reader == 0 {
		t.Fatal("no server read buffer in the memory profile: the test no longer finds it")
	}
	if per := reader / conns; per > 1<<10+256 {
		t.Errorf("a connection's read buffer holds %d bytes, want at most 1 KiB and the reader", per)
	}
	if per := headers / conns; per != 0 {
		t.Errorf("a connection's HPACK table holds %d bytes of headers, want none", per)
	}
}
