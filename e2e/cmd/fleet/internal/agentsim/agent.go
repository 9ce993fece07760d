package agentsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/hashtable"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/client"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

var errSilent = errors.New("no message from the control plane within the silence timeout")

// agent is one simulated node agent. Its goroutine owns held; the
// atomics are read by reports.
type agent struct {
	idx  int
	name string
	f    *fleet
	// order is the control plane addresses in the agent's rendezvous
	// order (Options.Addresses).
	order []string

	held held // owned by the agent's goroutine

	version      atomic.Pointer[string]
	firstAck     atomic.Int64
	lastAck      atomic.Int64
	sessionStart atomic.Int64 // 0 when no stream is open
	// addr is the address of the open stream (nil when none).
	addr     atomic.Pointer[string]
	sessions atomic.Uint64
}

// held is what the agent holds: the version, its node's hash and name,
// and the shared hash table of its entries.
type held struct {
	version  string
	nodeHash uint64
	nodeName string
	table    *hashtable.Table
}

// run keeps a stream open until ctx ends, reconnecting as
// nodeagent/client.Run does: full jitter over a doubling backoff, reset
// after a stream that lived longer than the maximum; each attempt goes to
// the address after the one last tried, in the agent's rendezvous order,
// so that a lost replica's agents spread over the others as real agents
// do.
func (a *agent) run(ctx context.Context) {
	a.held = held{table: hashtable.Empty()}
	o := a.f.opts
	backoff := o.BackoffMin
	for next := 0; ; next = (next + 1) % len(a.order) {
		started := time.Now()
		err := a.session(ctx, a.order[next])
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > o.BackoffMax {
			backoff = o.BackoffMin
		}
		a.f.noteEnd(err)
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(2*backoff, o.BackoffMax)
	}
}

// session runs one stream until it fails. One goroutine both receives and
// answers: the simulated agent's apply is short, so keepalives are never
// held up by it as a real agent's kernel sync would hold them.
func (a *agent) session(ctx context.Context, addr string) error {
	o := a.f.opts
	opts := append(client.TransportOptions(o.MaxRecvMessageBytes), a.f.creds.dialOptions(a.idx)...)
	// Counts the bytes the control plane sends (TLS records, when TLS is
	// on), and dials from the agent's own loopback address (sourceAddr).
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithContextDialer(a.dial))...)
	if err != nil {
		return fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	silence := time.AfterFunc(o.SilenceTimeout, func() { cancel(errSilent) })
	defer silence.Stop()

	c := &codec{slots: a.f.slots, maxBytes: o.MaxRecvMessageBytes}
	defer c.release()
	stream, err := pb.NewTableServiceClient(conn).Sync(ctx, grpc.ForceCodecV2(c))
	if err != nil {
		a.f.counters.failures.Add(1)
		return fmt.Errorf("opening stream: %w", err)
	}
	if err := stream.SendMsg(a.hello()); err != nil {
		a.f.counters.failures.Add(1)
		return fmt.Errorf("sending hello: %w", err)
	}
	a.addr.Store(&addr)
	a.sessionStart.Store(time.Now().UnixNano())
	defer a.sessionStart.Store(0)
	defer a.addr.Store(nil)
	if a.sessions.Add(1) > 1 {
		a.f.counters.reconnects.Add(1)
	}
	a.f.counters.sessions.Add(1)

	for {
		resp, err := stream.Recv()
		if err != nil {
			c.release()
			if errors.Is(err, io.EOF) {
				return errors.New("control plane closed the stream")
			}
			if cause := context.Cause(ctx); cause != nil {
				return cause
			}
			return fmt.Errorf("receiving: %w", err)
		}
		silence.Reset(o.SilenceTimeout)
		if resp.GetKeepalive() != nil {
			c.release()
			a.f.counters.keepalives.Add(1)
			if err := stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}}); err != nil {
				return fmt.Errorf("sending keepalive: %w", err)
			}
			continue
		}
		answer, ss := a.apply(resp, c.size)
		c.release()
		a.f.tracker.reached(a.idx, ss, c.arrived.UnixNano())
		if err := stream.Send(answer); err != nil {
			return fmt.Errorf("answering: %w", err)
		}
		if answer.GetAck() != nil {
			now := time.Now().UnixNano()
			a.f.tracker.acked(a.idx, ss, now)
			a.firstAck.CompareAndSwap(0, now)
			a.lastAck.Store(now)
			a.f.counters.acks.Add(1)
		}
	}
}

// hello says what the agent holds, as nodeagent/client's does, encoded
// from the shared table's parts.
func (a *agent) hello() *rawMessage {
	h := &pb.Hello{
		NodeName:     a.name,
		Capabilities: &pb.Capabilities{Deltas: true, Dataplane: "fleet", AgentVersion: "fleet", ZstdEntries: a.f.opts.ZstdEntries, ZstdEntriesUnhashed: a.f.opts.ZstdEntries},
		Version:      a.held.version,
		NodeHash:     a.held.nodeHash,
	}
	head, err := proto.Marshal(h)
	if err != nil {
		panic(fmt.Sprintf("encoding a hello: %v", err)) // cannot fail for this message
	}
	// The hello is field 1 of SyncRequest; its length covers every part.
	n := len(head)
	var parts [][]byte
	if a.held.version != "" {
		parts = a.held.table.HelloParts()
		for _, p := range parts {
			n += len(p)
		}
	}
	prefix := protowire.AppendTag(nil, 1, protowire.BytesType)
	prefix = protowire.AppendVarint(prefix, uint64(n))
	out := mem.BufferSlice{mem.SliceBuffer(append(prefix, head...))}
	for _, p := range parts {
		out = append(out, mem.SliceBuffer(p))
	}
	return &rawMessage{parts: out}
}

// apply validates a table response with the agent's own code and, if it
// is good, takes it; it returns the ACK or NACK to send and the tracked
// changes the response carried.
func (a *agent) apply(resp *pb.SyncResponse, size int) (*pb.SyncRequest, []seen) {
	var (
		next    held
		entries []*pb.ServiceEntry
		version string
		err     error
	)
	switch {
	case resp.GetSnapshot() != nil:
		s := resp.GetSnapshot()
		a.f.counters.snapshots.Add(1)
		a.f.counters.snapshotBytes.Add(uint64(size))
		version, entries = s.GetVersion(), s.GetEntries()
		next, err = a.f.fromSnapshot(s)
	case resp.GetDelta() != nil:
		d := resp.GetDelta()
		a.f.counters.deltas.Add(1)
		a.f.counters.deltaBytes.Add(uint64(size))
		version, entries = d.GetVersion(), d.GetUpserts()
		next, err = a.f.applyDelta(a.held, d)
	default:
		err = fmt.Errorf("%w: a response with neither snapshot, delta nor keepalive", proxytable.ErrInvalidTable)
	}
	ss := a.f.tracked(entries)
	if err != nil {
		a.f.noteNack(err)
		return &pb.SyncRequest{Kind: &pb.SyncRequest_Nack{Nack: nackOf(version, resp.GetNonce(), err)}}, ss
	}
	a.held = next
	a.version.Store(&next.version)
	return &pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: version, Nonce: resp.GetNonce()}}}, ss
}

func nackOf(version, nonce string, err error) *pb.Nack {
	n := &pb.Nack{Version: version, Nonce: nonce, Error: err.Error()}
	var ve *proxytable.ValidationError
	if errors.As(err, &ve) {
		for _, e := range ve.Entries {
			n.EntryErrors = append(n.EntryErrors, &pb.EntryError{Key: e.Key, Error: e.Err.Error()})
		}
	}
	return n
}

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	n *atomic.Uint64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(uint64(n))
	return n, err
}

// dial dials TCP as grpc's default dialer does, from the agent's own
// source address, counting bytes read.
func (a *agent) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: sourceAddr(a.idx)}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dialing %s from %s: %w", addr, d.LocalAddr, err)
	}
	return &countingConn{Conn: c, n: &a.f.counters.wire}, nil
}

// sourceAddr is agent i's address: 127.16.0.1 + i. Every agent has its
// own, as real agents on their nodes do, so that a control plane limiting
// connections per peer address sees one peer per agent; all of 127/8 is
// loopback on Linux, and the traffic still goes only to 127.0.0.1.
func sourceAddr(i int) net.IP {
	v := uint32(127)<<24 | 16<<16 + uint32(i) + 1
	return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// versionSum parses a version; ok is false when it is not 16 hex digits.
func versionSum(v string) (uint64, bool) {
	if len(v) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 16, 64)
	return n, err == nil
}
