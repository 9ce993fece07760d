// Package limit bounds what clients of the control plane's gRPC port can
// make it hold, whoever they are: connections, streams and calls, Sync
// streams, and the rate at which one source (an address, and an IPv6
// /64 as a whole) opens connections and calls.
//
// Admission happens in grpc-go's tap (Tap), when a call's headers arrive
// and before a byte of its request is read: grpc-go reads and decodes a
// unary request before any interceptor runs, so an interceptor is too
// late to refuse one. Calls fall in two budgets there. The TableService's
// streams (Sync, WatchTable), whose first message is read only after
// authentication, share MaxStreams. Everything else (health checks and
// watches, reflection, the TableService's unary calls, whose request is
// read before anyone has proved anything) shares the small MaxUnverified,
// of which one source may hold MaxUnverifiedPerSource, and ends after
// IdleTimeout without a message from the client, so strangers can
// neither fill the agents' budget nor hold much memory.
// Only the Sync cap runs after authentication, so that only agents count
// against it.
package limit

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Defaults of Config, each with its reason.
const (
	// DefaultMaxAgents: one replica is sized for 5,000 nodes (it carries
	// every agent while the other is away); twice that leaves headroom
	// for growth and for reconnects overlapping the streams they replace.
	DefaultMaxAgents = 10000
	// DefaultMaxStreams: every agent's Sync stream, plus room for
	// operators' WatchTable streams.
	DefaultMaxStreams = DefaultMaxAgents + 1000
	// DefaultMaxConnections: an agent needs one connection, and so does
	// each grpcurl; past this a connection is closed as it is accepted.
	DefaultMaxConnections = DefaultMaxStreams + DefaultMaxUnverified
	// DefaultMaxUnverified bounds the calls in flight whose request may
	// be read before anything is known of the caller. Each may make
	// grpc-go read one message of up to --max-recv-message-bytes before
	// the server's codec refuses anything larger than a few KiB, so 16
	// hold at most 128 MiB at the 8 MiB default. Kubelet probes go to
	// :9641, so this serves operators' grpcurl and status commands, a few
	// at a time.
	DefaultMaxUnverified = 16
	// DefaultMaxUnverifiedPerSource keeps one address (one pod) from
	// taking the whole unverified budget: it takes four addresses to lock
	// operators out of health checks and ListNodes, never one.
	DefaultMaxUnverifiedPerSource = 4
	// DefaultIdleTimeout ends an unverified call that sends nothing for
	// this long: a health watch or a reflection stream left open, or a
	// request sent slowly to hold memory. grpcurl sends its reflection
	// requests back to back; a health watcher reconnects.
	DefaultIdleTimeout = time.Minute
	// DefaultPeerRate and DefaultPeerBurst: an agent opens a connection
	// and a Sync stream per reconnect, with a backoff of a second or more;
	// an operator's grpcurl a connection, a reflection stream and a call
	// per command, and operators behind one address (a bastion, kubectl
	// port-forward) share a bucket. Twenty at once and two a second after
	// that serve both, and hold a flood from one source to two calls a
	// second.
	DefaultPeerRate  = 2.0
	DefaultPeerBurst = 20
	// DefaultMaxPeers bounds the per-source buckets kept: every node of
	// a 5,000-node cluster with room to spare, at about 200 bytes each.
	// Past it the least recently seen source loses its bucket, which
	// only gives that source a fresh burst.
	DefaultMaxPeers = 16384
	// NetworkShare is how many addresses' allowance an IPv6 /64 gets in
	// all. Whoever holds one address of a /64 usually holds all of it and
	// could take a fresh bucket per call, so a /64 is limited as well as
	// each address; but a /64 may also be a whole subnet of nodes (a
	// cloud subnet holds thousands), whose agents all reconnect after a
	// failover: 64 addresses' burst and rate let 1,700 of them back in
	// within seconds.
	NetworkShare = 64
)

// Config configures a Limiter. Zero fields take the defaults above,
// except PeerRate: a negative PeerRate turns the per-peer limit off.
type Config struct {
	// MaxAgents caps the Sync streams open at once (--max-agents).
	MaxAgents int
	// MaxStreams caps the TableService's streams open at once.
	MaxStreams int
	// MaxUnverified caps every other call in flight: health, reflection,
	// the TableService's unary calls; MaxUnverifiedPerSource caps those
	// of one source.
	MaxUnverified, MaxUnverifiedPerSource int
	// IdleTimeout ends those calls after this long without a message
	// from the client.
	IdleTimeout time.Duration
	// MaxConnections caps open connections; MaxConnectionsPerSource,
	// when above 0, those of one source.
	MaxConnections, MaxConnectionsPerSource int
	// PeerRate is how many connections and calls per second one address
	// may open, after a burst of PeerBurst; an IPv6 /64 may open
	// NetworkShare times as many.
	PeerRate  float64
	PeerBurst int
	// MaxPeers bounds the sources tracked.
	MaxPeers int
}

func (c Config) withDefaults() Config {
	if c.MaxAgents <= 0 {
		c.MaxAgents = DefaultMaxAgents
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.MaxUnverified <= 0 {
		c.MaxUnverified = DefaultMaxUnverified
	}
	if c.MaxUnverifiedPerSource <= 0 {
		c.MaxUnverifiedPerSource = DefaultMaxUnverifiedPerSource
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
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
	// peers holds the per-address and per-/64 buckets; nil when
	// PeerRate is negative.
	peers *SourceBuckets

	agents, streams, unverified, conns atomic.Int64
	// nextWarn throttles warnings about caps reached (UnixNano).
	nextWarn atomic.Int64

	mu sync.Mutex
	// bySource counts the unverified calls in flight of each source that
	// has any, connsBySource the open connections of each source when
	// MaxConnectionsPerSource is set; mu guards both.
	bySource, connsBySource map[netip.Prefix]int
}

// New returns a Limiter enforcing cfg.
func New(cfg Config, log *slog.Logger) *Limiter {
	l := &Limiter{cfg: cfg.withDefaults(), log: log, now: time.Now, bySource: map[netip.Prefix]int{}, connsBySource: map[netip.Prefix]int{}}
	if l.cfg.PeerRate >= 0 {
		l.peers = NewSourceBuckets(l.cfg.PeerRate, l.cfg.PeerBurst, NetworkShare, l.cfg.MaxPeers)
	}
	return l
}

// allowPeer takes a token from src's bucket and from its network's.
func (l *Limiter) allowPeer(src netip.Prefix) bool {
	if l.peers == nil {
		return true
	}
	_, _, ok := l.peers.Take(src, l.now())
	return ok
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

// The refusals' statuses say what to do and nothing about this replica's
// settings: whoever sees them has proved nothing yet.
var (
	errPeerRate   = status.Error(codes.ResourceExhausted, "too many calls from this address; retry later")
	errStreams    = status.Error(codes.ResourceExhausted, "this replica serves its maximum of streams; try another")
	errUnverified = status.Error(codes.ResourceExhausted, "this replica serves its maximum of unauthenticated calls; retry later")
	errSource     = status.Error(codes.ResourceExhausted, "too many unauthenticated calls from this address; retry later")
	errIdle       = errors.New("no message from the client within the idle timeout")
)

// Tap is a grpc.InTapHandle: it admits every call when its headers
// arrive, before anything of it is read, and gives its slot back when the
// call ends. grpc-go calls it with the connection's lock held, so it only
// counts. Install it with grpc.InTapHandle.
func (l *Limiter) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	src := Source(ctx)
	if !l.allowPeer(src) {
		return nil, errPeerRate
	}
	switch info.FullMethodName {
	case pb.TableService_Sync_FullMethodName, pb.TableService_WatchTable_FullMethodName:
		// Authentication runs before their first message is read.
		if !acquire(&l.streams, l.cfg.MaxStreams) {
			l.warn("refusing streams: the stream cap is reached", "maxStreams", l.cfg.MaxStreams)
			return nil, errStreams
		}
		// The stream's context ends when the stream does, however it ends.
		context.AfterFunc(ctx, func() { l.streams.Add(-1) })
		return ctx, nil
	}
	if !l.acquireSource(src) {
		return nil, errSource
	}
	if !acquire(&l.unverified, l.cfg.MaxUnverified) {
		l.releaseSource(src)
		l.warn("refusing unauthenticated calls: their cap is reached", "maxUnverified", l.cfg.MaxUnverified)
		return nil, errUnverified
	}
	// grpc-go reads from the stream until its context ends, so ending it
	// when idle also ends a request sent byte by byte.
	ctx, cancel := context.WithCancelCause(ctx)
	it := &idle{d: l.cfg.IdleTimeout}
	it.t = time.AfterFunc(it.d, func() { cancel(errIdle) })
	context.AfterFunc(ctx, func() {
		it.t.Stop()
		l.unverified.Add(-1)
		l.releaseSource(src)
	})
	return context.WithValue(ctx, idleKey{}, it), nil
}

// acquireSource counts one more unverified call of src, unless src has
// MaxUnverifiedPerSource in flight.
func (l *Limiter) acquireSource(src netip.Prefix) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src] >= l.cfg.MaxUnverifiedPerSource {
		return false
	}
	l.bySource[src]++
	return true
}

func (l *Limiter) releaseSource(src netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

// idle ends a call's context once its client has sent nothing for d.
type idle struct {
	d time.Duration
	t *time.Timer
}

type idleKey struct{}

// StreamInterceptor restarts the idle timeout of an unverified stream
// (health watch, reflection) at each message from its client.
func (l *Limiter) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		it, ok := ss.Context().Value(idleKey{}).(*idle)
		if !ok {
			return handler(srv, ss)
		}
		return handler(srv, &idleStream{ServerStream: ss, idle: it})
	}
}

type idleStream struct {
	grpc.ServerStream
	idle *idle
}

func (s *idleStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.idle.t.Reset(s.idle.d)
	}
	return err
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

// Listener wraps ln: a connection past MaxConnections or
// MaxConnectionsPerSource, or from a source over its rate, is closed as
// soon as it is accepted, before its TLS handshake costs anything.
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
		src := addrSource(c.RemoteAddr())
		if !ln.l.allowPeer(src) {
			_ = c.Close()
			continue
		}
		if !acquire(&ln.l.conns, ln.l.cfg.MaxConnections) {
			ln.l.warn("refusing connections: the connection cap is reached", "maxConnections", ln.l.cfg.MaxConnections)
			_ = c.Close()
			continue
		}
		if !ln.l.acquireConn(src) {
			ln.l.conns.Add(-1)
			_ = c.Close()
			continue
		}
		return &conn{Conn: c, l: ln.l, src: src}, nil
	}
}

// acquireConn counts one more open connection of src, unless src has
// MaxConnectionsPerSource open (when set).
func (l *Limiter) acquireConn(src netip.Prefix) bool {
	if l.cfg.MaxConnectionsPerSource <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.connsBySource[src] >= l.cfg.MaxConnectionsPerSource {
		return false
	}
	l.connsBySource[src]++
	return true
}

// releaseConn gives back a connection's slots.
func (l *Limiter) releaseConn(src netip.Prefix) {
	l.conns.Add(-1)
	if l.cfg.MaxConnectionsPerSource <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.connsBySource[src]--; l.connsBySource[src] <= 0 {
		delete(l.connsBySource, src)
	}
}

// conn gives its slots back once, however often it is closed.
type conn struct {
	net.Conn
	l      *Limiter
	src    netip.Prefix
	closed atomic.Bool
}

func (c *conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.releaseConn(c.src)
	}
	return c.Conn.Close()
}

// Source is the source a call in ctx is limited as: its peer's address
// (see SourceOf).
func Source(ctx context.Context) netip.Prefix {
	if p, ok := peer.FromContext(ctx); ok {
		return addrSource(p.Addr)
	}
	return netip.Prefix{}
}

func addrSource(a net.Addr) netip.Prefix {
	if t, ok := a.(*net.TCPAddr); ok { // every peer but in tests: no parsing
		addr, ok := netip.AddrFromSlice(t.IP)
		if !ok {
			return netip.Prefix{}
		}
		return SourceOf(addr)
	}
	if a == nil {
		return netip.Prefix{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}
	}
	return SourceOf(ap.Addr())
}

// SourceOf is the source addr counts as: the address alone, as a /32 or
// /128. Every address that has none (an in-memory test listener) shares
// the zero Prefix.
func SourceOf(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	p, err := addr.Prefix(addr.BitLen())
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

// NetworkOf is the network a source belongs to: an IPv6 source's /64,
// which its owner usually holds whole; an IPv4 source itself.
func NetworkOf(src netip.Prefix) netip.Prefix {
	if !src.Addr().Is6() {
		return src
	}
	p, err := src.Addr().Prefix(64)
	if err != nil {
		return src
	}
	return p
}
