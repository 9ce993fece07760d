// Command backend is the test pods' server, shipped as the e2e backend
// image (`make images`): it answers on TCP and UDP as internal/nstest's
// servers do, so that the same probes read pods and namespaces alike, and
// on HTTP for probes and by hand.
//
//   - TCP, --port: each line read is answered "<name> <remote ip:port>\n",
//     until the client closes or stays idle for --idle-timeout;
//   - UDP, --port: each datagram is answered the same way;
//   - HTTP, --http-port: GET / answers the same line, /healthz "ok",
//     /probes the counts of --probe.
//
// With --probe=HOST:PORT (repeatable) it is also a client: every
// --probe-interval it opens a new TCP connection to each target, sends a
// line and reads the answer, and counts successes and failures, so a
// test can watch a Service from inside a pod while it rolls or drains
// what carries it.
//
// The name is --name, else $POD_NAME (the Downward API), else the host
// name. On SIGTERM it goes on serving for --drain, as a pod whose endpoint
// is being removed must while proxies catch up, then stops accepting and
// waits for the connections in flight (at most --idle-timeout).
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
)

// maxLine bounds a request line, as nstest's servers do.
const maxLine = 4096

func main() {
	fs := pflag.NewFlagSet("backend", pflag.ContinueOnError)
	port := fs.Int("port", 8080, "TCP and UDP port")
	httpPort := fs.Int("http-port", 8081, "HTTP port (0 for none)")
	name := fs.String("name", "", "name in every answer (default $POD_NAME, else the host name)")
	drain := fs.Duration("drain", 5*time.Second, "how long to go on serving after SIGTERM before closing the listeners")
	idle := fs.Duration("idle-timeout", 30*time.Second, "how long a TCP connection may stay idle")
	probes := fs.StringArray("probe", nil, "HOST:PORT to probe over TCP every --probe-interval (repeatable); GET /probes reports the counts")
	probeInterval := fs.Duration("probe-interval", 100*time.Millisecond, "time between two probes of a target")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *name == "" {
		*name = os.Getenv("POD_NAME")
	}
	if *name == "" {
		*name, _ = os.Hostname()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, config{name: *name, port: *port, httpPort: *httpPort, drain: *drain, idle: *idle, probes: *probes, probeInterval: *probeInterval}); err != nil {
		log.Error("backend failed", "err", err)
		os.Exit(1)
	}
}

type config struct {
	name           string
	port, httpPort int
	drain, idle    time.Duration
	probes         []string
	probeInterval  time.Duration
}

// run serves until ctx ends, then drains and returns.
func run(ctx context.Context, log *slog.Logger, c config) error {
	addr := net.JoinHostPort("", strconv.Itoa(c.port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on tcp %s: %w", addr, err)
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("listening on udp %s: %w", addr, err)
	}
	p := newProber(c.probes)
	var hs *http.Server
	var hln net.Listener
	if c.httpPort != 0 {
		haddr := net.JoinHostPort("", strconv.Itoa(c.httpPort))
		if hln, err = net.Listen("tcp", haddr); err != nil {
			_, _ = ln.Close(), pc.Close()
			return fmt.Errorf("listening on tcp %s: %w", haddr, err)
		}
		hs = &http.Server{Handler: handler(c.name, p), ReadHeaderTimeout: c.idle, IdleTimeout: c.idle}
	}
	log.Info("serving", "name", c.name, "port", c.port, "http-port", c.httpPort)

	var wg sync.WaitGroup
	wg.Go(func() { serveTCP(ln, c.name, c.idle, &wg) })
	wg.Go(func() { serveUDP(pc, c.name) })
	if hs != nil {
		wg.Go(func() { _ = hs.Serve(hln) })
	}
	wg.Go(func() { p.run(ctx, c.probeInterval) })

	<-ctx.Done()
	log.Info("terminating: serving on while endpoints are withdrawn", "drain", c.drain)
	time.Sleep(c.drain) // not a wait for a condition: the drain is the point
	_, _ = ln.Close(), pc.Close()
	if hs != nil {
		// ctx is done: shut down on a context of its own, bounded.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.idle)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}
	wg.Wait()
	log.Info("stopped")
	return nil
}

// serveTCP accepts until ln closes; each connection runs in its own
// goroutine, counted in wg so that shutdown waits for it.
func serveTCP(ln net.Listener, name string, idle time.Duration, wg *sync.WaitGroup) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { serveConn(c, name, idle) })
	}
}

// serveConn answers each line of c until EOF, an error or idle.
func serveConn(c net.Conn, name string, idle time.Duration) {
	defer func() { _ = c.Close() }()
	r := bufio.NewReaderSize(c, maxLine)
	for {
		if err := c.SetDeadline(time.Now().Add(idle)); err != nil {
			return
		}
		line, err := r.ReadSlice('\n')
		if len(line) == 0 && err != nil {
			return
		}
		if _, werr := fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr()); werr != nil {
			return
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return // EOF after a last line without a newline
		}
	}
}

// serveUDP answers each datagram until pc closes.
func serveUDP(pc net.PacketConn, name string) {
	buf := make([]byte, maxLine)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		// A lost reply shows up as the client's timeout.
		_, _ = pc.WriteTo([]byte(name+" "+from.String()+"\n"), from)
	}
}

// handler serves the answer line on /, "ok" on /healthz and p's counts on
// /probes.
func handler(name string, p *prober) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /probes", p)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(w, "%s %s\n", name, r.RemoteAddr)
	})
	return mux
}
