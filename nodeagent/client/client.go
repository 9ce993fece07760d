// Package client is the node agent's side of the Sync stream: it connects
// to the control plane (failing over across addresses) over TLS, verified
// against the CA bundle the control plane publishes, proves its node with
// a bearer token (Credentials: both read afresh on every connect), says
// what the agent holds, hands each table response to the agent and
// answers with an ACK or a NACK, and reconnects with backoff when the
// stream ends or goes silent.
package client

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Applier applies table responses; agent.Agent implements it.
type Applier interface {
	// Held returns the table in force.
	Held() *proxytable.Table
	// Apply applies a Snapshot or Delta response and returns the version
	// in force; an error means the response was rejected and nothing
	// changed.
	Apply(ctx context.Context, resp *pb.SyncResponse) (string, error)
}

// Options configures the client.
type Options struct {
	// Addresses are the control plane's addresses (host:port), tried in
	// turn, starting from one picked by the node name so that agents
	// spread over the replicas. They must not depend on the Service rules
	// the agent programs.
	Addresses []string
	// NodeName is the agent's node.
	NodeName string
	// Capabilities are sent in the hello.
	Capabilities *pb.Capabilities
	// Credentials authenticate the control plane and the agent; they are
	// read afresh for every connection.
	Credentials Credentials
	// DialOptions are added to every connection (a dialer, in tests).
	DialOptions []grpc.DialOption
	// BackoffMin and BackoffMax bound the reconnect backoff (with jitter).
	BackoffMin, BackoffMax time.Duration
	// SilenceTimeout ends a stream on which nothing arrived for this long;
	// the control plane sends keepalives well within it.
	SilenceTimeout time.Duration
	// MaxRecvMessageBytes bounds a table response.
	MaxRecvMessageBytes int
	// OnConnected is told when a stream opens (true) and ends (false).
	OnConnected func(bool)
}

var errSilent = errors.New("no message from the control plane within the silence timeout")

// Run keeps a Sync stream open until ctx ends.
func Run(ctx context.Context, o Options, a Applier, log *slog.Logger) error {
	backoff := o.BackoffMin
	for i := firstAddress(o.NodeName, len(o.Addresses)); ; i++ {
		addr := o.Addresses[i%len(o.Addresses)]
		started := time.Now()
		err := session(ctx, o, addr, a, log)
		if ctx.Err() != nil {
			return nil
		}
		// A stream that lived a while was a success: start over quickly.
		if time.Since(started) > o.BackoffMax {
			backoff = o.BackoffMin
		}
		// Full jitter spreads reconnects of thousands of agents after a
		// control plane restart.
		wait := backoff/2 + rand.N(backoff/2+1)
		if errors.Is(err, errCredentials) {
			// Nothing was dialled: the rules in force stay, and the files
			// are read again at the next attempt.
			log.Error("cannot connect to the control plane without credentials; keeping the rules in force, retrying", "err", err, "in", wait.Round(time.Millisecond))
		} else {
			log.Warn("control plane stream ended; reconnecting", "addr", addr, "err", err, "in", wait.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(2*backoff, o.BackoffMax)
	}
}

// TransportOptions are the agent's gRPC transport settings, exported so
// that simulated agents (the fleet harness) connect exactly as agents do.
func TransportOptions(maxRecvMessageBytes int) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMessageBytes)),
		// Transport keepalives find dead TCP connections; the silence
		// timeout finds a control plane that stopped talking.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		// Fixed windows turn off grpc-go's bandwidth estimation, whose
		// probe (a PING after each burst of received data) the control
		// plane would answer for every agent at every change. 4 MiB takes
		// a 10,000-Service snapshot in a few round trips.
		grpc.WithStaticStreamWindowSize(4 << 20),
		grpc.WithStaticConnWindowSize(4 << 20),
	}
}

// firstAddress picks the address an agent tries first: the same for a
// node every time (it returns to the replica that knows it), spread evenly
// over the replicas across nodes.
func firstAddress(nodeName string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(nodeName))
	return int(h.Sum32() % uint32(n))
}

// session runs one stream to addr until it fails.
func session(ctx context.Context, o Options, addr string, a Applier, log *slog.Logger) error {
	creds, err := o.Credentials.dialOptions()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr, append(append(TransportOptions(o.MaxRecvMessageBytes), creds...), o.DialOptions...)...)
	if err != nil {
		return fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stream, err := pb.NewTableServiceClient(conn).Sync(ctx)
	if err != nil {
		return fmt.Errorf("opening stream to %s: %w", addr, err)
	}
	s := &syncStream{stream: stream}
	held := a.Held()
	hello := &pb.Hello{NodeName: o.NodeName, Capabilities: o.Capabilities, Version: held.Version, NodeHash: held.Node.GetHash()}
	if held.Version != "" {
		hello.EntryHashes = held.Hashes()
	}
	if err := s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: hello}}); err != nil {
		return err
	}
	log.Info("connected to control plane", "addr", addr, "heldVersion", held.Version)
	if o.OnConnected != nil {
		o.OnConnected(true)
		defer o.OnConnected(false)
	}

	tables := make(chan *pb.SyncResponse)
	recvErr := make(chan error, 1)
	heard := make(chan struct{}, 1)
	go func() { recvErr <- s.receive(ctx, tables, heard) }()
	silence := time.NewTimer(o.SilenceTimeout)
	defer silence.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-recvErr:
			return err
		case <-heard:
			silence.Reset(o.SilenceTimeout)
		case <-silence.C:
			return errSilent
		case resp := <-tables:
			err := s.answer(ctx, a, resp, log)
			// A long apply is not silence: the receive goroutine answered
			// keepalives meanwhile.
			silence.Reset(o.SilenceTimeout)
			if err != nil {
				return err
			}
		}
	}
}

// syncStream serialises sends: the receive goroutine answers keepalives while
// the session goroutine answers tables.
type syncStream struct {
	mu     sync.Mutex // serialises Send
	stream grpc.BidiStreamingClient[pb.SyncRequest, pb.SyncResponse]
}

func (s *syncStream) send(m *pb.SyncRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stream.Send(m); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	return nil
}

// receive answers keepalives itself, so that a long kernel sync does not
// make the agent look dead, and passes table responses on.
func (s *syncStream) receive(ctx context.Context, tables chan<- *pb.SyncResponse, heard chan<- struct{}) error {
	for {
		m, err := s.stream.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("control plane closed the stream")
		}
		if err != nil {
			return fmt.Errorf("receiving: %w", err)
		}
		select {
		case heard <- struct{}{}:
		default:
		}
		if m.GetKeepalive() != nil {
			if err := s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}}); err != nil {
				return err
			}
			continue
		}
		select {
		case tables <- m:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// answer applies a table response and ACKs or NACKs it.
func (s *syncStream) answer(ctx context.Context, a Applier, resp *pb.SyncResponse, log *slog.Logger) error {
	version := resp.GetSnapshot().GetVersion() + resp.GetDelta().GetVersion()
	applied, err := a.Apply(ctx, resp)
	if err != nil {
		msg, entries := agent.NackDetail(err)
		metrics.NacksTotal.Inc()
		log.Error("rejecting table; previous rules stay in force", "version", version, "err", err)
		if serr := s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Nack{Nack: &pb.Nack{
			Version: version, Nonce: resp.GetNonce(), Error: msg, EntryErrors: entries,
		}}}); serr != nil {
			return serr
		}
		if !errors.Is(err, proxytable.ErrInvalidTable) {
			// A valid table that could not be persisted or programmed (a
			// held xtables lock, a full disk) is worth retrying, but the
			// control plane never resends a NACKed version on a stream.
			// Reconnecting, after the backoff, makes it send the latest
			// table again from what the agent holds.
			return fmt.Errorf("retrying after a failed apply: %w", err)
		}
		return nil
	}
	log.Debug("table applied", "version", applied)
	return s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: applied, Nonce: resp.GetNonce()}}})
}
