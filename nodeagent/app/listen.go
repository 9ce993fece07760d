package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"
)

// Bounds on the agent's HTTP servers (/healthz on 10256, /metrics on
// 10249). 10256 is reachable by anything that reaches the node, as
// kube-proxy's is, for cloud load balancers' health checks; its clients
// send one short GET and read a short answer. A client that opens
// connections and sends nothing, a header a byte at a time, or never
// reads is cut off by these rather than holding a goroutine and buffers
// for as long as it likes.
const (
	// httpReadHeaderTimeout bounds the request line and headers,
	// httpReadTimeout the whole request (a GET has no body).
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	// httpWriteTimeout bounds writing the answer: a scrape is tens of
	// kilobytes.
	httpWriteTimeout = 30 * time.Second
	// httpIdleTimeout closes a kept-alive connection idle this long:
	// load balancers probe every few seconds, Prometheus every 15 to 60.
	httpIdleTimeout = 90 * time.Second
	// httpMaxHeaderBytes: these requests carry no token and few headers;
	// net/http's default is 1 MiB.
	httpMaxHeaderBytes = 16 << 10
)

// boundedServer is an HTTP server for addr with every phase of a
// connection bounded.
func boundedServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
	}
}

// portRetryInterval is how often the agent tries again to bind a port that
// another process holds. kube-proxy retries every 5 s; one second keeps
// short the gap in which nothing answers on 10256 once kube-proxy exits
// (cloud load balancers probe it on every node for externalTrafficPolicy
// Cluster Services), for one failed bind(2) a second while it waits.
const portRetryInterval = time.Second

// portBinder binds the agent's HTTP ports (/healthz on 10256, /metrics on
// 10249). Both are kube-proxy's ports, in the node's network namespace: on
// a node being migrated (docs/migration.md) kube-proxy holds them while
// the agent starts beside it, and the agent must program its rules then,
// not exit. A port in use is therefore waited for, as kube-proxy waits for
// its own with --bind-address-hard-fail=false (its default); any other
// failure (an address that is not the node's, a privileged port without
// the capability) is a mistake in the flags and fails the start.
type portBinder struct {
	// listen is net.Listen outside tests.
	listen func(network, address string) (net.Listener, error)
	// interval is the time between two attempts on a port in use.
	interval time.Duration
	log      *slog.Logger
}

// bind binds addr now. For a port in use it logs, once, that it will wait,
// and returns a nil listener and no error: wait binds it later.
func (p portBinder) bind(addr string) (net.Listener, error) {
	l, err := p.listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		p.log.Warn("port in use (kube-proxy during a migration?); serving on it as soon as it is free",
			"address", addr, "retryEvery", p.interval)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return l, nil
}

// wait tries to bind addr every interval until it succeeds, and logs when
// it does. It returns ctx's error when ctx ends first, and any failure
// other than the port being in use at once.
func (p portBinder) wait(ctx context.Context, addr string) (net.Listener, error) {
	start := time.Now()
	tick := time.NewTicker(p.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		l, err := p.listen("tcp", addr)
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w", addr, err)
		}
		p.log.Info("port free: serving", "address", addr, "waited", time.Since(start).Round(time.Millisecond))
		return l, nil
	}
}
