package app

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// countingListen is net.Listen, counting its calls and signalling each
// one on tried, so a test waits for attempts rather than for time.
type countingListen struct {
	calls atomic.Int64
	tried chan struct{}
}

func (c *countingListen) listen(network, addr string) (net.Listener, error) {
	c.calls.Add(1)
	l, err := net.Listen(network, addr)
	select {
	case c.tried <- struct{}{}:
	default:
	}
	return l, err
}

func newBinder(t *testing.T) (portBinder, *countingListen, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	c := &countingListen{tried: make(chan struct{}, 1)}
	return portBinder{
		listen:   c.listen,
		interval: 5 * time.Millisecond,
		log:      slog.New(slog.NewTextHandler(&logs, nil)),
	}, c, &logs
}

// holdPort listens on a free loopback port, as kube-proxy holds 10256.
func holdPort(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// A port another process holds does not stop the agent: bind says to wait,
// logging once, and wait binds the port as soon as it is released.
func TestPortInUseIsServedOnceFree(t *testing.T) {
	p, c, logs := newBinder(t)
	held := holdPort(t)
	addr := held.Addr().String()

	l, err := p.bind(addr)
	if err != nil || l != nil {
		t.Fatalf("bind(%s) with the port held = %v, %v; want no listener and no error", addr, l, err)
	}

	type result struct {
		l   net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := p.wait(t.Context(), addr)
		done <- result{l, err}
	}()
	// Several failed attempts while the port is held, then release it.
	before := c.calls.Load()
	for c.calls.Load() < before+3 {
		select {
		case <-c.tried:
		case r := <-done:
			t.Fatalf("wait returned %v, %v while the port was held", r.l, r.err)
		case <-time.After(10 * time.Second):
			t.Fatal("wait made no attempt in 10 s")
		}
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not bind the port within 10 s of its release")
	}
	if r.err != nil {
		t.Fatalf("wait: %v", r.err)
	}
	defer func() { _ = r.l.Close() }()
	if got := r.l.Addr().String(); got != addr {
		t.Fatalf("wait bound %s, want %s", got, addr)
	}
	// The listener serves: a connection to the port reaches it.
	go func() {
		if conn, err := r.l.Accept(); err == nil {
			_ = conn.Close()
		}
	}()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dialing the port after wait bound it: %v", err)
	}
	_ = conn.Close()

	out := logs.String()
	if n := strings.Count(out, "port in use"); n != 1 {
		t.Errorf("logged the port in use %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "port free: serving") {
		t.Errorf("no log line when the port was bound:\n%s", out)
	}
}

// Anything but a port in use is a mistake in the flags: the agent fails
// at start, as before, rather than wait for ever.
func TestWrongAddressFailsAtOnce(t *testing.T) {
	p, c, _ := newBinder(t)
	// TEST-NET-1 is on no interface of any machine.
	l, err := p.bind("192.0.2.1:10256")
	if err == nil {
		_ = l.Close()
		t.Fatal("bind on an address that is not the node's succeeded")
	}
	if !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("bind: %v, want EADDRNOTAVAIL", err)
	}
	if n := c.calls.Load(); n != 1 {
		t.Errorf("bind tried %d times, want once", n)
	}
	if _, err := p.wait(t.Context(), "192.0.2.1:10256"); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("wait: %v, want EADDRNOTAVAIL at the first attempt", err)
	}
}

// An agent stopping while it waits for a port returns at once.
func TestWaitEndsWithContext(t *testing.T) {
	p, c, _ := newBinder(t)
	held := holdPort(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := p.wait(ctx, held.Addr().String())
		done <- err
	}()
	select {
	case <-c.tried:
	case <-time.After(10 * time.Second):
		t.Fatal("wait made no attempt in 10 s")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("wait after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return within 10 s of its context ending")
	}
}
