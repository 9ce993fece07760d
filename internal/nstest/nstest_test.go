package nstest_test

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/proxyplane/proxyplane/internal/nstest"
)

const (
	backendPort = 8080
	closedPort  = 9 // nothing listens here
	servicePort = 80
	shortWait   = 300 * time.Millisecond
	dialWait    = 2 * time.Second
)

// mustExec runs a command in ns and fails the test on error.
func mustExec(t *testing.T, tp *nstest.Topology, ns string, args ...string) string {
	t.Helper()
	out, err := tp.Exec(ns, args[0], args[1:]...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("needs %s: apt-get install -y iptables conntrack nftables", name)
	}
}

func netnsList(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	var names []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// family picks the IPv4 or IPv6 address of each role.
type family struct {
	name     string
	iptables string
	node     func(*nstest.Topology) netip.Addr
	client   func(*nstest.Topology) netip.Addr
	bridge   func(*nstest.Topology) netip.Addr
	pod      func(*nstest.Topology, int) netip.Addr
	service  netip.Addr
}

var families = []family{
	{
		name: "ipv4", iptables: "iptables",
		node: (*nstest.Topology).NodeIP, client: (*nstest.Topology).ClientIP,
		bridge: (*nstest.Topology).BridgeIP, pod: (*nstest.Topology).PodIP,
		service: netip.MustParseAddr("10.96.0.10"),
	},
	{
		name: "ipv6", iptables: "ip6tables",
		node: (*nstest.Topology).NodeIPv6, client: (*nstest.Topology).ClientIPv6,
		bridge: (*nstest.Topology).BridgeIPv6, pod: (*nstest.Topology).PodIPv6,
		service: netip.MustParseAddr("fd00:96::10"),
	},
}

// dialer is DialTCP or DialUDP.
type dialer struct {
	name string
	dial func(tp *nstest.Topology, ns, addr string, timeout time.Duration) (nstest.Reply, error)
}

var dialers = []dialer{
	{"tcp", (*nstest.Topology).DialTCP},
	{"udp", (*nstest.Topology).DialUDP},
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts nstest.Options
		ok   bool
	}{
		{"zero value", nstest.Options{}, true},
		{"max pods", nstest.Options{Pods: nstest.MaxPods}, true},
		{"too many pods", nstest.Options{Pods: nstest.MaxPods + 1}, false},
		{"negative pods", nstest.Options{Pods: -1}, false},
		{"max nodes", nstest.Options{Nodes: nstest.MaxNodes}, true},
		{"too many nodes", nstest.Options{Nodes: nstest.MaxNodes + 1}, false},
		{"too many hosts", nstest.Options{Hosts: nstest.MaxHosts + 1}, false},
		{"unmasked CIDR", nstest.Options{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.1/16")}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.opts.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestTopologyUp(t *testing.T) {
	t.Parallel()
	tp := nstest.New(t, nstest.Options{Pods: 3})

	all := []string{tp.NodeNS(), tp.ClientNS(), tp.PodNS(0), tp.PodNS(1), tp.PodNS(2)}
	listed := netnsList(t)
	for _, ns := range all {
		if !slices.Contains(listed, ns) {
			t.Errorf("namespace %s not in ip netns list %v", ns, listed)
		}
	}
	if got := len(slices.Compact(slices.Sorted(slices.Values(all)))); got != len(all) {
		t.Errorf("namespace names not unique: %v", all)
	}
	if got, want := tp.PodIP(2), netip.MustParseAddr("10.244.1.12"); got != want {
		t.Errorf("PodIP(2) = %v, want %v", got, want)
	}
	if got, want := tp.PodIPv6(2), netip.MustParseAddr("fd00:244:1::12"); got != want {
		t.Errorf("PodIPv6(2) = %v, want %v", got, want)
	}

	nodeWant := map[string]string{
		"net.ipv4.ip_forward":                 "1",
		"net.ipv6.conf.all.forwarding":        "1",
		"net.ipv6.conf.eth0.forwarding":       "1",
		"net.ipv4.conf.all.send_redirects":    "0",
		"net.ipv4.conf.eth0.send_redirects":   "0",
		"net.ipv4.conf.br0.send_redirects":    "0",
		"net.ipv4.conf.veth2.send_redirects":  "0",
		"net.ipv4.icmp_ratelimit":             "0",
		"net.ipv6.icmp.ratelimit":             "0",
		"net.ipv4.conf.all.route_localnet":    "1",
		"net.ipv4.conf.all.rp_filter":         "0",
		"net.ipv4.conf.br0.rp_filter":         "0",
		"net.ipv6.conf.br0.accept_dad":        "0",
		"net.bridge.bridge-nf-call-iptables":  "1",
		"net.bridge.bridge-nf-call-ip6tables": "1",
	}
	for key, want := range nodeWant {
		got := strings.TrimSpace(mustExec(t, tp, tp.NodeNS(), "sysctl", "-n", key))
		if got != want {
			t.Errorf("node %s = %q, want %q", key, got, want)
		}
	}
	for _, ns := range []string{tp.ClientNS(), tp.PodNS(0)} {
		if got := strings.TrimSpace(mustExec(t, tp, ns, "sysctl", "-n", "net.ipv4.ip_forward")); got != "0" {
			t.Errorf("%s forwards (ip_forward=%s); only the node should", ns, got)
		}
	}
	for i := range tp.Pods() {
		path := "/sys/class/net/" + nstest.PodHostLink(i) + "/brport/hairpin_mode"
		if got := strings.TrimSpace(mustExec(t, tp, tp.NodeNS(), "cat", path)); got != "1" {
			t.Errorf("%s = %s, want 1", path, got)
		}
		addrs := mustExec(t, tp, tp.PodNS(i), "ip", "addr", "show", "dev", nstest.PodLink)
		for _, want := range []string{tp.PodIP(i).String() + "/24", tp.PodIPv6(i).String() + "/64"} {
			if !strings.Contains(addrs, want) {
				t.Errorf("pod %d lacks %s:\n%s", i, want, addrs)
			}
		}
		if strings.Contains(addrs, "tentative") {
			t.Errorf("pod %d has a tentative (DAD) address:\n%s", i, addrs)
		}
	}
	routes := mustExec(t, tp, tp.NodeNS(), "ip", "route", "get", "10.96.0.10")
	if !strings.Contains(routes, "dev "+nstest.NodeExternalLink) {
		t.Errorf("node has no route for the ClusterIP range: %s", routes)
	}
	routes = mustExec(t, tp, tp.NodeNS(), "ip", "-6", "route", "get", "fd00:96::10")
	if !strings.Contains(routes, "dev "+nstest.NodeExternalLink) {
		t.Errorf("node has no IPv6 route for the ClusterIP range: %s", routes)
	}
}

func TestReachability(t *testing.T) {
	t.Parallel()
	tp := nstest.New(t, nstest.Options{})
	for i := range tp.Pods() {
		tp.ServeTCP(i, backendPort)
		tp.ServeUDP(i, backendPort)
	}
	for _, ns := range []string{tp.ClientNS(), tp.NodeNS()} {
		tp.ServeTCPIn(ns, "", backendPort)
		tp.ServeUDPIn(ns, "", backendPort)
	}

	for _, fam := range families {
		cases := []struct {
			name    string
			from    string
			to      netip.Addr
			backend string
			seen    netip.Addr
		}{
			// Routed through the node: proves forwarding both ways.
			{"client to pod-0", tp.ClientNS(), fam.pod(tp, 0), "pod-0", fam.client(tp)},
			{"pod-1 to client", tp.PodNS(1), fam.client(tp), "client", fam.pod(tp, 1)},
			// Bridged inside the node.
			{"pod-0 to pod-1", tp.PodNS(0), fam.pod(tp, 1), "pod-1", fam.pod(tp, 0)},
			// The node's own traffic.
			{"node to pod-1", tp.NodeNS(), fam.pod(tp, 1), "pod-1", fam.bridge(tp)},
			{"client to node", tp.ClientNS(), fam.node(tp), "node-0", fam.client(tp)},
			{"pod-0 to node", tp.PodNS(0), fam.bridge(tp), "node-0", fam.pod(tp, 0)},
		}
		for _, tc := range cases {
			for _, d := range dialers {
				t.Run(fam.name+"/"+d.name+"/"+tc.name, func(t *testing.T) {
					r, err := d.dial(tp, tc.from, nstest.HostPort(tc.to, backendPort), dialWait)
					if err != nil {
						t.Fatal(err)
					}
					want := nstest.Reply{Backend: tc.backend, SeenFrom: tc.seen}
					if r != want {
						t.Errorf("reply = %+v, want %+v", r, want)
					}
				})
			}
		}
	}
}

// TestTwoNodes checks the routes between nodes: pods reach pods of the
// other node by their own addresses, nodes reach each other and the other
// node's pods, and the client reaches both nodes.
func TestTwoNodes(t *testing.T) {
	t.Parallel()
	tp := nstest.New(t, nstest.Options{Nodes: 2, Hosts: 1})
	n0, n1 := tp.Node(0), tp.Node(1)
	if got := n1.Pods(); !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("node-1 pods = %v, want [2 3]", got)
	}
	if tp.PodNode(3) != n1 || tp.PodIP(3) != netip.MustParseAddr("10.244.2.11") {
		t.Fatalf("pod 3 is on %s at %v, want node-1 at 10.244.2.11", tp.PodNode(3).Name(), tp.PodIP(3))
	}
	for i := range tp.Pods() {
		tp.ServeTCP(i, backendPort)
	}
	for k := range tp.Nodes() {
		tp.ServeTCPIn(tp.Node(k).NS(), "", backendPort)
	}
	tp.ServeTCPIn(tp.HostNS(0), "", backendPort)
	for _, tc := range []struct {
		name    string
		from    string
		to      netip.Addr
		backend string
		seen    netip.Addr
	}{
		{"pod-0 to pod-3", tp.PodNS(0), tp.PodIP(3), "pod-3", tp.PodIP(0)},
		{"pod-2 to pod-1 over IPv6", tp.PodNS(2), tp.PodIPv6(1), "pod-1", tp.PodIPv6(2)},
		{"node-0 to pod-2", n0.NS(), tp.PodIP(2), "pod-2", n0.IP()},
		{"node-1 to node-0", n1.NS(), n0.IP(), "node-0", n1.IP()},
		{"client to node-1", tp.ClientNS(), n1.IP(), "node-1", tp.ClientIP()},
		{"client to pod-2 via node-0", tp.ClientNS(), tp.PodIP(2), "pod-2", tp.ClientIP()},
		{"host-0 to node-1", tp.HostNS(0), n1.IP(), "node-1", tp.HostIP(0)},
		{"node-0 to host-0 over IPv6", n0.NS(), tp.HostIPv6(0), "host-0", n0.IPv6()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tp.DialTCP(tc.from, nstest.HostPort(tc.to, backendPort), dialWait)
			if err != nil {
				t.Fatal(err)
			}
			if want := (nstest.Reply{Backend: tc.backend, SeenFrom: tc.seen}); r != want {
				t.Errorf("reply = %+v, want %+v", r, want)
			}
		})
	}
	// External ranges: the client sends each node's range to that node.
	for k := range tp.Nodes() {
		n := tp.Node(k)
		for _, ip := range []netip.Addr{n.ExternalIP(0), n.ExternalIPv6(0)} {
			out := mustExec(t, tp, tp.ClientNS(), "ip", "route", "get", ip.String())
			if gw := map[bool]netip.Addr{true: n.IP(), false: n.IPv6()}[ip.Is4()]; !strings.Contains(out, "via "+gw.String()+" ") {
				t.Errorf("client routes %v as %q, want via %v", ip, out, gw)
			}
		}
	}
}

func TestRefusedWhenNothingListens(t *testing.T) {
	t.Parallel()
	tp := nstest.New(t, nstest.Options{})
	for _, fam := range families {
		for _, d := range dialers {
			t.Run(fam.name+"/"+d.name, func(t *testing.T) {
				_, err := d.dial(tp, tp.ClientNS(), nstest.HostPort(fam.pod(tp, 0), closedPort), dialWait)
				if !nstest.IsRefused(err) || nstest.IsTimeout(err) {
					t.Errorf("dial to closed port: got %v, want connection refused", err)
				}
			})
		}
	}
}

// TestRejectIsRefused checks that a REJECT in the node reaches the client
// as "connection refused" every time, not only until ICMP rate limits or
// redirects eat the replies. The dials run concurrently, as a burst; that
// also keeps the IPv6 TCP case short, where each refusal takes one SYN
// retransmission (see the package documentation).
func TestRejectIsRefused(t *testing.T) {
	t.Parallel()
	requireTool(t, "iptables")
	tp := nstest.New(t, nstest.Options{})
	tp.ServeTCP(1, backendPort)
	tp.ServeUDP(1, backendPort)
	// Above the per-peer burst (6) and the global burst (50): with only
	// icmp_ratelimit=0, about half of 100 concurrent REJECTs time out.
	const dials = 100
	for _, fam := range families {
		mustExec(t, tp, tp.NodeNS(), fam.iptables, "-I", "FORWARD", "-d", fam.pod(tp, 1).String(), "-j", "REJECT")
		for _, d := range dialers {
			t.Run(fam.name+"/"+d.name, func(t *testing.T) {
				var wg sync.WaitGroup
				for i := range dials {
					wg.Go(func() {
						_, err := d.dial(tp, tp.ClientNS(), nstest.HostPort(fam.pod(tp, 1), backendPort), dialWait)
						if !nstest.IsRefused(err) {
							t.Errorf("dial %d: got %v, want connection refused", i, err)
						}
					})
				}
				wg.Wait()
			})
		}
	}
}

func TestDropIsTimeout(t *testing.T) {
	t.Parallel()
	requireTool(t, "iptables")
	tp := nstest.New(t, nstest.Options{})
	tp.ServeTCP(1, backendPort)
	tp.ServeUDP(1, backendPort)
	for _, fam := range families {
		addr := nstest.HostPort(fam.pod(tp, 1), backendPort)
		rule := []string{"FORWARD", "-d", fam.pod(tp, 1).String(), "-j", "DROP"}
		for _, d := range dialers {
			t.Run(fam.name+"/"+d.name, func(t *testing.T) {
				if _, err := d.dial(tp, tp.ClientNS(), addr, dialWait); err != nil {
					t.Fatalf("before the DROP rule: %v", err)
				}
				mustExec(t, tp, tp.NodeNS(), append([]string{fam.iptables, "-I"}, rule...)...)
				start := time.Now()
				_, err := d.dial(tp, tp.ClientNS(), addr, shortWait)
				elapsed := time.Since(start)
				if !nstest.IsTimeout(err) || nstest.IsRefused(err) {
					t.Errorf("dial through DROP: got %v, want a timeout", err)
				}
				if elapsed > shortWait+time.Second {
					t.Errorf("dial through DROP took %v, want about %v", elapsed, shortWait)
				}
				mustExec(t, tp, tp.NodeNS(), append([]string{fam.iptables, "-D"}, rule...)...)
				if _, err := d.dial(tp, tp.ClientNS(), addr, dialWait); err != nil {
					t.Errorf("after deleting the DROP rule: %v", err)
				}
			})
		}
	}
}

// TestServiceDNAT programs a ClusterIP by hand, as the dataplane would, and
// checks every path a service has: from outside, from the node itself (the
// ClusterIP route), from another pod (bridge netfilter) and from the
// endpoint itself (hairpin plus masquerade).
func TestServiceDNAT(t *testing.T) {
	t.Parallel()
	requireTool(t, "iptables")
	tp := nstest.New(t, nstest.Options{})
	for i := range tp.Pods() {
		tp.ServeTCP(i, backendPort)
		tp.ServeUDP(i, backendPort)
	}
	for _, fam := range families {
		ep := nstest.HostPort(fam.pod(tp, 0), backendPort)
		for _, proto := range []string{"tcp", "udp"} {
			for _, chain := range []string{"PREROUTING", "OUTPUT"} {
				mustExec(t, tp, tp.NodeNS(), fam.iptables, "-t", "nat", "-A", chain,
					"-d", fam.service.String(), "-p", proto, "--dport", "80", "-j", "DNAT", "--to-destination", ep)
			}
		}
		mustExec(t, tp, tp.NodeNS(), fam.iptables, "-t", "nat", "-A", "POSTROUTING",
			"-s", fam.pod(tp, 0).String(), "-d", fam.pod(tp, 0).String(), "-j", "MASQUERADE")

		cases := []struct {
			name string
			from string
			seen netip.Addr
		}{
			{"from client", tp.ClientNS(), fam.client(tp)},
			{"from node", tp.NodeNS(), fam.node(tp)},
			{"from other pod", tp.PodNS(1), fam.pod(tp, 1)},
			{"hairpin", tp.PodNS(0), fam.bridge(tp)},
		}
		for _, tc := range cases {
			for _, d := range dialers {
				t.Run(fam.name+"/"+d.name+"/"+tc.name, func(t *testing.T) {
					r, err := d.dial(tp, tc.from, nstest.HostPort(fam.service, servicePort), dialWait)
					if err != nil {
						t.Fatal(err)
					}
					want := nstest.Reply{Backend: "pod-0", SeenFrom: tc.seen}
					if r != want {
						t.Errorf("reply = %+v, want %+v", r, want)
					}
				})
			}
		}
	}
}

func TestSpread(t *testing.T) {
	t.Parallel()
	requireTool(t, "iptables")
	tp := nstest.New(t, nstest.Options{})
	for i := range tp.Pods() {
		tp.ServeTCP(i, backendPort)
	}
	svc := "10.96.0.20"
	mustExec(t, tp, tp.NodeNS(), "iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "tcp",
		"-m", "statistic", "--mode", "random", "--probability", "0.5",
		"-j", "DNAT", "--to-destination", nstest.HostPort(tp.PodIP(0), backendPort))
	mustExec(t, tp, tp.NodeNS(), "iptables", "-t", "nat", "-A", "PREROUTING", "-d", svc, "-p", "tcp",
		"-j", "DNAT", "--to-destination", nstest.HostPort(tp.PodIP(1), backendPort))

	const n = 60 // a backend unseen in 60 fair coin flips: about 1e-18
	counts, err := tp.Spread(tp.ClientNS(), svc+":80", n, dialWait)
	if err != nil {
		t.Fatal(err)
	}
	if counts["pod-0"] == 0 || counts["pod-1"] == 0 || counts["pod-0"]+counts["pod-1"] != n {
		t.Errorf("spread = %v, want both pods and %d in all", counts, n)
	}
	if _, err := tp.Spread(tp.ClientNS(), svc+":80", nstest.MaxSpread+1, dialWait); err == nil {
		t.Error("Spread accepted n above MaxSpread")
	}
}

// udpFlows counts the UDP conntrack entries of one family in ns.
func udpFlows(t *testing.T, tp *nstest.Topology, ns string, fam netlink.InetFamily) int {
	t.Helper()
	var n int
	err := tp.Do(ns, func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
		for _, f := range flows {
			if f.Forward.Protocol == unix.IPPROTO_UDP {
				n++
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConntrackFlush uses UDP only: TCP teardown packets arriving after the
// flush would create entries again.
func TestConntrackFlush(t *testing.T) {
	t.Parallel()
	requireTool(t, "iptables")
	tp := nstest.New(t, nstest.Options{})
	tp.ServeUDP(0, backendPort)
	for _, fam := range families {
		// Any nat rule makes the namespace track connections.
		mustExec(t, tp, tp.NodeNS(), fam.iptables, "-t", "nat", "-A", "PREROUTING",
			"-d", fam.service.String(), "-p", "udp", "--dport", "80",
			"-j", "DNAT", "--to-destination", nstest.HostPort(fam.pod(tp, 0), backendPort))
		for range 3 {
			if _, err := tp.DialUDP(tp.ClientNS(), nstest.HostPort(fam.service, servicePort), dialWait); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if got := udpFlows(t, tp, tp.NodeNS(), f); got != 3 {
			t.Errorf("family %d: %d UDP flows before the flush, want 3 (one per fresh source port)", f, got)
		}
	}
	if err := tp.ConntrackFlush(tp.NodeNS()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if got := udpFlows(t, tp, tp.NodeNS(), f); got != 0 {
			t.Errorf("family %d: %d UDP flows after the flush, want 0", f, got)
		}
	}
}

func TestDoRestoresNamespace(t *testing.T) {
	t.Parallel()
	tp := nstest.New(t, nstest.Options{Pods: 1})
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = before.Close() }()
	want, err := netns.GetFromName(tp.PodNS(0))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = want.Close() }()

	err = tp.Do(tp.PodNS(0), func() error {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer func() { _ = cur.Close() }()
		if !cur.Equal(want) {
			t.Errorf("inside Do: namespace %v, want %v", cur, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = after.Close() }()
	if !after.Equal(before) {
		t.Errorf("caller's namespace changed by Do: %v, was %v", after, before)
	}
	if err := tp.Do(tp.PodNS(0), func() error { return os.ErrInvalid }); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Do returned %v, want f's error", err)
	}
	if err := tp.Do("no-such-namespace-nstest", func() error { return nil }); err == nil {
		t.Error("Do into a missing namespace succeeded")
	}
}

func TestCleanupRemovesNamespaces(t *testing.T) {
	t.Parallel()
	nstest.RequireRoot(t)
	var names []string
	t.Run("topology", func(t *testing.T) {
		tp := nstest.New(t, nstest.Options{Pods: 1})
		tp.ServeTCP(0, backendPort)
		tp.ServeUDP(0, backendPort)
		names = []string{tp.NodeNS(), tp.ClientNS(), tp.PodNS(0)}
		if _, err := tp.DialTCP(tp.ClientNS(), nstest.HostPort(tp.PodIP(0), backendPort), dialWait); err != nil {
			t.Fatal(err)
		}
	})
	listed := netnsList(t)
	for _, ns := range names {
		if slices.Contains(listed, ns) {
			t.Errorf("namespace %s still listed after cleanup", ns)
		}
		if _, err := os.Stat("/run/netns/" + ns); !os.IsNotExist(err) {
			t.Errorf("/run/netns/%s still there after cleanup (stat: %v)", ns, err)
		}
	}
}

// TestTwoTopologies checks that topologies built side by side get distinct
// namespaces and do not see each other's rules.
func TestTwoTopologies(t *testing.T) {
	t.Parallel()
	a := nstest.New(t, nstest.Options{Pods: 1})
	b := nstest.New(t, nstest.Options{Pods: 1})
	if a.NodeNS() == b.NodeNS() || a.PodNS(0) == b.PodNS(0) || a.ClientNS() == b.ClientNS() {
		t.Fatalf("topologies share namespaces: %s %s", a.NodeNS(), b.NodeNS())
	}
	for _, tp := range []*nstest.Topology{a, b} {
		tp.ServeTCP(0, backendPort)
		if _, err := tp.DialTCP(tp.ClientNS(), nstest.HostPort(tp.PodIP(0), backendPort), dialWait); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return
	}
	mustExec(t, a, a.NodeNS(), "iptables", "-I", "FORWARD", "-j", "DROP")
	if _, err := a.DialTCP(a.ClientNS(), nstest.HostPort(a.PodIP(0), backendPort), shortWait); !nstest.IsTimeout(err) {
		t.Errorf("a, through its DROP rule: got %v, want a timeout", err)
	}
	if _, err := b.DialTCP(b.ClientNS(), nstest.HostPort(b.PodIP(0), backendPort), dialWait); err != nil {
		t.Errorf("b, unaffected by a's rule: %v", err)
	}
}
