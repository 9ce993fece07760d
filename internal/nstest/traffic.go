package nstest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Bounds on traffic, so no loop or wait in a test runs unbounded.
const (
	// DefaultDialTimeout applies when a dial is given a timeout of zero or
	// less.
	DefaultDialTimeout = 5 * time.Second
	// MaxDialTimeout caps every dial's timeout.
	MaxDialTimeout = time.Minute
	// MaxSpread caps the number of dials in one Spread call.
	MaxSpread = 10000
	// serverConnTimeout bounds how long a backend waits for a client's
	// line, so a silent client cannot hold a server goroutine.
	serverConnTimeout = 10 * time.Second
	// maxLine bounds the request and reply lines.
	maxLine = 4096
	// Dials take source ports from [firstSourcePort, firstSourcePort +
	// sourcePorts): above the usual service and NodePort ranges, and
	// counted rather than random so no port repeats within a topology
	// until 20000 dials have passed.
	firstSourcePort = 40000
	sourcePorts     = 20000
	// maxBindTries bounds retries when a chosen source port is taken.
	maxBindTries = 8
)

// Server is a backend started by ServeTCP, ServeUDP, ServeTCPIn or
// ServeUDPIn. It stops when the test's cleanup runs, or earlier on Close.
type Server struct {
	label string
	ln    net.Listener   // TCP servers
	pc    net.PacketConn // UDP servers
	wg    sync.WaitGroup

	// mu guards conns and closed.
	mu sync.Mutex
	// conns are the open TCP connections, closed by Close.
	conns  map[net.Conn]struct{}
	closed bool
}

// Addr returns the address the server listens on.
func (s *Server) Addr() net.Addr {
	if s.ln != nil {
		return s.ln.Addr()
	}
	return s.pc.LocalAddr()
}

// Close stops the server, closes its open connections and waits for its
// goroutines to exit. It is idempotent and safe for concurrent use; a
// stopped TCP port refuses connections, a stopped UDP port answers with
// "port unreachable".
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	var err error
	if s.ln != nil {
		err = s.ln.Close()
	} else {
		err = s.pc.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// ServeTCP starts a TCP backend on port in pod i, on all its addresses. See
// ServeTCPIn.
func (tp *Topology) ServeTCP(podIndex, port int) *Server {
	tp.tb.Helper()
	tp.checkPod(podIndex)
	return tp.ServeTCPIn(tp.PodNS(podIndex), "", port)
}

// ServeUDP starts a UDP backend on port in pod i, on all its addresses. See
// ServeUDPIn.
func (tp *Topology) ServeUDP(podIndex, port int) *Server {
	tp.tb.Helper()
	tp.checkPod(podIndex)
	return tp.ServeUDPIn(tp.PodNS(podIndex), "", port)
}

// ServeTCPIn starts a TCP backend in namespace ns listening on addr
// ("" for all IPv4 and IPv6 addresses) and port (0 for any; see
// Server.Addr). It reads one line from each connection and answers
// "<label> <remote ip:port>\n", where label is the namespace's role
// ("node", "client", "pod-0", ...) or, for a namespace New did not create,
// its name. The server stops on the test's cleanup. ServeTCPIn fails the
// test if it cannot listen, so call it from the test goroutine.
func (tp *Topology) ServeTCPIn(ns, addr string, port int) *Server {
	tp.tb.Helper()
	s := &Server{label: tp.label(ns), conns: map[net.Conn]struct{}{}}
	err := doIn(ns, func() error {
		var err error
		s.ln, err = net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
		return err
	})
	if err != nil {
		tp.tb.Fatalf("nstest: listening on tcp %s port %d in %s: %v", addr, port, ns, err)
	}
	tp.tb.Cleanup(func() { tp.closeServer(s, ns) })
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// ServeUDPIn starts a UDP backend in namespace ns listening on addr ("" for
// all addresses) and port. It answers each datagram with
// "<label> <remote ip:port>\n" as ServeTCPIn does. A wildcard listener
// replies from the address the kernel's route lookup picks, so in a
// namespace with several addresses on the path (the node) pass the address
// clients dial. ServeUDPIn fails the test if it cannot listen, so call it
// from the test goroutine.
func (tp *Topology) ServeUDPIn(ns, addr string, port int) *Server {
	tp.tb.Helper()
	s := &Server{label: tp.label(ns)}
	err := doIn(ns, func() error {
		var err error
		s.pc, err = net.ListenPacket("udp", net.JoinHostPort(addr, strconv.Itoa(port)))
		return err
	})
	if err != nil {
		tp.tb.Fatalf("nstest: listening on udp %s port %d in %s: %v", addr, port, ns, err)
	}
	tp.tb.Cleanup(func() { tp.closeServer(s, ns) })
	s.wg.Add(1)
	go s.udpLoop()
	return s
}

func (tp *Topology) closeServer(s *Server, ns string) {
	if err := s.Close(); err != nil {
		tp.tb.Errorf("nstest: stopping server %v in %s: %v", s.Addr(), ns, err)
	}
}

func (tp *Topology) label(ns string) string {
	if l, ok := tp.labels[ns]; ok {
		return l
	}
	return ns
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			// Closed by Close, or a failure no retry would cure; either way
			// later dials see "connection refused" or a timeout.
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	if err := c.SetDeadline(time.Now().Add(serverConnTimeout)); err != nil {
		return
	}
	// The request's content does not matter; reading it proves data flows
	// client to server, not just the handshake.
	if _, err := bufio.NewReader(io.LimitReader(c, maxLine)).ReadString('\n'); err != nil && !errors.Is(err, io.EOF) {
		return
	}
	// A failed reply shows up as the client's error.
	_, _ = fmt.Fprintf(c, "%s %s\n", s.label, c.RemoteAddr())
}

func (s *Server) udpLoop() {
	defer s.wg.Done()
	buf := make([]byte, maxLine)
	for {
		_, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		// A lost reply shows up as a client timeout; nothing to do here.
		_, _ = s.pc.WriteTo([]byte(s.label+" "+from.String()+"\n"), from)
	}
}

// Reply is a backend's answer to a dial.
type Reply struct {
	// Backend is the label of the answering server, such as "pod-0".
	Backend string
	// SeenFrom is the source address the backend saw, without the port:
	// the client's own address, or a masquerading node's.
	SeenFrom netip.Addr
}

// DialError is the error from DialTCP, DialUDP and Spread. Classify it with
// IsRefused, IsTimeout and IsUnreachable.
type DialError struct {
	// NS is the namespace dialled from.
	NS string
	// Network is "tcp" or "udp".
	Network string
	// Addr is the address dialled.
	Addr string
	// Err is the underlying error.
	Err error
}

func (e *DialError) Error() string {
	return fmt.Sprintf("dialing %s %s from %s: %v", e.Network, e.Addr, e.NS, e.Err)
}

// Unwrap returns the underlying error.
func (e *DialError) Unwrap() error { return e.Err }

// IsRefused reports whether err means the destination refused: a TCP
// reset, or an ICMP "port unreachable" (what a REJECT rule, a closed UDP
// port, or a service without endpoints produce).
func IsRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
}

// IsTimeout reports whether err means no answer arrived in time, which is
// what a DROP rule (or a missing forward or route back) produces.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// IsUnreachable reports whether err means an ICMP "host unreachable" or
// "network unreachable", or no route: what a REJECT with
// --reject-with icmp-host-unreachable, or a missing route, produces.
func IsUnreachable(err error) bool {
	return errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// DialTCP connects from namespace ns to addr ("host:port"; see HostPort),
// sends one line and returns the parsed reply. timeout bounds the whole
// exchange (zero or less means DefaultDialTimeout; it is capped at
// MaxDialTimeout). Each dial uses a source port no earlier dial of this
// topology used, so it is a new conntrack flow. Errors are *DialError.
func (tp *Topology) DialTCP(ns, addr string, timeout time.Duration) (Reply, error) {
	return tp.dial(ns, "tcp", addr, timeout)
}

// DialUDP sends one datagram from namespace ns to addr on a connected
// socket and returns the parsed reply, so an ICMP "port unreachable" comes
// back as an error for which IsRefused is true. Otherwise it is like
// DialTCP; it does not retransmit, since the namespaces lose no packets.
func (tp *Topology) DialUDP(ns, addr string, timeout time.Duration) (Reply, error) {
	return tp.dial(ns, "udp", addr, timeout)
}

// Spread makes n sequential TCP dials from ns to addr, each with timeout,
// and counts replies by backend. It stops at the first failed dial and
// returns the counts so far with the error. n must be between 1 and
// MaxSpread.
func (tp *Topology) Spread(ns, addr string, n int, timeout time.Duration) (map[string]int, error) {
	if n < 1 || n > MaxSpread {
		return nil, fmt.Errorf("spread: n must be between 1 and %d, got %d", MaxSpread, n)
	}
	counts := map[string]int{}
	for i := range n {
		r, err := tp.DialTCP(ns, addr, timeout)
		if err != nil {
			return counts, fmt.Errorf("spread: dial %d of %d: %w", i+1, n, err)
		}
		counts[r.Backend]++
	}
	return counts, nil
}

// sourcePort returns the next source port in the topology's sequence.
func (tp *Topology) sourcePort() int {
	return firstSourcePort + int((tp.nextPort.Add(1)-1)%sourcePorts)
}

func (tp *Topology) dial(ns, network, addr string, timeout time.Duration) (Reply, error) {
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	timeout = min(timeout, MaxDialTimeout)
	deadline := time.Now().Add(timeout)
	var reply Reply
	err := doIn(ns, func() error {
		c, err := tp.dialFresh(network, addr, deadline)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		if err := c.SetDeadline(deadline); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(c, "hello from %s\n", tp.label(ns)); err != nil {
			return err
		}
		line, err := bufio.NewReader(io.LimitReader(c, maxLine)).ReadString('\n')
		if err != nil {
			return err
		}
		reply, err = parseReply(line)
		return err
	})
	if err != nil {
		return Reply{}, &DialError{NS: ns, Network: network, Addr: addr, Err: err}
	}
	return reply, nil
}

// dialFresh connects from the next unused source port, skipping ports that
// something in the namespace already holds.
func (tp *Topology) dialFresh(network, addr string, deadline time.Time) (net.Conn, error) {
	var err error
	for range maxBindTries {
		port := tp.sourcePort()
		d := net.Dialer{Deadline: deadline}
		if network == "tcp" {
			d.LocalAddr = &net.TCPAddr{Port: port}
		} else {
			d.LocalAddr = &net.UDPAddr{Port: port}
		}
		var c net.Conn
		c, err = d.Dial(network, addr)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return nil, err
		}
	}
	return nil, err
}

func parseReply(line string) (Reply, error) {
	f := strings.Fields(line)
	if len(f) != 2 {
		return Reply{}, fmt.Errorf("unexpected reply %q", line)
	}
	ap, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return Reply{}, fmt.Errorf("unexpected reply %q: %w", line, err)
	}
	return Reply{Backend: f[0], SeenFrom: ap.Addr().Unmap()}, nil
}

// ConntrackFlush deletes every IPv4 and IPv6 entry in namespace ns's
// conntrack table, like "conntrack -F" for both families, over netlink (no
// conntrack binary needed). Entries for packets in flight during the flush
// may survive; flush between test phases, not during traffic.
func (tp *Topology) ConntrackFlush(ns string) error {
	fd, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("conntrack flush: opening namespace %s: %w", ns, err)
	}
	defer func() { _ = fd.Close() }()
	h, err := netlink.NewHandleAt(fd, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("conntrack flush: netlink handle in %s: %w", ns, err)
	}
	defer h.Close()
	// The flush request carries AF_INET, which recent kernels honour as a
	// family filter, so IPv6 entries are deleted one by one after it.
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		return fmt.Errorf("conntrack flush in %s: %w", ns, err)
	}
	if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET6, matchAll{}); err != nil {
		return fmt.Errorf("conntrack flush (IPv6) in %s: %w", ns, err)
	}
	return nil
}

// matchAll is a conntrack filter matching every flow.
type matchAll struct{}

func (matchAll) MatchConntrackFlow(*netlink.ConntrackFlow) bool { return true }
