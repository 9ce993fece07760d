package floor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
	"github.com/proxyplane/proxyplane/nodeagent/client"
)

// ClientsOptions configures the clients' process.
type ClientsOptions struct {
	// Address is the floor server's gRPC address, on 127.0.0.1.
	Address string
	// Clients is the number of clients, each on its own connection.
	Clients int
	// ReplyBytes is the size of each reply.
	ReplyBytes int
	// Retry is the wait before a client whose stream ended opens another.
	Retry time.Duration
	// Lifetime bounds the process: it exits after this long whatever
	// happens.
	Lifetime time.Duration
}

func newClientsOptions() *ClientsOptions {
	return &ClientsOptions{
		// An ACK: a version and a nonce.
		ReplyBytes: 40,
		// A stream ends only when the server goes away: no backoff is
		// needed, only no busy loop.
		Retry:    100 * time.Millisecond,
		Lifetime: 2 * time.Hour,
	}
}

// AddFlags registers the options on fs.
func (o *ClientsOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Address, "address", o.Address, "Floor server gRPC address (127.0.0.1:port).")
	fs.IntVar(&o.Clients, "clients", o.Clients, "Number of clients, each on its own connection.")
	fs.IntVar(&o.ReplyBytes, "reply-bytes", o.ReplyBytes, "Size of each reply.")
	fs.DurationVar(&o.Retry, "retry", o.Retry, "Wait before reopening a stream that ended.")
	fs.DurationVar(&o.Lifetime, "lifetime", o.Lifetime, "Exit after this long in any case.")
}

// Limits implements contract.ChildOptions: one connection per client.
func (o *ClientsOptions) Limits() (int, time.Duration) { return o.Clients, o.Lifetime }

// Validate reports every invalid option at once.
func (o *ClientsOptions) Validate() error {
	var errs []error
	if host, _, err := net.SplitHostPort(o.Address); err != nil || host != "127.0.0.1" {
		errs = append(errs, fmt.Errorf("--address %q: want 127.0.0.1:port", o.Address))
	}
	// Source addresses are 127.64.0.1 onwards (sourceAddr).
	if o.Clients < 1 || o.Clients > 1<<20 {
		errs = append(errs, fmt.Errorf("--clients %d: between 1 and %d", o.Clients, 1<<20))
	}
	if o.ReplyBytes < 1 || o.ReplyBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("--reply-bytes %d: between 1 and 1 MiB", o.ReplyBytes))
	}
	if o.Retry <= 0 || o.Lifetime <= 0 {
		errs = append(errs, errors.New("--retry and --lifetime must be positive"))
	}
	return errors.Join(errs...)
}

// maxRecvMessageBytes is nodeagent's bound on a response; the floor's
// messages are far below it, but the transport options take one.
const maxRecvMessageBytes = 64 << 20

// ClientsMain runs the clients' process: it parses args, starts every
// client at once, prints the ready line on stdout, and serves /report
// until ctx ends or the lifetime passes.
func ClientsMain(ctx context.Context, args []string, stdout io.Writer) error {
	o := newClientsOptions()
	ctx, cancel, err := contract.StartChild(ctx, "floor-clients", args, o)
	if err != nil {
		return err
	}
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening for control: %w", err)
	}
	c := &clients{opts: o, reply: make(frame, o.ReplyBytes)}
	for i := range o.Clients {
		go c.run(ctx, i)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, _ *http.Request) { contract.WriteJSON(w, c.report()) })
	return contract.Serve(ctx, stdout, ln, mux)
}

// clients is what the clients share.
type clients struct {
	opts     *ClientsOptions
	reply    frame // every client's reply: shared, never copied
	open     atomic.Int64
	received atomic.Uint64

	mu     sync.Mutex // guards errors
	errors []string
}

// maxErrors bounds the stream errors kept for the report.
const maxErrors = 10

// run keeps client i's stream open until ctx ends.
func (c *clients) run(ctx context.Context, i int) {
	for {
		err := c.session(ctx, i)
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		if len(c.errors) < maxErrors {
			c.errors = append(c.errors, fmt.Sprintf("client %d: %v", i, err))
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.opts.Retry):
		}
	}
}

// session opens client i's connection and stream and answers every
// message at once, on one goroutine, as the simulated agents do, until the
// stream fails.
func (c *clients) session(ctx context.Context, i int) error {
	conn, err := grpc.NewClient(c.opts.Address, append(client.TransportOptions(maxRecvMessageBytes),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialFrom(sourceAddr(i))),
	)...)
	if err != nil {
		return fmt.Errorf("dialing %s: %w", c.opts.Address, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.NewStream(ctx, &streamDesc, fullMethod, grpc.ForceCodecV2(codec{}))
	if err != nil {
		return fmt.Errorf("opening stream: %w", err)
	}
	c.open.Add(1)
	defer c.open.Add(-1)
	for {
		var m rawMessage
		if err := stream.RecvMsg(&m); err != nil {
			return fmt.Errorf("receiving: %w", err)
		}
		if err := stream.SendMsg(c.reply); err != nil {
			return fmt.Errorf("replying: %w", err)
		}
		c.received.Add(1)
	}
}

func (c *clients) report() ClientsReport {
	r := ClientsReport{Clients: c.opts.Clients, Open: int(c.open.Load()), Received: c.received.Load()}
	c.mu.Lock()
	r.Errors = append([]string(nil), c.errors...)
	c.mu.Unlock()
	return r
}

// dialFrom dials TCP as gRPC's default dialer does, from src.
func dialFrom(src net.IP) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("dialing %s from %s: %w", addr, src, err)
		}
		return conn, nil
	}
}

// sourceAddr is client i's address: 127.64.0.1 + i. Each client has its
// own, as each simulated agent has (from 127.16.0.1), so that the
// connections look like the agents' to the kernel; all of 127/8 is
// loopback on Linux.
func sourceAddr(i int) net.IP {
	v := uint32(127)<<24 | 64<<16 + uint32(i) + 1
	return net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}
