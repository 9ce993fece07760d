package conntrack

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// The real-kernel test programs the iptables dataplane in a node namespace
// built by nstest, pins UDP flows from the client to endpoints, moves the
// endpoints, and shows that the flows stay pinned until Clean deletes
// them. It needs root and skips without it (CI runs as root).

const (
	// dialTimeout bounds a datagram exchange that should be answered.
	dialTimeout = 2 * time.Second
	// silentTimeout is how long a dial waits to conclude that nothing
	// answers (the flow goes nowhere).
	silentTimeout = time.Second
	// backendPort is where the pods' UDP servers listen.
	backendPort = 5353
)

// kernelDataplane returns an iptables dataplane of family programming tp's
// node namespace, as nodeagent/dataplane/iptables/kernel_test.go does.
func kernelDataplane(t *testing.T, tp *nstest.Topology, family dataplane.Family) *iptables.Dataplane {
	t.Helper()
	c := iptables.DefaultConfig(family)
	c.LocalMode = dataplane.LocalClusterCIDR
	c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
	c.NodeIPs = []string{tp.NodeIP().String(), tp.NodeIPv6().String()}
	c.CommandPrefix = []string{"ip", "netns", "exec", tp.NodeNS()}
	d, err := iptables.New(c, nil)
	if err != nil {
		t.Fatalf("iptables %v dataplane: %v", family, err)
	}
	return d
}

// nodeHandle opens a conntrack netlink handle inside tp's node namespace,
// closed by the test's cleanup.
func nodeHandle(t *testing.T, tp *nstest.Topology) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromName(tp.NodeNS())
	if err != nil {
		t.Fatalf("opening namespace %s: %v", tp.NodeNS(), err)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", tp.NodeNS(), err)
	}
	t.Cleanup(h.Close)
	return h
}

// udpFlows lists h's UDP flows of both families, for failure messages.
func udpFlows(h *netlink.Handle) string {
	var b strings.Builder
	for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := h.ConntrackTableList(netlink.ConntrackTable, family)
		if err != nil {
			fmt.Fprintf(&b, "listing family %d: %v\n", family, err)
		}
		for _, f := range flows {
			if f.Forward.Protocol == unix.IPPROTO_UDP {
				b.WriteString(flowString(f) + "\n")
			}
		}
	}
	return b.String()
}

// What a datagram of a kernelCase meets, besides a backend's name.
const (
	// silent: nothing answers (the datagram is forwarded untranslated).
	silent = ""
	// refused: an ICMP port unreachable (the rules of a Service without
	// endpoints reject it).
	refused = "refused"
)

// kernelCase is one UDP flow from the client: its first datagrams go to
// pod-0 (or nowhere, when before is nil), then the Service changes to
// after and, once Clean has run, the next datagram meets cleaned.
type kernelCase struct {
	name    string
	family  dataplane.Family
	srcPort int // fixed, so every datagram is the same flow
	addr    string
	before  *pb.Service
	after   *pb.Service
	cleaned string
}

func TestKernelClean(t *testing.T) {
	nstest.RequireRoot(t)
	tp := nstest.New(t, nstest.Options{})
	for i := range 2 {
		tp.ServeUDP(i, backendPort)
	}
	dp4, dp6 := kernelDataplane(t, tp, dataplane.IPv4), kernelDataplane(t, tp, dataplane.IPv6)
	h := nodeHandle(t, tp)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	cleaners := map[dataplane.Family]*Cleaner{dataplane.IPv4: NewWithHandle(dataplane.IPv4, h, log), dataplane.IPv6: NewWithHandle(dataplane.IPv6, h, log)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pod := func(i int) string { return nstest.HostPort(tp.PodIP(i), backendPort) }
	pod6 := func(i int) string { return nstest.HostPort(tp.PodIPv6(i), backendPort) }
	// dns is a UDP Service on port 53 with endpoint, or without
	// endpoints anywhere when endpoint is "".
	dns := func(name, clusterIP string, nodePort int32, endpoint string) *pb.Service {
		s := svc(name, clusterIP)
		if nodePort != 0 {
			s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
		}
		s.Ports = []*pb.ServicePort{port("dns", udp, 53, nodePort)}
		if endpoint == "" {
			s.Ports[0].HasEndpoints = false
		} else {
			s.ClusterEndpoints = []*pb.PortEndpoints{eps("dns", endpoint)}
		}
		return s
	}
	cases := []kernelCase{
		{
			"ClusterIP", dataplane.IPv4, 39001, "10.96.0.53:53",
			dns("dns", "10.96.0.53", 0, pod(0)), dns("dns", "10.96.0.53", 0, pod(1)), "pod-1",
		},
		{
			"NodePort", dataplane.IPv4, 39002, nstest.HostPort(tp.NodeIP(), 30053),
			dns("np", "10.96.0.54", 30053, pod(0)), dns("np", "10.96.0.54", 30053, pod(1)), "pod-1",
		},
		{
			"IPv6 ClusterIP", dataplane.IPv6, 39003, "[fd00:96::53]:53",
			dns("dns6", "fd00:96::53", 0, pod6(0)), dns("dns6", "fd00:96::53", 0, pod6(1)), "pod-1",
		},
		// Sent before the Service had rules: forwarded untranslated (and
		// lost), and recorded so, with the cluster IP as reply source.
		{
			"never DNATed", dataplane.IPv4, 39004, "10.96.0.55:53",
			nil, dns("late", "10.96.0.55", 0, pod(1)), "pod-1",
		},
		// Scaled to zero: pod-0 still runs (as a pod does while its
		// endpoint is removed), so only the pinned flow reaches it.
		{
			"no endpoints left", dataplane.IPv4, 39005, "10.96.0.56:53",
			dns("zero", "10.96.0.56", 0, pod(0)), dns("zero", "10.96.0.56", 0, ""), refused,
		},
	}
	if _, err := tp.DialUDPFrom(tp.ClientNS(), 40000, cases[0].addr, dialTimeout); err == nil {
		t.Fatal("DialUDPFrom accepted a source port that DialUDP may be using")
	}
	perFamily := map[dataplane.Family]int{}
	for _, c := range cases {
		perFamily[c.family]++
	}

	// sync programs one table into both families' rules.
	sync := func(services []*pb.Service) *proxytable.Table {
		t.Helper()
		tbl := newTable(t, services...)
		for _, dp := range []*iptables.Dataplane{dp4, dp6} {
			if err := dp.Sync(ctx, tbl, nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
		}
		return tbl
	}
	// dial sends the case's datagram and checks what it meets: a
	// backend, silent or refused.
	dial := func(step string, c kernelCase, want string) {
		t.Helper()
		timeout := dialTimeout
		if want == silent {
			timeout = silentTimeout
		}
		r, err := tp.DialUDPFrom(tp.ClientNS(), c.srcPort, c.addr, timeout)
		var ok bool
		switch want {
		case silent:
			// The node may have given up resolving the untranslated
			// destination's neighbour and answered "host unreachable".
			ok = nstest.IsTimeout(err) || nstest.IsUnreachable(err)
		case refused:
			ok = nstest.IsRefused(err)
		default:
			ok = err == nil && r.Backend == want
		}
		if !ok {
			t.Fatalf("%s: %s: reply %+v, %v; want %q\nUDP flows:\n%s", step, c.name, r, err, want, udpFlows(h))
		}
	}
	// clean runs both Cleaners and checks how many flows each deleted.
	clean := func(step string, tbl *proxytable.Table, want map[dataplane.Family]int) {
		t.Helper()
		for _, family := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			n, err := cleaners[family].Clean(ctx, tbl)
			if err != nil || n != want[family] {
				t.Fatalf("%s: %v Clean = %d, %v; want %d deleted\nUDP flows:\n%s", step, family, n, err, want[family], udpFlows(h))
			}
		}
	}

	var before, after []*pb.Service
	for _, c := range cases {
		if c.before != nil {
			before = append(before, c.before)
		}
		after = append(after, c.after)
	}

	// Each flow goes to pod-0 (the early one nowhere), and stays there: a
	// flow pinned to a live endpoint is not stale.
	tbl := sync(before)
	for _, c := range cases {
		want := silent
		if c.before != nil {
			want = "pod-0"
		}
		dial("before the change", c, want)
		dial("before the change, again", c, want)
	}
	clean("before the change", tbl, nil)

	// The Services move to pod-1, or lose their endpoints. Without Clean
	// every flow keeps its old translation (or its lack of one).
	tbl = sync(after)
	for _, c := range cases {
		want := silent
		if c.before != nil {
			want = "pod-0"
		}
		dial("after the change, without Clean", c, want)
	}

	// Clean deletes exactly those flows, and the next datagram of each,
	// from the same source port, is a new flow that the new rules send to
	// pod-1 (or reject).
	clean("after the change", tbl, perFamily)
	for _, c := range cases {
		dial("after Clean", c, c.cleaned)
	}

	// The new flows are live (a rejected datagram leaves none): another
	// Clean, through New in the node namespace as the agent runs it on a
	// node, deletes nothing.
	err := tp.Do(tp.NodeNS(), func() error {
		for _, family := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			n, err := New(family, log).Clean(ctx, tbl)
			if err != nil {
				return fmt.Errorf("%v Clean: %w", family, err)
			}
			if n != 0 {
				return fmt.Errorf("%v Clean deleted %d live flows", family, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Clean of live flows: %v\nUDP flows:\n%s", err, udpFlows(h))
	}
}
