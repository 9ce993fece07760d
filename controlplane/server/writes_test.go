package server

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestSnapshotWrites bounds the write(2) calls a large snapshot costs
// the control plane: a cold start sends one to every agent, and each
// write of a connection's buffer (GRPCOptions' WriteBufferSize) is a
// system call and, over loopback or a fast NIC, a segment the kernel
// handles on the writer's CPU. At 8 KiB a 240 KB snapshot was 30 writes,
// a fifth of a cold start's CPU.
func TestSnapshotWrites(t *testing.T) {
	store := table.NewStore(100)
	publish(t, store, manyServices(t, 200, 100, each))

	lis := &countingListener{Listener: bufconn.Listen(1 << 20)}
	gs := grpc.NewServer(GRPCOptions()...)
	New(store, Options{}, slog.New(slog.DiscardHandler)).Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return lis.Listener.(*bufconn.Listener).DialContext(ctx)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
		// As agents do (nodeagent/client.TransportOptions): flow control
		// never holds a snapshot back.
		grpc.WithStaticStreamWindowSize(4<<20), grpc.WithStaticConnWindowSize(4<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	a := connect(t, pb.NewTableServiceClient(conn), &pb.Hello{NodeName: "node-1"})
	r := a.recv()
	if r.GetSnapshot() == nil {
		t.Fatalf("want a snapshot, got %v", r)
	}
	size := proto.Size(r)
	if size < 200<<10 {
		t.Fatalf("the snapshot is %d bytes: too small to count its writes", size)
	}
	// Besides the snapshot's: the server's settings, their ACK, and the
	// response's headers, each flushed alone.
	const others = 6
	if got, limit := lis.writes.Load(), int64(size/(32<<10)+1+others); got > limit {
		t.Errorf("a %d-byte snapshot took %d writes, want at most %d (32 KiB each)", size, got, limit)
	}
}

// countingListener counts the writes to the connections it accepts.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}
