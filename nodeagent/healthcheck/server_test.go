package healthcheck

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// loopback is a Listen seam that puts the unspecified address of a family
// on that family's loopback, so that tests open nothing outside the host.
// calls records every listen as "network address", as asked.
type loopback struct {
	mu    sync.Mutex
	calls []string
}

func (l *loopback) listen(network, addr string) (net.Listener, error) {
	l.mu.Lock()
	l.calls = append(l.calls, network+" "+addr)
	l.mu.Unlock()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	switch host {
	case "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.Listen(network, net.JoinHostPort(host, port))
}

func (l *loopback) listens() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// newTestServer returns a server whose wildcard listeners are on loopback,
// closed at the end of the test.
func newTestServer(t *testing.T, cfg Config) (*Server, *loopback) {
	t.Helper()
	lb := &loopback{}
	if cfg.Listen == nil {
		cfg.Listen = lb.listen
	}
	s := New(cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, lb
}

// freePort returns a TCP port that was free on 127.0.0.1, and on ::1 too
// with both.
func freePort(t *testing.T, both bool) int32 {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("picking a port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if both {
			l6, err := net.Listen("tcp6", net.JoinHostPort("::1", strconv.Itoa(port)))
			if err != nil {
				continue
			}
			_ = l6.Close()
		}
		return int32(port)
	}
	t.Fatal("no port free on both loopbacks after 20 tries")
	return 0
}

func addr(host string, port int32) string { return net.JoinHostPort(host, strconv.Itoa(int(port))) }

type reply struct {
	status int
	header http.Header
	body   string
}

var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}

func get(t *testing.T, hostPort string) reply {
	t.Helper()
	r, err := getErr(hostPort)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func getErr(hostPort string) (reply, error) {
	resp, err := client.Get("http://" + hostPort + "/")
	if err != nil {
		return reply{}, fmt.Errorf("GET %s: %w", hostPort, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("reading %s: %w", hostPort, err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}, nil
}

// wantReply checks status, count and body against upstream's format.
func wantReply(t *testing.T, r reply, status int, name string, count int, healthy bool) {
	t.Helper()
	body := fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}", name, count, healthy)
	if r.status != status || r.body != body {
		t.Errorf("got %d %q, want %d %q", r.status, r.body, status, body)
	}
	for h, v := range map[string]string{
		"Content-Type":                     "application/json",
		"X-Content-Type-Options":           "nosniff",
		"X-Load-Balancing-Endpoint-Weight": strconv.Itoa(count),
	} {
		if got := r.header.Get(h); got != v {
			t.Errorf("header %s = %q, want %q", h, got, v)
		}
	}
}

// wantRefused checks that nothing listens on hostPort.
func wantRefused(t *testing.T, hostPort string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostPort, 5*time.Second)
	if err == nil {
		_ = c.Close()
		t.Fatalf("%s accepts connections, want refused", hostPort)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dialing %s: %v, want connection refused", hostPort, err)
	}
}

func ready(n int) func(*pb.Service) {
	eps := make([]*pb.Endpoint, n)
	for i := range eps {
		eps[i] = ep(fmt.Sprintf("10.244.1.%d", i+1), 8080, "r")
	}
	return local("http", eps...)
}

func TestServeLocalEndpoints(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	port := freePort(t, false)
	if err := s.Sync(tableOf(lbService("web", port, ready(2)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusOK, "web", 2, true)
}

func TestServeNoLocalEndpoints(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	port := freePort(t, false)
	// Only a terminating endpoint: it still gets traffic, but the load
	// balancer must drain the node.
	if err := s.Sync(tableOf(lbService("web", port, local("http", ep("10.244.1.5", 8080, "st"))))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusServiceUnavailable, "web", 0, true)
}

func TestSyncUpdatesCount(t *testing.T) {
	s, lb := newTestServer(t, Config{})
	port := freePort(t, false)
	for _, step := range []struct {
		count  int
		status int
	}{{1, http.StatusOK}, {3, http.StatusOK}, {0, http.StatusServiceUnavailable}, {1, http.StatusOK}} {
		if err := s.Sync(tableOf(lbService("web", port, ready(step.count)))); err != nil {
			t.Fatalf("Sync: %v", err)
		}
		wantReply(t, get(t, addr("127.0.0.1", port)), step.status, "web", step.count, true)
	}
	if got := lb.listens(); len(got) != 1 {
		t.Errorf("listens = %q, want one: a count change must keep the port open", got)
	}
}

func TestServiceRemovedClosesPort(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	port := freePort(t, false)
	if err := s.Sync(tableOf(lbService("web", port, ready(1)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	get(t, addr("127.0.0.1", port))
	if err := s.Sync(tableOf()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantRefused(t, addr("127.0.0.1", port))
}

func TestServiceTurnsClusterClosesPort(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	port := freePort(t, false)
	if err := s.Sync(tableOf(lbService("web", port, ready(1)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if err := s.Sync(tableOf(lbService("web", port, func(s *pb.Service) {
		s.ExternalTrafficPolicy, s.HealthCheckNodePort = pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER, 0
	}))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantRefused(t, addr("127.0.0.1", port))
}

func TestPortMoves(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	p1, p2 := freePort(t, false), freePort(t, false)
	if err := s.Sync(tableOf(lbService("web", p1, ready(1)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if err := s.Sync(tableOf(lbService("web", p2, ready(1)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantRefused(t, addr("127.0.0.1", p1))
	wantReply(t, get(t, addr("127.0.0.1", p2)), http.StatusOK, "web", 1, true)
}

func TestTwoServices(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	p1, p2 := freePort(t, false), freePort(t, false)
	if err := s.Sync(tableOf(lbService("a", p1, ready(1)), lbService("b", p2, ready(4)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", p1)), http.StatusOK, "a", 1, true)
	wantReply(t, get(t, addr("127.0.0.1", p2)), http.StatusOK, "b", 4, true)

	// Removing one leaves the other serving.
	if err := s.Sync(tableOf(lbService("b", p2, ready(4)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantRefused(t, addr("127.0.0.1", p1))
	wantReply(t, get(t, addr("127.0.0.1", p2)), http.StatusOK, "b", 4, true)
}

func TestPortTakenByAnotherProcess(t *testing.T) {
	s, lb := newTestServer(t, Config{})
	taken, free := freePort(t, false), freePort(t, false)
	other, err := net.Listen("tcp4", addr("127.0.0.1", taken))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()

	tbl := tableOf(lbService("a", taken, ready(1)), lbService("b", free, ready(2)))
	err = s.Sync(tbl)
	var le *ListenError
	if !errors.As(err, &le) || !IsListenError(err) {
		t.Fatalf("Sync = %v, want a ListenError", err)
	}
	if le.Service != "default/a" || le.Port != taken || le.Network != "tcp4" || le.Address != addr("0.0.0.0", taken) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("ListenError = %+v, want default/a on tcp4 %s, address in use", le, addr("0.0.0.0", taken))
	}
	wantReply(t, get(t, addr("127.0.0.1", free)), http.StatusOK, "b", 2, true)

	// Each Sync tries again, as upstream's each sync does; once the port
	// is free the Service gets it, and the other is left alone.
	if err := s.Sync(tbl); !IsListenError(err) {
		t.Fatalf("second Sync = %v, want a ListenError", err)
	}
	_ = other.Close()
	if err := s.Sync(tbl); err != nil {
		t.Fatalf("Sync after the port was freed: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", taken)), http.StatusOK, "a", 1, true)
	if got, want := lb.listens(), []string{
		"tcp4 " + addr("0.0.0.0", taken), "tcp4 " + addr("0.0.0.0", free),
		"tcp4 " + addr("0.0.0.0", taken), "tcp4 " + addr("0.0.0.0", taken),
	}; !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("listens = %q, want %q", got, want)
	}
}

func TestPortClaimedTwice(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	port := freePort(t, false)
	err := s.Sync(tableOf(lbService("b", port, ready(2)), lbService("a", port, ready(1))))
	if !errors.Is(err, ErrPortConflict) {
		t.Fatalf("Sync = %v, want ErrPortConflict", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusOK, "a", 1, true)
}

func TestProxyUnhealthy(t *testing.T) {
	var healthy atomic.Bool
	s, _ := newTestServer(t, Config{Healthy: healthy.Load})
	port := freePort(t, false)
	if err := s.Sync(tableOf(lbService("web", port, ready(2)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusServiceUnavailable, "web", 2, false)
	healthy.Store(true) // read on each request, not at Sync
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusOK, "web", 2, true)
}

func TestClose(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	p1, p2 := freePort(t, false), freePort(t, false)
	if err := s.Sync(tableOf(lbService("a", p1, ready(1)), lbService("b", p2))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wantRefused(t, addr("127.0.0.1", p1))
	wantRefused(t, addr("127.0.0.1", p2))
	if err := s.Sync(tableOf(lbService("a", p1, ready(1)))); !errors.Is(err, ErrClosed) {
		t.Errorf("Sync after Close = %v, want ErrClosed", err)
	}
	wantRefused(t, addr("127.0.0.1", p1))
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

func TestDualStack(t *testing.T) {
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = l.Close()
	}
	s, lb := newTestServer(t, Config{})
	port := freePort(t, true)
	dual := lbService("web", port, func(s *pb.Service) { s.ClusterIps = []string{"10.96.0.10", "fd00:96::10"} },
		local("http", ep("10.244.1.5", 8080, "r"), ep("10.244.1.6", 8080, "r"), ep("fd00:244::5", 8080, "r")))
	if err := s.Sync(tableOf(dual)); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	// Each family answers with its own endpoints, as upstream's
	// per-family proxiers do, on its own socket.
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusOK, "web", 2, true)
	wantReply(t, get(t, addr("::1", port)), http.StatusOK, "web", 1, true)
	if got, want := lb.listens(), []string{"tcp4 " + addr("0.0.0.0", port), "tcp6 " + addr("::", port)}; !slices.Equal(got, want) {
		t.Errorf("listens = %q, want %q", got, want)
	}

	// An IPv4-only Service has no IPv6 socket.
	v4 := lbService("web", port, ready(1))
	if err := s.Sync(tableOf(v4)); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusOK, "web", 1, true)
	wantRefused(t, addr("::1", port))
}

func TestNodePortAddresses(t *testing.T) {
	// All of 127.0.0.0/8 is local on Linux: 127.0.0.2 stands for a node
	// address inside --nodeport-addresses, 127.0.0.1 for one outside.
	ifaddrs := []net.Addr{
		&net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)},
		&net.IPNet{IP: net.ParseIP("127.0.0.2"), Mask: net.CIDRMask(8, 32)},
	}
	var fail atomic.Bool
	lb := &loopback{}
	s := newServer(Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, Listen: lb.listen},
		slog.New(slog.NewTextHandler(t.Output(), nil)),
		func() ([]net.Addr, error) {
			if fail.Load() {
				return nil, errors.New("netlink is down")
			}
			return ifaddrs, nil
		})
	t.Cleanup(func() { _ = s.Close() })
	port := freePort(t, false)
	tbl := tableOf(lbService("web", port, ready(1)))

	// Before the addresses were ever listed, all addresses, as upstream.
	fail.Store(true)
	if err := s.Sync(tbl); err == nil || IsListenError(err) {
		t.Fatalf("Sync = %v, want the listing error", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusOK, "web", 1, true)

	fail.Store(false)
	if err := s.Sync(tbl); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.2", port)), http.StatusOK, "web", 1, true)
	wantRefused(t, addr("127.0.0.1", port))

	// Later failures keep the last addresses.
	fail.Store(true)
	if err := s.Sync(tbl); err == nil {
		t.Fatal("Sync = nil, want the listing error")
	}
	wantReply(t, get(t, addr("127.0.0.2", port)), http.StatusOK, "web", 1, true)
	wantRefused(t, addr("127.0.0.1", port))
	if got, want := lb.listens(), []string{"tcp4 " + addr("0.0.0.0", port), "tcp4 " + addr("127.0.0.2", port)}; !slices.Equal(got, want) {
		t.Errorf("listens = %q, want %q", got, want)
	}
}

// TestNodePortAddressesFor checks nodePortAddresses "primary": the
// addresses come from each table's NodeInfo, and follow it.
func TestNodePortAddressesFor(t *testing.T) {
	ifaddrs := []net.Addr{
		&net.IPNet{IP: net.ParseIP("127.0.0.1"), Mask: net.CIDRMask(8, 32)},
		&net.IPNet{IP: net.ParseIP("127.0.0.2"), Mask: net.CIDRMask(8, 32)},
	}
	lb := &loopback{}
	primary := func(node *pb.NodeInfo) []netip.Prefix {
		var out []netip.Prefix
		for _, ip := range node.GetNodeIps() {
			a := netip.MustParseAddr(ip)
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
		return out
	}
	s := newServer(Config{NodePortAddressesFor: primary, Listen: lb.listen},
		slog.New(slog.NewTextHandler(t.Output(), nil)),
		func() ([]net.Addr, error) { return ifaddrs, nil })
	t.Cleanup(func() { _ = s.Close() })
	port := freePort(t, false)
	tbl := tableOf(lbService("web", port, ready(1)))
	tbl.Node = &pb.NodeInfo{Name: tbl.Node.GetName(), NodeIps: []string{"127.0.0.2"}}
	if err := s.Sync(tbl); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.2", port)), http.StatusOK, "web", 1, true)
	wantRefused(t, addr("127.0.0.1", port))

	tbl.Node = &pb.NodeInfo{Name: tbl.Node.GetName(), NodeIps: []string{"127.0.0.1"}}
	if err := s.Sync(tbl); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	wantReply(t, get(t, addr("127.0.0.1", port)), http.StatusOK, "web", 1, true)
	wantRefused(t, addr("127.0.0.2", port))
}

// TestConcurrentRequestsAndSyncs lets the race detector watch handlers
// read while Sync replaces what they read, and checks that each answer
// is consistent in itself.
func TestConcurrentRequestsAndSyncs(t *testing.T) {
	s, _ := newTestServer(t, Config{})
	port := freePort(t, false)
	if err := s.Sync(tableOf(lbService("web", port, ready(1)))); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	const clients, requests, syncs = 3, 30, 60
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range requests {
				r, err := getErr(addr("127.0.0.1", port))
				if err != nil {
					errs <- err
					return
				}
				w := r.header.Get("X-Load-Balancing-Endpoint-Weight")
				if r.status != http.StatusOK || (w != "1" && w != "2") {
					errs <- fmt.Errorf("got %d with weight %q, want 200 with 1 or 2", r.status, w)
					return
				}
			}
		})
	}
	for i := range syncs {
		if err := s.Sync(tableOf(lbService("web", port, ready(1+i%2)))); err != nil {
			t.Fatalf("Sync: %v", err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
