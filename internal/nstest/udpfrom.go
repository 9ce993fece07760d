package nstest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"time"
)

// DialUDPFrom is DialUDP from a fixed source port: it sends one datagram
// from port srcPort of namespace ns to addr on a connected socket and
// returns the parsed reply. Successive calls with the same ns, srcPort and
// addr are one conntrack flow (until it expires or is deleted), so a test
// can show that a flow stays with the endpoint its first datagram was
// DNATed to after the rules change, and that deleting the flow moves it.
//
// srcPort must be outside the range DialTCP and DialUDP count through
// (40000-59999), so that no concurrent dial of the topology holds it; the
// socket is closed before DialUDPFrom returns, so the port is free again
// for the next call. Otherwise it behaves as DialUDP: timeout bounds the
// exchange (zero or less means DefaultDialTimeout, capped at
// MaxDialTimeout), and errors are *DialError, classified by IsRefused,
// IsTimeout and IsUnreachable.
func (tp *Topology) DialUDPFrom(ns string, srcPort int, addr string, timeout time.Duration) (Reply, error) {
	if srcPort < 1 || srcPort > 65535 || (srcPort >= firstSourcePort && srcPort < firstSourcePort+sourcePorts) {
		return Reply{}, &DialError{NS: ns, Network: "udp", Addr: addr, Err: fmt.Errorf(
			"source port %d: want 1-65535 outside %d-%d, the ports other dials use",
			srcPort, firstSourcePort, firstSourcePort+sourcePorts-1)}
	}
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	deadline := time.Now().Add(min(timeout, MaxDialTimeout))
	var reply Reply
	err := doIn(ns, func() error {
		d := net.Dialer{Deadline: deadline, LocalAddr: &net.UDPAddr{Port: srcPort}}
		c, err := d.Dial("udp", addr)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		if err := c.SetDeadline(deadline); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(c, "hello from %s port %d\n", tp.label(ns), srcPort); err != nil {
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
		return Reply{}, &DialError{NS: ns, Network: "udp", Addr: addr, Err: err}
	}
	return reply, nil
}
