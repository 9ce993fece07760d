// Package limit bounds what clients of the control plane's gRPC port can
// make it hold, whoever they are: connections, streams and calls in
// total, Sync streams, and the rate at which one peer address opens
// connections and calls. It runs before authentication, so that a flood
// of bad tokens is throttled before it costs a TokenReview; only the
// Sync cap runs after it, so that only authenticated agents count
// against it.
package limit

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Defaults of Config, each with its reason.
const (
	// DefaultMaxAgents: one replica is sized for 5,000 nodes (it carries
	// every agent while the other is away); twice that leaves headroom
	// for growth and for reconnects overlapping the streams they replace.
	DefaultMaxAgents = 10000
	// DefaultMaxStreams: every agent's Sync stream, plus room for
	// operators' WatchTable streams, reflection and health checks.
	DefaultMaxStreams = DefaultMaxAgents + 1000
	// DefaultMaxConnections: an agent needs one connection, and so does
	// each grpcurl; past this a connection is closed as it is accepted.
	DefaultMaxConnections = DefaultMaxStreams
	// DefaultPeerRate and DefaultPeerBurst: an agent opens a connection
	// and a Sync stream per reconnect, with a backoff of a second or more;
	// an operator's grpcurl a connection and a call per command, and
	// operators behind one address (a bastion, kubectl port-forward)
	// share a bucket. Twenty at once and two a second after that serve
	// both, and hold a flood from one address to two TokenReviews a
	// second.
	DefaultPeerRate  = 2.0
	DefaultPeerBurst = 20
	// DefaultMaxPeers bounds the per-address buckets kept: every node of
	// a 5,000-node cluster with room to spare, at about 200 bytes each.
	// Past it the least recently seen address loses its bucket, which
	// only gives that address a fresh burst.
	DefaultMaxPeers = 16384
)

// Config configures a Limiter. Zero fields take the defaults above,
// except PeerRate: a negative PeerRate turns the per-peer limit off.
type Config struct {
	// MaxAgents caps the Sync streams open at once (--max-agents).
	MaxAgents int
	// MaxStreams caps streams and unary calls in flight, of every service.
	MaxStreams int
	// MaxConnections caps open connections.
	MaxConnections int
	// PeerRate is how many connections and calls per second one peer
	// address may open, after a burst of PeerBurst.
	PeerRate  float64
	PeerBurst int
	// MaxPeers bounds the peer addresses tracked.
	MaxPeers int
}

func (c Config) withDefaults() Config {
	if c.MaxAgents <= 0 {
		c.MaxAgents = DefaultMaxAgents
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.PeerRate == 0 {
		c.PeerRate = DefaultPeerRate
	}
	if c.PeerBurst <= 0 {
		c.PeerBurst = DefaultPeerBurst
	}
	if c.MaxPeers <= 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	return c
}

// Limiter enforces a Config. Its methods are safe for concurrent use.
type Limiter struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	agents, streams, conns atomic.Int64
	// nextWarn throttles warnings about caps reached (UnixNano).
	nextWarn atomic.Int64

	mu sync.Mutex
	// peers and lru (front: most recently seen) hold one token bucket per
	// peer address; mu protects both.
	peers map[netip.Addr]*list.Element
	lru   *list.List
}

type peerBucket struct {
	addr netip.Addr
	lim  *rate.Limiter
}

// New returns a Limiter enforcing cfg.
func New(cfg Config, log *slog.Logger) *Limiter {
	return &Limiter{cfg: cfg.withDefaults(), log: log, now: time.Now, peers: map[netip.Addr]*list.Element{}, lru: list.New()}
}

// allowPeer takes a token from addr's bucket.
func (l *Limiter) allowPeer(addr netip.Addr) bool {
	if l.cfg.PeerRate < 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.peers[addr]
	if ok {
		l.lru.MoveToFront(e)
	} else {
		if l.lru.Len() >= l.cfg.MaxPeers {
			old := l.lru.Back()
			l.lru.Remove(old)
			delete(l.peers, old.Value.(*peerBucket).addr)
		}
		e = l.lru.PushFront(&peerBucket{addr: addr, lim: rate.NewLimiter(rate.Limit(l.cfg.PeerRate), l.cfg.PeerBurst)})
		l.peers[addr] = e
	}
	return e.Value.(*peerBucket).lim.AllowN(l.now(), 1)
}

// acquire counts one more in n unless that exceeds limit.
func acquire(n *atomic.Int64, limit int) bool {
	if n.Add(1) > int64(limit) {
		n.Add(-1)
		return false
	}
	return true
}

// warn logs that a cap was reached, at most once every ten seconds: a
// flood must not become a flood of log lines.
func (l *Limiter) warn(msg string, args ...any) {
	now := l.now().UnixNano()
	next := l.nextWarn.Load()
	if now >= next && l.nextWarn.CompareAndSwap(next, now+int64(10*time.Second)) {
		l.log.Warn(msg, args...)
	}
}

// admit applies the per-peer rate to a new TableService call (health
// checks and reflection cost nothing to answer, and grpcurl makes a
// reflection call before each command) and the stream cap to every new
// call; on success the caller must call the returned release when the
// call ends.
func (l *Limiter) admit(ctx context.Context, method string) (release func(), err error) {
	if strings.HasPrefix(method, tableServicePrefix) && !l.allowPeer(peerIP(ctx)) {
		return nil, status.Errorf(codes.ResourceExhausted, "too many calls from %s: at most %g a second after a burst of %d", peerIP(ctx), l.cfg.PeerRate, l.cfg.PeerBurst)
	}
	if !acquire(&l.streams, l.cfg.MaxStreams) {
		l.warn("refusing calls: the stream cap is reached", "maxStreams", l.cfg.MaxStreams)
		return nil, status.Errorf(codes.ResourceExhausted, "this replica serves its maximum of %d streams", l.cfg.MaxStreams)
	}
	return func() { l.streams.Add(-1) }, nil
}

// UnaryInterceptor admits unary calls; install it before authentication.
func (l *Limiter) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		release, err := l.admit(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		defer release()
		return handler(ctx, req)
	}
}

// StreamInterceptor admits streams; install it before authentication.
func (l *Limiter) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		release, err := l.admit(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		defer release()
		return handler(srv, ss)
	}
}

// AgentInterceptor caps open Sync streams at MaxAgents. Install it after
// authentication, so that only agents count.
func (l *Limiter) AgentInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod != pb.TableService_Sync_FullMethodName {
			return handler(srv, ss)
		}
		if !acquire(&l.agents, l.cfg.MaxAgents) {
			l.warn("refusing agents: --max-agents is reached", "maxAgents", l.cfg.MaxAgents)
			return status.Errorf(codes.ResourceExhausted, "this replica serves its maximum of %d agents; try another", l.cfg.MaxAgents)
		}
		defer l.agents.Add(-1)
		return handler(srv, ss)
	}
}

// Listener wraps ln: a connection past MaxConnections, or from a peer
// over its rate, is closed as soon as it is accepted, before its TLS
// handshake costs anything.
func (l *Limiter) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, l: l} }

type listener struct {
	net.Listener
	l *Limiter
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !ln.l.allowPeer(addrIP(c.RemoteAddr())) {
			_ = c.Close()
			continue
		}
		if !acquire(&ln.l.conns, ln.l.cfg.MaxConnections) {
			ln.l.warn("refusing connections: the connection cap is reached", "maxConnections", ln.l.cfg.MaxConnections)
			_ = c.Close()
			continue
		}
		return &conn{Conn: c, n: &ln.l.conns}, nil
	}
}

// conn gives its slot back once, however often it is closed.
type conn struct {
	net.Conn
	n    *atomic.Int64
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() { c.n.Add(-1) })
	return c.Conn.Close()
}

var tableServicePrefix = "/" + pb.TableService_ServiceDesc.ServiceName + "/"

func peerIP(ctx context.Context) netip.Addr {
	if p, ok := peer.FromContext(ctx); ok {
		return addrIP(p.Addr)
	}
	return netip.Addr{}
}

// addrIP is the address's IP; every address that has none (an in-memory
// test listener) shares the zero Addr's bucket.
func addrIP(a net.Addr) netip.Addr {
	if a == nil {
		return netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
