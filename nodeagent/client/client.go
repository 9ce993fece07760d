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
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/failpoint"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Applier applies table responses; agent.Agent implements it.
type Applier interface {
	// Held returns the table in force.
	Held() *proxytable.Table
	// Apply applies a Snapshot or Delta response and returns the version
	// in force; an error means the response was rejected and nothing
	// changed. hashesKnown says that every hash of a snapshot was
	// computed from, or checked against, the bytes it was decoded from.
	Apply(ctx context.Context, resp *pb.SyncResponse, hashesKnown bool) (string, error)
}

// Options configures the client.
type Options struct {
	// Addresses are the configured control plane addresses (host:port):
	// a seed, tried in turn with the addresses the control plane reports
	// in each table (NodeInfo.control_plane_addresses; see dialOrder),
	// starting from one picked by the node name so that agents spread
	// over the replicas. They must not depend on the Service rules the
	// agent programs.
	Addresses []string
	// Cached is the table loaded from the agent's cache at start, or nil.
	// Until a table is in force, the control plane addresses it carries
	// are dialled too: an agent restarting after every configured address
	// went stale reaches the control plane from its cache.
	Cached *proxytable.Table
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
	// FailbackInterval is how often an agent streaming from a replica other
	// than its preferred one (the first it tries) checks whether the
	// preferred one serves again, and returns to it when it does: replicas
	// stay evenly loaded after a failover. 0 never checks.
	FailbackInterval time.Duration
	// OnConnected is told when a control plane first answers on a stream
	// (true), and when that stream ends (false).
	OnConnected func(bool)
	// Drift, when set, returns the agent's drift repairs so far (nil when
	// none) and a channel closed at the next one (agent.DriftLog.Report).
	// The client sends them with a keepalive at the start of each stream
	// and after each repair.
	Drift func() (*pb.DriftReport, <-chan struct{})
	// NodeAddresses, when set, returns the node's own addresses to report
	// in each hello (Hello.node_addresses): the control plane then leaves
	// them out of Services, as the agent would refuse them. It is called
	// at the start of every stream.
	NodeAddresses func() []string
}

var (
	errSilent   = errors.New("no message from the control plane within the silence timeout")
	errFailback = errors.New("the preferred control plane replica is serving again")
)

// Run keeps a Sync stream open until ctx ends.
func Run(ctx context.Context, o Options, a Applier, log *slog.Logger) error {
	retry := newBackoff(o.BackoffMin, o.BackoffMax)
	var learned []string // as last logged
	last, next := "", 0  // the address last tried, and the index to try next
	again := false       // whether to try last again
	for {
		// The list is taken afresh before every attempt: each table in
		// force may bring other learned addresses.
		if l := LearnedAddresses(a.Held(), o.Cached); !slices.Equal(l, learned) {
			log.Info("control plane addresses learned", "learned", l, "configured", o.Addresses)
			learned = l
		}
		addrs := dialOrder(o.NodeName, o.Addresses, learned)
		if len(addrs) == 0 {
			return errors.New("no control plane address")
		}
		// Go on after the address last tried, wherever it is now, or at
		// it again when its stream ended only for the token.
		if j := slices.Index(addrs, last); j >= 0 {
			next = j + 1
			if again {
				next = j
			}
		}
		i := next % len(addrs)
		addr, preferred := addrs[i], addrs[0]
		var watch func(context.Context) error
		if i != 0 && o.FailbackInterval > 0 {
			watch = func(ctx context.Context) error {
				return awaitServing(ctx, o, preferred, o.FailbackInterval)
			}
		}
		established, err := session(ctx, o, addr, a, watch, log)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errFailback) {
			// Back to the replica this node starts at, at once: the hello
			// carries the table held, so the replica sends nothing when it
			// is at the same version.
			log.Info("returning to the preferred control plane replica", "from", addr, "to", preferred)
			last, next = "", 0
			retry.reset()
			continue
		}
		last, next, again = addr, i+1, false
		if established {
			retry.reset()
			// A replica that served the stream ends it with
			// Unauthenticated when the token it opened with expires
			// (identity is re-checked then, as the API server ends
			// watches). The kubelet has rotated the file by then: the
			// same replica, with the new token, keeps agents where they
			// were rather than moving them all once per token lifetime.
			again = status.Code(err) == codes.Unauthenticated
		}
		wait := retry.next()
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
	}
}

// backoff is the reconnect delay: exponential between min and max, with
// full jitter (uniform in [0, delay]) so that the agents of a replica that
// went away spread their reconnects over the whole delay rather than
// arriving together in its second half. It starts over once a stream is
// established, so a second failover soon after the first is as quick.
type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(lo, hi time.Duration) *backoff { return &backoff{min: lo, max: hi, cur: lo} }

// next returns the wait before the next attempt and doubles the delay.
func (b *backoff) next() time.Duration {
	wait := rand.N(b.cur + 1)
	b.cur = min(2*b.cur, b.max)
	return wait
}

// reset starts over from min.
func (b *backoff) reset() { b.cur = b.min }

// awaitServing returns errFailback once the gRPC health service at addr
// reports SERVING, checking every interval; it returns ctx's error when
// ctx ends first. Each check is a new connection, closed at once: the
// replica being watched holds nothing for this agent meanwhile.
func awaitServing(ctx context.Context, o Options, addr string, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if serving(ctx, o, addr, interval) {
			return errFailback
		}
	}
}

// serving reports whether addr's health service answers SERVING within
// timeout.
func serving(ctx context.Context, o Options, addr string, timeout time.Duration) bool {
	creds, err := o.Credentials.dialOptions()
	if err != nil {
		return false
	}
	conn, err := grpc.NewClient(addr, append(creds, o.DialOptions...)...)
	if err != nil {
		return false
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
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

// session runs one stream to addr until it fails or watch, when set,
// returns. established reports whether the control plane answered on the
// stream at all.
func session(ctx context.Context, o Options, addr string, a Applier, watch func(context.Context) error, log *slog.Logger) (established bool, _ error) {
	creds, err := o.Credentials.dialOptions()
	if err != nil {
		return false, err
	}
	conn, err := grpc.NewClient(addr, append(append(TransportOptions(o.MaxRecvMessageBytes), creds...), o.DialOptions...)...)
	if err != nil {
		return false, fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stream, err := pb.NewTableServiceClient(conn).Sync(ctx, grpc.ForceCodecV2(syncCodec(o.MaxRecvMessageBytes)))
	if err != nil {
		return false, fmt.Errorf("opening stream to %s: %w", addr, err)
	}
	s := &syncStream{stream: stream}
	held := a.Held()
	hello := &pb.Hello{
		NodeName: o.NodeName, Capabilities: o.Capabilities,
		Version: held.Version, NodeHash: held.Node.GetHash(), ResourceVersion: held.ResourceVersion,
	}
	if held.Version != "" {
		hello.EntryHashes = held.Hashes()
	}
	if o.NodeAddresses != nil {
		hello.NodeAddresses = o.NodeAddresses()
	}
	if err := s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: hello}}); err != nil {
		return false, err
	}
	// Drift repairs go right after the hello, and again after each new
	// one; a control plane that predates them takes a keepalive.
	var drifted <-chan struct{}
	sendDrift := func() error {
		var report *pb.DriftReport
		report, drifted = o.Drift()
		if report == nil {
			return nil
		}
		return s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}, Drift: report})
	}
	if o.Drift != nil {
		if err := sendDrift(); err != nil {
			return false, err
		}
	}
	log.Info("connected to control plane", "addr", addr, "heldVersion", held.Version)
	answered := func() {
		if !established && o.OnConnected != nil {
			o.OnConnected(true)
		}
		established = true
	}
	defer func() {
		if established && o.OnConnected != nil {
			o.OnConnected(false)
		}
	}()

	tables := make(chan *response)
	recvErr := make(chan error, 1)
	heard := make(chan struct{}, 1)
	go func() { recvErr <- s.receive(ctx, tables, heard) }()
	// A control plane sends headers once it accepted the hello (a current
	// agent gets nothing else until a keepalive); older ones, with the
	// first response.
	accepted := make(chan struct{})
	go func() {
		if md, err := stream.Header(); err == nil && md != nil {
			close(accepted)
		}
	}()
	if watch != nil {
		go func() { cancel(watch(ctx)) }()
	}
	silence := time.NewTimer(o.SilenceTimeout)
	defer silence.Stop()
	for {
		select {
		case <-ctx.Done():
			return established, context.Cause(ctx)
		case err := <-recvErr:
			return established, err
		case <-accepted:
			answered()
			accepted = nil
		case <-heard:
			answered()
			silence.Reset(o.SilenceTimeout)
		case <-silence.C:
			return established, errSilent
		case <-drifted:
			if err := sendDrift(); err != nil {
				return established, err
			}
		case resp := <-tables:
			answered()
			if resp.err != nil {
				// The stream carries something other than the protocol:
				// say so, and start over on a new one.
				return established, s.leave(s.nackUndecodable(resp, log), recvErr)
			}
			err := s.answer(ctx, a, resp, log)
			// A long apply is not silence: the receive goroutine answered
			// keepalives meanwhile.
			silence.Reset(o.SilenceTimeout)
			if err != nil {
				return established, s.leave(err, recvErr)
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
func (s *syncStream) receive(ctx context.Context, tables chan<- *response, heard chan<- struct{}) error {
	for {
		m := &response{}
		err := s.stream.RecvMsg(m)
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
		if m.msg.GetKeepalive() != nil {
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

// nackUndecodable NACKs a response that could not be decoded, keeping the
// rules in force, and returns the error that ends the stream.
func (s *syncStream) nackUndecodable(resp *response, log *slog.Logger) error {
	metrics.NacksTotal.Inc()
	log.Error("rejecting an undecodable response; previous rules stay in force, reconnecting", "nonce", resp.nonce, "err", resp.err)
	if err := s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Nack{Nack: newNack("", resp.nonce, resp.err, nil)}}); err != nil {
		return err
	}
	return resp.err
}

// leave ends the stream over err after a NACK: it half-closes the stream
// and waits, at most leaveTimeout, for the control plane to end it.
// Cancelling the stream at once can make the transport drop the NACK it
// still holds, and the control plane would never learn why the agent left.
func (s *syncStream) leave(err error, ended <-chan error) error {
	s.mu.Lock()
	cerr := s.stream.CloseSend()
	s.mu.Unlock()
	if cerr != nil {
		return err
	}
	t := time.NewTimer(leaveTimeout)
	defer t.Stop()
	select {
	case endErr := <-ended:
		_ = endErr // the agent leaves over err, however the stream ended
	case <-t.C:
	}
	return err
}

// leaveTimeout bounds how long an agent leaving a stream waits for the
// control plane to read what it sent last.
const leaveTimeout = 2 * time.Second

// answer applies a table response and ACKs or NACKs it.
func (s *syncStream) answer(ctx context.Context, a Applier, r *response, log *slog.Logger) error {
	resp := r.msg
	version := proxytable.ResponseVersion(resp)
	applied, err := a.Apply(ctx, resp, r.hashesKnown)
	if err != nil {
		metrics.NacksTotal.Inc()
		log.Error("rejecting table; previous rules stay in force", "version", version, "err", err)
		if serr := s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Nack{
			Nack: newNack(version, resp.GetNonce(), err, proxytable.EntryErrors(err)),
		}}); serr != nil {
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
	failpoint.Hit(failpoint.BeforeAck)
	return s.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: applied, Nonce: resp.GetNonce()}}})
}
