package healthcheck

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// readHeaderTimeout bounds a client that opens a connection and sends
// nothing: the ports face load balancers, and often the whole network, so
// a slow client must not hold a goroutine and a descriptor forever.
const readHeaderTimeout = 10 * time.Second

// Config configures a Server.
type Config struct {
	// NodePortAddresses are kube-proxy's --nodeport-addresses: each IP
	// family listens only on the node's addresses inside its prefixes. A
	// family with no prefix here, or with a /0, listens on all its
	// addresses (the unspecified address).
	NodePortAddresses []netip.Prefix
	// NodePortAddressesFor, when set, replaces NodePortAddresses at each
	// Sync with what it returns for the table's NodeInfo (which may be
	// nil): nodePortAddresses "primary" limits health checks, as
	// NodePorts, to the node's primary IPs, which the table carries.
	NodePortAddressesFor func(node *pb.NodeInfo) []netip.Prefix
	// Healthy reports the proxy's health, as kube-proxy's /healthz does
	// without node eligibility (upstream leaves that out of service health
	// checks). While it returns false every port answers 503. It is called
	// on each request, concurrently. Nil means always healthy.
	Healthy func() bool
	// Listen opens a listener; network is "tcp4" or "tcp6". Nil means
	// net.Listen. Tests use it to listen on loopback or in a network
	// namespace.
	Listen func(network, addr string) (net.Listener, error)
}

// Server answers HTTP on the healthCheckNodePort of every Service with
// externalTrafficPolicy Local, as kube-proxy's service health server does.
// Create it with New, feed it each table the agent programs with Sync, and
// stop it with Close. Its methods are safe for concurrent use.
type Server struct {
	cfg            Config
	log            *slog.Logger
	interfaceAddrs func() ([]net.Addr, error)

	// served is what the handlers answer from. Sync replaces the map
	// whole and never modifies a stored one, so handlers read it without
	// a lock and never wait for a Sync that is binding ports.
	served atomic.Pointer[map[int32]service]

	// mu serializes Sync and Close and guards the fields below. Handlers
	// never take it.
	mu        sync.Mutex
	listeners map[listenKey]*listener
	// policy is where ports listen: from NodePortAddresses, or from
	// NodePortAddressesFor and the last table.
	policy addressPolicy
	// addrs are the hosts last listened on per family, kept for when the
	// node's addresses cannot be listed; nil before the first success.
	addrs  *[numFamilies][]netip.Addr
	closed bool
}

// listenKey names one socket: a family's network and host:port.
type listenKey struct{ network, address string }

// listener is one open socket and the HTTP server on it.
type listener struct {
	srv  *http.Server
	done chan struct{} // closed once Serve has returned
}

// close stops the server, dropping its connections, and waits for Serve
// to return, so that the port is free when it returns.
func (l *listener) close() error {
	err := l.srv.Close()
	<-l.done
	return err
}

// New returns a server with no ports open. A nil log means
// slog.Default().
func New(cfg Config, log *slog.Logger) *Server {
	return newServer(cfg, log, net.InterfaceAddrs)
}

// newServer is New with the seam that lists the node's addresses.
func newServer(cfg Config, log *slog.Logger, interfaceAddrs func() ([]net.Addr, error)) *Server {
	if log == nil {
		log = slog.Default()
	}
	if cfg.Listen == nil {
		cfg.Listen = net.Listen
	}
	if cfg.Healthy == nil {
		cfg.Healthy = func() bool { return true }
	}
	s := &Server{
		cfg:            cfg,
		log:            log,
		policy:         newAddressPolicy(cfg.NodePortAddresses),
		interfaceAddrs: interfaceAddrs,
		listeners:      map[listenKey]*listener{},
	}
	s.served.Store(&map[int32]service{})
	return s
}

// Sync makes the server answer for t: it opens the ports of Services new
// in t, closes those of Services gone from it, and answers from t's local
// endpoint counts from now on. It is idempotent: a Sync with an unchanged
// table changes nothing, except that it tries again the ports that could
// not be opened before and follows changes of the node's addresses. A nil
// t closes every port.
//
// Sync applies all it can. A port that cannot be opened on some address
// (see ListenError), two Services on one port (ErrPortConflict) or node
// addresses that cannot be listed are logged and returned together as one
// error; every other port is served regardless, so the caller should
// report the error and go on, not treat the dataplane sync as failed.
// After Close it returns ErrClosed.
func (s *Server) Sync(t *proxytable.Table) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	var node string
	if t != nil {
		node = t.Node.GetName()
		if s.cfg.NodePortAddressesFor != nil {
			s.policy = newAddressPolicy(s.cfg.NodePortAddressesFor(t.Node))
		}
	}
	want, errs := desired(t)
	for _, err := range errs {
		s.log.Error("Service left without a health check", "node", node, "err", err)
	}
	addrs, err := s.addresses()
	if err != nil {
		s.log.Error("cannot list node addresses; health checks stay where they listened, or listen on all addresses at first",
			"node", node, "err", err)
		errs = append(errs, err)
	}

	// Publish first: a listener opened below answers for its Service from
	// its first connection, and one about to close answers 503.
	s.served.Store(&want)

	wanted := map[listenKey]int32{}
	for port, svc := range want {
		for f := range svc.endpoints {
			for _, host := range addrs[f] {
				wanted[listenKey{f.network(), net.JoinHostPort(host.String(), strconv.Itoa(int(port)))}] = port
			}
		}
	}
	for key, l := range s.listeners {
		if _, ok := wanted[key]; ok {
			continue
		}
		s.log.Info("closing health check", "network", key.network, "address", key.address)
		if err := l.close(); err != nil {
			s.log.Warn("error closing health check", "network", key.network, "address", key.address, "err", err)
		}
		delete(s.listeners, key)
	}
	for _, key := range slices.SortedFunc(maps.Keys(wanted), compareKeys) {
		if s.listeners[key] != nil {
			continue
		}
		port := wanted[key]
		svc := want[port]
		l, err := s.open(key, port)
		if err != nil {
			// Upstream records a FailedToStartServiceHealthcheck event; the
			// agent has no API client, so the log and the error say it.
			s.log.Error("failed to start health check", "node", node, "service", svc.key(), "port", port,
				"network", key.network, "address", key.address, "err", err)
			errs = append(errs, &ListenError{Service: svc.key(), Port: port, Network: key.network, Address: key.address, Err: err})
			continue
		}
		s.log.Info("opened health check", "service", svc.key(), "network", key.network, "address", key.address)
		s.listeners[key] = l
	}
	if len(errs) > 0 {
		return fmt.Errorf("syncing health check node ports: %w", errors.Join(errs...))
	}
	return nil
}

// compareKeys orders listeners so that Sync opens them, and logs its
// failures, in the same order every time.
func compareKeys(a, b listenKey) int {
	return cmp.Or(strings.Compare(a.network, b.network), strings.Compare(a.address, b.address))
}

// addresses returns the hosts to listen on by family. When the node's
// addresses cannot be listed it keeps the last ones, or, before any,
// listens on all addresses as upstream does when it cannot list them.
func (s *Server) addresses() ([numFamilies][]netip.Addr, error) {
	if !s.policy.needsInterfaces() {
		return s.policy.addresses(nil), nil
	}
	ifaddrs, err := s.interfaceAddrs()
	if err != nil {
		err = fmt.Errorf("listing node addresses: %w", err)
		if s.addrs != nil {
			return *s.addrs, err
		}
		return addressPolicy{}.addresses(nil), err
	}
	addrs := s.policy.addresses(ifaddrs)
	s.addrs = &addrs
	return addrs, nil
}

// open listens on key and serves port's health check there.
func (s *Server) open(key listenKey, port int32) (*listener, error) {
	ln, err := s.cfg.Listen(key.network, key.address)
	if err != nil {
		return nil, err
	}
	fam := ipv4
	if key.network == ipv6.network() {
		fam = ipv6
	}
	l := &listener{
		srv: &http.Server{
			Handler:           s.handler(port, fam),
			ReadHeaderTimeout: readHeaderTimeout,
			ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(l.done)
		if err := l.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("health check stopped serving", "address", key.address, "err", err)
		}
	}()
	return l, nil
}

// response is upstream's body, field for field and in the same order.
type response struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// handler answers on one family's socket of port, whatever the path and
// method, as upstream: 200 when the family has local ready endpoints and
// the proxy is healthy, else 503, with the count also in
// X-Load-Balancing-Endpoint-Weight for load balancers that weight nodes.
func (s *Server) handler(port int32, fam family) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		svc, ok := (*s.served.Load())[port]
		count, hasFamily := svc.endpoints[fam]
		if !ok || !hasFamily {
			// The listener is being closed by a concurrent Sync. Upstream
			// writes an empty 200 here; nothing is the truthful answer.
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		healthy := s.cfg.Healthy()

		var body response
		body.Service.Namespace, body.Service.Name = svc.namespace, svc.name
		body.LocalEndpoints, body.ServiceProxyHealthy = count, healthy
		// Indented with tabs and without a trailing newline, the bytes are
		// upstream's, for anything that matches on them.
		b, err := json.MarshalIndent(body, "", "\t")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}

		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if count != 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(b)
	})
}

// Close closes every port and waits for their servers to stop; Sync then
// returns ErrClosed. It is idempotent and returns the errors of closing
// the listeners.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	for key, l := range s.listeners {
		if err := l.close(); err != nil {
			errs = append(errs, fmt.Errorf("closing health check on %s: %w", key.address, err))
		}
		delete(s.listeners, key)
	}
	s.served.Store(&map[int32]service{})
	return errors.Join(errs...)
}
