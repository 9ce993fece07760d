package floor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	cpserver "github.com/proxyplane/proxyplane/controlplane/server"
	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// errRunning refuses a run while another is in progress.
var errRunning = errors.New("a run is in progress")

// ServerOptions configures the server process.
type ServerOptions struct {
	// MessageBytes is the size of the message each stream sends per
	// round.
	MessageBytes int
	// MaxStreams is what the open-files limit is raised for.
	MaxStreams int
	// Lifetime bounds the process: it exits after this long whatever
	// happens.
	Lifetime time.Duration
}

func newServerOptions() *ServerOptions {
	return &ServerOptions{
		// The control plane's delta for one endpoint change to a node.
		MessageBytes: 200,
		MaxStreams:   1 << 15,
		Lifetime:     2 * time.Hour,
	}
}

// AddFlags registers the options on fs.
func (o *ServerOptions) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.MessageBytes, "message-bytes", o.MessageBytes, "Size of the message each stream sends per round.")
	fs.IntVar(&o.MaxStreams, "max-streams", o.MaxStreams, "Streams the open-files limit is raised for.")
	fs.DurationVar(&o.Lifetime, "lifetime", o.Lifetime, "Exit after this long in any case.")
}

// Limits implements contract.ChildOptions: one connection per stream at most.
func (o *ServerOptions) Limits() (int, time.Duration) { return o.MaxStreams, o.Lifetime }

// Validate reports every invalid option at once.
func (o *ServerOptions) Validate() error {
	var errs []error
	if o.MessageBytes < 1 || o.MessageBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("--message-bytes %d: between 1 and 1 MiB", o.MessageBytes))
	}
	if o.MaxStreams < 1 || o.Lifetime <= 0 {
		errs = append(errs, errors.New("--max-streams and --lifetime must be positive"))
	}
	return errors.Join(errs...)
}

// ServerMain runs the server process: it parses args, serves the method
// on 127.0.0.1, prints the ready line on stdout, and serves its control
// endpoint until ctx ends or the lifetime passes.
func ServerMain(ctx context.Context, args []string, stdout io.Writer) error {
	o := newServerOptions()
	ctx, cancel, err := contract.StartChild(ctx, "floor-server", args, o)
	if err != nil {
		return err
	}
	defer cancel()

	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening for gRPC: %w", err)
	}
	ctlLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = grpcLn.Close()
		return fmt.Errorf("listening for control: %w", err)
	}
	s := newServer(grpcLn.Addr().String(), make(frame, o.MessageBytes))
	// The control plane's options, codec included; then the floor's codec
	// in its place (the last codec option wins), which passes the floor's
	// frames through as the control plane's passes its own. No TLS, no
	// interceptors: only what gRPC itself does.
	gs := grpc.NewServer(append(cpserver.GRPCOptions(), grpc.ForceServerCodecV2(codec{}))...)
	gs.RegisterService(&serviceDesc, s)
	go func() { _ = gs.Serve(grpcLn) }()
	defer gs.Stop()
	return contract.Serve(ctx, stdout, ctlLn, s.handler(ctx))
}

// server is the floor's gRPC service and its rounds.
type server struct {
	addr    string
	msg     frame // every stream's message: shared, never copied
	streams atomic.Int64
	hub     hub

	mu  sync.Mutex // guards run
	run *record    // the last run; nil before the first
}

func newServer(addr string, msg frame) *server {
	s := &server{addr: addr, msg: msg}
	s.hub.wake = make(chan struct{})
	return s
}

// hub wakes every stream at once for a round by closing a channel, as the
// control plane's store wakes its subscribers on a new world.
type hub struct {
	mu   sync.Mutex // guards cur and wake
	cur  round
	wake chan struct{} // closed at the next round
}

// round is one round of a run.
type round struct {
	rec *record
	i   int
}

// take returns the current round and the channel closed at the next.
func (h *hub) take() (round, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.wake
}

// broadcast makes r the current round and wakes every stream.
func (h *hub) broadcast(r round) {
	h.mu.Lock()
	old := h.wake
	h.cur, h.wake = r, make(chan struct{})
	h.mu.Unlock()
	close(old)
}

// record is a run's rounds. Each slice has one element per round,
// written with atomics: streams and the run's goroutine write them while
// the control endpoint reads them.
type record struct {
	rounds, expected int
	pace, timeout    time.Duration
	replies          []atomic.Int64
	start, last      []atomic.Int64 // Unix nanoseconds
	done             []chan struct{}
	late             atomic.Int64
	finished         chan struct{} // closed when the run ends
	failure          string        // written before finished is closed
}

func newRecord(rounds, expected int, pace, timeout time.Duration) *record {
	r := &record{
		rounds: rounds, expected: expected, pace: pace, timeout: timeout,
		replies: make([]atomic.Int64, rounds), start: make([]atomic.Int64, rounds), last: make([]atomic.Int64, rounds),
		done: make([]chan struct{}, rounds), finished: make(chan struct{}),
	}
	for i := range r.done {
		r.done[i] = make(chan struct{})
	}
	return r
}

// replied counts a reply to round i; the last expected one completes it.
func (r *record) replied(i int) {
	if int(r.replies[i].Add(1)) == r.expected {
		r.last[i].Store(time.Now().UnixNano())
		close(r.done[i])
	}
}

// exchange is a stream's handler goroutine: on every round it sends the
// message and waits for the reply, which its receive goroutine hands it,
// as the control plane's Sync sends a delta and waits for the ACK.
func (s *server) exchange(stream grpc.ServerStream) error {
	s.streams.Add(1)
	defer s.streams.Add(-1)
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	in := make(chan error)
	go receive(ctx, stream, in)
	_, wake := s.hub.take()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
		var r round
		r, wake = s.hub.take()
		if err := stream.SendMsg(s.msg); err != nil {
			return fmt.Errorf("sending: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-in:
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
		}
		if r.rec != nil {
			r.rec.replied(r.i)
		}
	}
}

// receive hands each message's arrival (nil) to the handler, then the
// error that ended the stream. The message is copied out of gRPC's
// buffers and dropped: the control plane decodes its ACKs, which is its
// own work, not gRPC's.
func receive(ctx context.Context, stream grpc.ServerStream, in chan<- error) {
	for {
		var raw rawMessage
		err := stream.RecvMsg(&raw)
		select {
		case in <- err:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// start begins a run of rounds with the streams open now.
func (s *server) start(ctx context.Context, rounds int, pace, timeout time.Duration) (*record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run != nil {
		select {
		case <-s.run.finished:
		default:
			return nil, errRunning
		}
	}
	s.run = newRecord(rounds, int(s.streams.Load()), pace, timeout)
	go s.drive(ctx, s.run)
	return s.run, nil
}

// drive runs rec's rounds, one per pace. Rounds never overlap: a round
// starts only once every stream replied to the previous one, late if
// need be, so that every stream sees every round (a stream still waiting
// for a reply would take two broadcasts as one, as the control plane's
// streams coalesce changes).
func (s *server) drive(ctx context.Context, rec *record) {
	fail := func(msg string) { rec.failure = msg }
	defer close(rec.finished)
	tick := time.NewTicker(rec.pace)
	defer tick.Stop()
	wait := func(i int) bool {
		t := time.NewTimer(rec.timeout)
		defer t.Stop()
		select {
		case <-rec.done[i]:
			return true
		case <-t.C:
			fail(fmt.Sprintf("round %d: %d of %d replies within %s", i, rec.replies[i].Load(), rec.expected, rec.timeout))
		case <-ctx.Done():
			fail(fmt.Sprintf("round %d: %v", i, context.Cause(ctx)))
		}
		return false
	}
	for i := range rec.rounds {
		if i > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				fail(fmt.Sprintf("before round %d: %v", i, context.Cause(ctx)))
				return
			}
			select {
			case <-rec.done[i-1]:
			default:
				rec.late.Add(1)
				if !wait(i - 1) {
					return
				}
			}
		}
		rec.start[i].Store(time.Now().UnixNano())
		s.hub.broadcast(round{rec: rec, i: i})
	}
	wait(rec.rounds - 1)
}

// report returns the state now.
func (s *server) report() ServerReport {
	r := ServerReport{Address: s.addr, Streams: int(s.streams.Load())}
	s.mu.Lock()
	rec := s.run
	s.mu.Unlock()
	if rec != nil {
		rr := &RunReport{
			Rounds: rec.rounds, Expected: rec.expected, Late: int(rec.late.Load()),
			Replies: make([]int, rec.rounds), Last: make([]int64, rec.rounds),
		}
		for i := range rec.rounds {
			rr.Replies[i] = int(rec.replies[i].Load())
			if l := rec.last[i].Load(); l != 0 {
				rr.Last[i] = l - rec.start[i].Load()
			}
		}
		select {
		case <-rec.finished:
			rr.Done, rr.Failure = true, rec.failure
		default:
		}
		r.Run = rr
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.HeapInuse = ms.HeapInuse
	return r
}

// handler serves the control endpoint; runs go on under ctx.
//
// POST /run?rounds=R&pace=P&timeout=T runs R rounds, one per P, each
// bounded by T. GET /report?wait=W returns the report once the run is
// done, or after W: a long poll, so that the harness's waiting costs the
// measured process nothing per round.
func (s *server) handler(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /run", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rounds, err := strconv.Atoi(q.Get("rounds"))
		pace, perr := time.ParseDuration(q.Get("pace"))
		timeout, terr := time.ParseDuration(q.Get("timeout"))
		if err != nil || perr != nil || terr != nil || rounds < 1 || pace <= 0 || timeout <= 0 {
			http.Error(w, "rounds, pace, timeout: a positive count and durations", http.StatusBadRequest)
			return
		}
		if _, err := s.start(ctx, rounds, pace, timeout); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
		}
	})
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, r *http.Request) {
		if wait, err := time.ParseDuration(r.URL.Query().Get("wait")); err == nil && wait > 0 {
			s.mu.Lock()
			rec := s.run
			s.mu.Unlock()
			if rec != nil {
				t := time.NewTimer(wait)
				select {
				case <-rec.finished:
				case <-t.C:
				case <-r.Context().Done():
				}
				t.Stop()
			}
		}
		contract.WriteJSON(w, s.report())
	})
	return mux
}
