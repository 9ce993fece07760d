package nftables

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// These real-kernel tests show two packet-level choices made to match
// upstream's nftables mode: how traffic without endpoints is refused, and
// that forwarded packets conntrack cannot follow are not dropped.

// destUnreachables returns how many ICMP (IPv4) or ICMPv6 destination
// unreachable messages namespace ns has received: Icmp InDestUnreachs in
// /proc/net/snmp, Icmp6InDestUnreachs in /proc/net/snmp6, which are the
// reading process's namespace's.
func destUnreachables(t *testing.T, tp *nstest.Topology, ns string, f dataplane.Family) int {
	t.Helper()
	if f == dataplane.IPv6 {
		out, err := tp.Exec(ns, "cat", "/proc/net/snmp6")
		if err != nil {
			t.Fatalf("reading snmp6 in %s: %v", ns, err)
		}
		for line := range strings.Lines(string(out)) {
			if fields := strings.Fields(line); len(fields) == 2 && fields[0] == "Icmp6InDestUnreachs" {
				return atoi(t, fields[1])
			}
		}
		t.Fatalf("no Icmp6InDestUnreachs in %s's /proc/net/snmp6:\n%s", ns, out)
	}
	out, err := tp.Exec(ns, "cat", "/proc/net/snmp")
	if err != nil {
		t.Fatalf("reading snmp in %s: %v", ns, err)
	}
	// "Icmp:" comes as a line of names followed by a line of values.
	var names []string
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "Icmp:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		for i, name := range names {
			if name == "InDestUnreachs" && i < len(fields) {
				return atoi(t, fields[i])
			}
		}
	}
	t.Fatalf("no Icmp InDestUnreachs in %s's /proc/net/snmp:\n%s", ns, out)
	return 0
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("counter %q: %v", s, err)
	}
	return n
}

// TestKernelRefusesWithICMP: TCP to a Service without endpoints, and to a
// port a ClusterIP lacks, is refused with an ICMP (ICMPv6) port
// unreachable, as upstream's reject-chain, not a TCP reset. Each refused
// connection must raise the dialing namespace's count of destination
// unreachables received, which a reset does not.
func TestKernelRefusesWithICMP(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	tp.ServeTCP(0, 8080)
	// The ClusterIPs of a Service without endpoints and of one with pod-0.
	emptyIPs := map[dataplane.Family]netip.Addr{dataplane.IPv4: netip.MustParseAddr("10.96.0.30"), dataplane.IPv6: netip.MustParseAddr("fd00:96::30")}
	webIPs := map[dataplane.Family]netip.Addr{dataplane.IPv4: netip.MustParseAddr("10.96.0.31"), dataplane.IPv6: netip.MustParseAddr("fd00:96::31")}
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		d, err := New(kernelConfig(tp, f), nil)
		if err != nil {
			t.Fatal(err)
		}
		empty := dptest.Svc("ns", "empty", emptyIPs[f].String())
		empty.Ports = []*pb.ServicePort{dptest.Port("http", dptest.TCP, 80, 0, false)}
		web := dptest.Svc("ns", "web", webIPs[f].String())
		web.Ports = []*pb.ServicePort{dptest.Port("http", dptest.TCP, 80, 0, true)}
		podIP := tp.PodIP(0)
		if f == dataplane.IPv6 {
			podIP = tp.PodIPv6(0)
		}
		web.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", nstest.HostPort(podIP, 8080))}
		dptest.NewDriver(t, d).Sync(true, empty, web)

		t.Run(f.String(), func(t *testing.T) {
			for _, ns := range []string{tp.ClientNS(), tp.NodeNS(), tp.PodNS(0)} {
				// The Service answers first, so a refusal below is the
				// rules', not a missing route.
				if _, err := tp.DialTCP(ns, nstest.HostPort(webIPs[f], 80), dptest.DialTimeout); err != nil {
					t.Fatalf("TCP from %s to the Service with an endpoint: %v", ns, err)
				}
				for _, addr := range []string{
					nstest.HostPort(emptyIPs[f], 80), // no endpoints
					nstest.HostPort(webIPs[f], 81),   // a port the Service lacks
				} {
					before := destUnreachables(t, tp, ns, f)
					// An ICMPv6 error for a SYN is reported with the
					// retransmitted SYN, about 1 s late (see nstest).
					_, err := tp.DialTCP(ns, addr, 3*time.Second)
					if !nstest.IsRefused(err) {
						t.Errorf("TCP from %s to %s: %v, want refused", ns, addr, err)
						continue
					}
					if after := destUnreachables(t, tp, ns, f); after <= before {
						t.Errorf("TCP from %s to %s refused without an ICMP destination unreachable (%d before, %d after): a TCP reset, where upstream sends ICMP port unreachable", ns, addr, before, after)
					}
				}
			}
		})
	}
}

// TestKernelForwardsInvalid: a forwarded packet conntrack marks INVALID
// is forwarded, not dropped, as in upstream's nftables mode, which has no
// "ct state invalid drop" (kubernetes #122663; iptables mode keeps one
// unless nf_conntrack_tcp_be_liberal is set). The node here is strict
// (nf_conntrack_tcp_loose=0), so once its conntrack entry for a
// client-to-pod connection is deleted, every later segment of that
// connection is INVALID on the node; the connection must keep working.
func TestKernelForwardsInvalid(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	node := tp.NodeNS()
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		d, err := New(kernelConfig(tp, f), nil)
		if err != nil {
			t.Fatal(err)
		}
		dptest.NewDriver(t, d).Sync(true)
	}
	if out, err := tp.Exec(node, "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_loose=0"); err != nil {
		t.Fatalf("sysctl nf_conntrack_tcp_loose=0: %v: %s", err, out)
	}

	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			podIP := tp.PodIP(0)
			if f == dataplane.IPv6 {
				podIP = tp.PodIPv6(0)
			}
			addr := nstest.HostPort(podIP, 9000)
			ln := echoServer(t, tp, tp.PodNS(0), addr)
			var c net.Conn
			if err := tp.Do(tp.ClientNS(), func() error {
				var err error
				c, err = net.DialTimeout("tcp", addr, dptest.DialTimeout)
				return err
			}); err != nil {
				t.Fatalf("dialing the pod from the client: %v", err)
			}
			defer func() { _ = c.Close() }()
			r := bufio.NewReader(c)
			echo(t, c, r, "tracked")
			if err := tp.ConntrackFlush(node); err != nil {
				t.Fatal(err)
			}
			// Every segment from here on is INVALID on the node.
			echo(t, c, r, "invalid")
			_ = ln.Close()
		})
	}
}

// echoServer listens on addr in ns and echoes each line of each
// connection until the test ends.
func echoServer(t *testing.T, tp *nstest.Topology, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := tp.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(time.Minute))
				s := bufio.NewScanner(c)
				for s.Scan() {
					if _, err := fmt.Fprintln(c, s.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln
}

// echo sends line on c and waits, within dptest.DialTimeout, for it to
// come back.
func echo(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	t.Helper()
	if err := c.SetDeadline(time.Now().Add(dptest.DialTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(c, line); err != nil {
		t.Fatalf("sending %q: %v", line, err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("echo of %q: %v (dropped on the node?)", line, err)
	}
	if got != line+"\n" {
		t.Fatalf("echo of %q: got %q", line, got)
	}
}
