package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/wire"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Errors that end a stream; each maps to a gRPC status at the edge.
var (
	errReplaced         = errors.New("a newer stream for this node replaced this one")
	errShuttingDown     = errors.New("this control plane replica is shutting down")
	errKeepaliveTimeout = errors.New("no message from the agent within the keepalive timeout")
	errWriteTimeout     = errors.New("the agent did not take a message within the write timeout")
	errAckTimeout       = errors.New("the agent neither acknowledged nor rejected a table within the ack timeout")
	errInvalid          = errors.New("invalid message")
)

// Server implements proxyplane.v1.TableService.
type Server struct {
	pb.UnimplementedTableServiceServer

	store *table.Store
	opts  Options
	log   *slog.Logger
	reg   *registry
	conv  *tracker      // the convergence SLI's bookkeeping; nil when disabled
	admit *rate.Limiter // paces the start of Sync streams
	// driftLog paces the warnings of drift repairs: every agent may
	// report one at once (a CNI rolled out on every node).
	driftLog *rate.Limiter
	// helloSlots bounds the Sync streams between admission and their
	// cursor: those that hold a hello.
	helloSlots chan struct{}
	// stopping ends every stream when Shutdown cancels it.
	stopping context.Context
	shutdown context.CancelCauseFunc
}

// New returns a server of store's tables.
func New(store *table.Store, opts Options, log *slog.Logger) *Server {
	s := &Server{store: store, opts: opts.withDefaults(), log: log}
	s.admit = rate.NewLimiter(rate.Limit(s.opts.AdmissionRate), s.opts.AdmissionBurst)
	s.helloSlots = make(chan struct{}, maxHellos)
	s.driftLog = rate.NewLimiter(rate.Every(time.Second), 10)
	s.reg = newRegistry(func(node string) bool {
		w := store.Current()
		return w != nil && w.Known(node)
	})
	s.stopping, s.shutdown = context.WithCancelCause(context.Background())
	if !s.opts.DisableConvergence {
		s.conv = newTracker(store, s.reg)
		go s.conv.run(s.stopping)
	}
	return s
}

// Shutdown ends every Sync and WatchTable stream with Unavailable, so that
// agents move to another replica at once. Call it before the gRPC server's
// GracefulStop, which would otherwise wait for streams that never end on
// their own.
func (s *Server) Shutdown() { s.shutdown(errShuttingDown) }

// streamContext is a stream's context, ended also by Shutdown.
func (s *Server) streamContext(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.stopping, func() { cancel(context.Cause(s.stopping)) })
	return ctx, func(cause error) { stop(); cancel(cause) }
}

// GRPCOptions returns the grpc.ServerOptions the server relies on: the
// codec that sends pre-encoded tables and bounds what clients but agents
// send (MaxSmallMessageBytes), and a transport sized for thousands
// of agents that each send a few bytes per change. Pass them to
// grpc.NewServer.
func GRPCOptions() []grpc.ServerOption { return grpcOptions(newCodec()) }

func grpcOptions(c codec) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		// The codec's bound on messages other than the agents' (see
		// MaxSmallMessageBytes) needs these to refuse what it marks. They
		// come first, so they run before any interceptor added later.
		grpc.ChainUnaryInterceptor(c.refuseOversized),
		grpc.ChainStreamInterceptor(c.refuseOversizedStream),
		// Static receive windows turn off grpc-go's bandwidth estimation,
		// which otherwise answers every ACK (a burst of received data) with
		// a BDP ping: one more write and read per agent per change. Agents
		// send ACKs, keepalives and one hello, so the smallest window will
		// do, and it bounds what a stream waiting for admission buffers.
		grpc.StaticStreamWindowSize(64 << 10),
		grpc.StaticConnWindowSize(64 << 10),
		// Per-connection read buffers are 32 KiB by default and stay
		// allocated on connections grpc-go cannot pool them for (TLS, or
		// a listener that wraps connections, as limit.Listener does):
		// 160 MB at 5,000 agents, for messages of a few dozen bytes. 1
		// KiB holds an ACK, a keepalive and the frames' headers; the
		// rest of a hello's frames (up to 16 KiB) are read past the
		// buffer, straight into the frame's, whatever its size.
		grpc.ReadBufferSize(1 << 10),
		// Agents open one stream per connection, so HPACK's dynamic
		// table, which saves resending headers on later streams of a
		// connection, saves them nothing, and holds each connection's
		// first headers (about 1 KB) for as long as it is open. At 0,
		// clients encode headers without it.
		grpc.HeaderTableSize(0),
		// Each time a connection's write buffer fills is one write(2),
		// and one segment the kernel handles on our CPU: at 8 KiB a
		// 240 KB snapshot was 30 of them, a fifth of a cold start's CPU;
		// at grpc-go's default of 32 KiB it is 8 (TestSnapshotWrites;
		// cold start CPU 10% less at 1,000 agents, within the noise at
		// 5,000, where idle keepalives dominate it). The buffers are
		// pooled (SharedWriteBuffer, grpc-go's default) and held only
		// from a connection's first write to its flush, so the size
		// bounds a burst's memory, not a connection's: peak and steady
		// RSS at 1,000 agents did not move (docs/benchmarks.md,
		// "Scenario L: memory and cold start").
		grpc.WriteBufferSize(32 << 10),
	}
}

// Register registers the TableService on r.
func (s *Server) Register(r grpc.ServiceRegistrar) { pb.RegisterTableServiceServer(r, s) }

// ListNodes implements TableService.
func (s *Server) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	if err := s.authorizeRead(ctx, ""); err != nil {
		return nil, err
	}
	w, err := s.world(ctx)
	if err != nil {
		return nil, err
	}
	nodes := s.reg.list(w)
	var conv []*pb.Convergence
	if s.conv != nil {
		if conv, err = s.conv.list(ctx); err != nil {
			return nil, status.FromContextError(err).Err()
		}
	}
	for _, c := range conv {
		for _, p := range c.GetPending() {
			p.Reason = s.reg.pendingReason(p.GetNodeName())
		}
	}
	return &pb.ListNodesResponse{Nodes: nodes, Convergence: conv}, nil
}

// ListEvents implements TableService. Like ListNodes it waits for the
// first world: before the informers sync, no Service has been checked, and
// an empty list would wrongly say that all are valid.
func (s *Server) ListEvents(ctx context.Context, _ *pb.ListEventsRequest) (*pb.ListEventsResponse, error) {
	if err := s.authorizeRead(ctx, ""); err != nil {
		return nil, err
	}
	if _, err := s.world(ctx); err != nil {
		return nil, err
	}
	if s.opts.Events == nil {
		return &pb.ListEventsResponse{}, nil
	}
	return s.opts.Events.Events(), nil
}

// authorizeRead applies Options.AuthorizeRead, if set.
func (s *Server) authorizeRead(ctx context.Context, node string) error {
	if s.opts.AuthorizeRead == nil {
		return nil
	}
	if err := s.opts.AuthorizeRead(ctx, node); err != nil {
		if status.Code(err) != codes.Unknown {
			return err
		}
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return nil
}

// world waits for the store's first world: no table is served before the
// informers have synced.
func (s *Server) world(ctx context.Context) (*table.World, error) {
	select {
	case <-s.store.Ready():
		return s.store.Current(), nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// WatchTable implements TableService: the table of any node, read-only,
// acknowledged on the agent's behalf as soon as it is sent.
func (s *Server) WatchTable(req *pb.WatchTableRequest, stream grpc.ServerStreamingServer[pb.WatchTableResponse]) error {
	if err := validNodeName(req.GetNodeName()); err != nil {
		return toStatus(err)
	}
	if err := s.authorizeRead(stream.Context(), req.GetNodeName()); err != nil {
		return err
	}
	ctx, cancel := s.streamContext(stream.Context())
	defer cancel(nil)
	if _, err := s.world(ctx); err != nil {
		return err
	}
	sub := s.store.Subscribe()
	w, _ := sub.Take()
	cur, err := table.NewCursor(req.GetNodeName(), w, table.Held{}, true, s.store.MaxPending())
	if err != nil {
		return toStatus(err)
	}
	out := newSender(stream, s.opts.WriteTimeout)
	defer out.close()
	for {
		if r := cur.Next(); r != nil {
			field := wire.WatchTableResponseSnapshot
			if !r.Snapshot {
				field = wire.WatchTableResponseDelta
			}
			if err := out.send(ctx, &frame{head: lengthPrefix(nil, field, r.Body.Len()), body: r.Body}); err != nil {
				return toStatus(err)
			}
			if err := cur.Ack(r.Version); err != nil {
				return toStatus(err) // cannot happen: r is the response in flight
			}
			continue
		}
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), errShuttingDown) {
				return toStatus(errShuttingDown)
			}
			return nil
		case <-sub.Wake():
			cur.Update(sub.Take())
		}
	}
}

// lengthPrefix appends the tag and length of a length-delimited field num
// whose n bytes of content follow.
func lengthPrefix(b []byte, num protowire.Number, n int) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// maxHellos bounds the hellos held at once: each holds a hash of every
// entry (400 KB at 10,000 Services), so 128 are 50 MB, where a reconnect
// of 5,000 agents held 2.2 GB. Processing a current agent's hello takes
// well under a millisecond, so a few keep the CPU busy; 128 also leave
// room when a client holds slots without saying hello (helloTimeout).
const maxHellos = 128

// helloTimeout bounds the wait for a hello, which an agent sends as the
// stream opens, so that silent streams hold a hello slot briefly.
const helloTimeout = 10 * time.Second

// maxCapabilityLen bounds each string an agent reports about itself: the
// registry keeps them while the agent is connected.
const maxCapabilityLen = 128

// validHello checks what a hello may carry before anything is kept of it.
func validHello(h *pb.Hello) error {
	if err := validNodeName(h.GetNodeName()); err != nil {
		return err
	}
	c := h.GetCapabilities()
	for _, f := range []struct{ name, value string }{
		{"dataplane", c.GetDataplane()}, {"agent_version", c.GetAgentVersion()},
	} {
		if len(f.value) > maxCapabilityLen {
			return fmt.Errorf("%w: capabilities.%s is %d bytes, more than %d", errInvalid, f.name, len(f.value), maxCapabilityLen)
		}
	}
	_, err := helloNodeAddresses(h)
	return err
}

// MaxNodeAddresses bounds Hello.node_addresses: a node has a few
// addresses (its links, a bridge or two), and every replica keeps each
// node's in memory.
const MaxNodeAddresses = 64

// helloNodeAddresses returns the node addresses h reports, or why they are
// invalid: more than MaxNodeAddresses, or one that is not a canonical
// global unicast address without a zone (those the agent reports; any
// other is no Service's external or load balancer IP anyway).
func helloNodeAddresses(h *pb.Hello) ([]netip.Addr, error) {
	raw := h.GetNodeAddresses()
	if len(raw) > MaxNodeAddresses {
		return nil, fmt.Errorf("%w: hello lists %d node addresses, more than %d", errInvalid, len(raw), MaxNodeAddresses)
	}
	out := make([]netip.Addr, 0, len(raw))
	for i, s := range raw {
		a, err := netip.ParseAddr(s)
		if err != nil || a.String() != s || a.Zone() != "" || a.Is4In6() || !a.IsGlobalUnicast() {
			return nil, fmt.Errorf("%w: hello node_addresses[%d] %.64q: not a canonical global unicast address", errInvalid, i, s)
		}
		out = append(out, a)
	}
	return out, nil
}

func validNodeName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: node name is empty", errInvalid)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%w: node name %q: %s", errInvalid, name, errs[0])
	}
	return nil
}

// toStatus maps an error to a gRPC status: the only place codes are chosen.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case status.Code(err) != codes.Unknown:
		return err
	case errors.Is(err, errInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errReplaced):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, errShuttingDown):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, errKeepaliveTimeout), errors.Is(err, errWriteTimeout), errors.Is(err, errAckTimeout):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// reason names why a stream closed, for the streams_closed_total metric.
func reason(err error) string {
	switch {
	case err == nil:
		return "eof"
	case errors.Is(err, errInvalid):
		return "invalid"
	case errors.Is(err, errReplaced):
		return "replaced"
	case errors.Is(err, errShuttingDown):
		return "shutdown"
	case errors.Is(err, errKeepaliveTimeout):
		return "keepalive_timeout"
	case errors.Is(err, errWriteTimeout):
		return "write_timeout"
	case errors.Is(err, errAckTimeout):
		return "ack_timeout"
	}
	return "error"
}
