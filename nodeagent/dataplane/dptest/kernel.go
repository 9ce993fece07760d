package dptest

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// The real-kernel tests program a node namespace built by nstest and prove
// the rules with real TCP and UDP from the client, node and pod
// namespaces.

const (
	// DialTimeout bounds a dial expected to succeed or be refused (IPv6
	// ICMP refusals arrive about a second late, see nstest).
	DialTimeout = 2 * time.Second
	// DropTimeout is how long a dial waits to conclude "dropped".
	DropTimeout = time.Second
)

// KernelNode is the NodeInfo matching nstest's topology.
func KernelNode() *pb.NodeInfo {
	return &pb.NodeInfo{Name: "node", PodCidrs: []string{"10.244.1.0/24", "fd00:244:1::/64"}, Hash: 1}
}

// PodEP is pod i's endpoint on port.
func PodEP(tp *nstest.Topology, i, port int) string {
	return nstest.HostPort(tp.PodIP(i), port)
}

// KernelServices are the real-kernel tests' Services by short name, their
// endpoints on tp's pods 0 and 1 (pod 0 on the node, TCP on 8080 and UDP
// on 5353): web (ClusterIP, TCP and UDP), np (NodePort), empty (no
// endpoints), sticky (affinity), local and elsewhere (eTP Local with and
// without a local endpoint), allowed and denied (source ranges that admit
// tp's client and ones that do not) and dual (dual-stack).
func KernelServices(tp *nstest.Topology) map[string]*pb.Service {
	both := func(port int) []string { return []string{PodEP(tp, 0, port), PodEP(tp, 1, port)} }
	web := Svc("ns", "web", "10.96.0.10")
	web.Ports = []*pb.ServicePort{Port("http", TCP, 80, 0, true), Port("dns", UDP, 53, 0, true)}
	web.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", both(8080)...), Eps("dns", both(5353)...)}

	np := Svc("ns", "np", "10.96.0.20")
	np.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	np.Ports = []*pb.ServicePort{Port("", TCP, 80, 30080, true)}
	np.ClusterEndpoints = []*pb.PortEndpoints{Eps("", both(8080)...)}

	empty := Svc("ns", "empty", "10.96.0.30")
	empty.Ports = []*pb.ServicePort{Port("http", TCP, 80, 0, false), Port("dns", UDP, 53, 0, false)}

	sticky := Svc("ns", "sticky", "10.96.0.60")
	sticky.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 300}
	sticky.Ports = []*pb.ServicePort{Port("http", TCP, 80, 0, true)}
	sticky.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", both(8080)...)}

	// eTP Local with this node's pod-0 as the local endpoint: the client's
	// address must reach the pod unmasqueraded.
	local := Svc("ns", "local", "10.96.0.40")
	local.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	local.LoadBalancerIps = []string{"198.51.100.40"}
	local.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	local.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30040, true)}
	local.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", both(8080)...)}
	local.LocalEndpoints = []*pb.PortEndpoints{Eps("http", PodEP(tp, 0, 8080))}

	// eTP Local whose endpoints are all elsewhere: external traffic drops.
	elsewhere := Svc("ns", "elsewhere", "10.96.0.41")
	elsewhere.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	elsewhere.LoadBalancerIps = []string{"198.51.100.41"}
	elsewhere.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	elsewhere.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30041, true)}
	elsewhere.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", both(8080)...)}

	// Source ranges that admit the client, and ones that do not.
	allowed := Svc("ns", "allowed", "10.96.0.70")
	allowed.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	allowed.LoadBalancerIps = []string{"198.51.100.70"}
	allowed.LoadBalancerSourceRanges = []string{tp.ClientIP().String() + "/32"}
	allowed.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30070, true)}
	allowed.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", both(8080)...)}
	denied := Svc("ns", "denied", "10.96.0.71")
	denied.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	denied.LoadBalancerIps = []string{"198.51.100.71"}
	denied.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
	denied.Ports = []*pb.ServicePort{Port("http", TCP, 80, 30071, true)}
	denied.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", both(8080)...)}

	dual := Svc("ns", "dual", "10.96.0.100", "fd00:96::100")
	dual.Ports = []*pb.ServicePort{Port("http", TCP, 80, 0, true)}
	dual.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", append(both(8080),
		nstest.HostPort(tp.PodIPv6(0), 8080), nstest.HostPort(tp.PodIPv6(1), 8080))...)}

	return map[string]*pb.Service{
		"web": web, "np": np, "empty": empty, "sticky": sticky, "local": local,
		"elsewhere": elsewhere, "allowed": allowed, "denied": denied, "dual": dual,
	}
}

// KernelTopology returns a topology whose two pods serve TCP on 8080 and
// UDP on 5353. Its node routes the load balancer IPs (198.51.100.0/24)
// out, as a real node's default route would: without a route the node
// would answer "network unreachable" for a load balancer IP it does not
// DNAT, before the filter rules could drop it.
func KernelTopology(tb testing.TB) *nstest.Topology {
	tb.Helper()
	tp := nstest.New(tb, nstest.Options{})
	for i := range 2 {
		tp.ServeTCP(i, 8080)
		tp.ServeUDP(i, 5353)
	}
	if out, err := tp.Exec(tp.NodeNS(), "ip", "route", "add", "198.51.100.0/24", "dev", nstest.NodeExternalLink); err != nil {
		tb.Fatalf("%s: %v", out, err)
	}
	return tp
}

// Driver syncs tables of KernelNode into a Dataplane, one after another,
// computing the changed keys as proxytable.Apply reports them.
type Driver struct {
	tb   testing.TB
	dp   dataplane.Dataplane
	prev *proxytable.Table
}

// NewDriver returns a Driver for dp, which holds nothing yet.
func NewDriver(tb testing.TB, dp dataplane.Dataplane) *Driver {
	tb.Helper()
	return &Driver{tb: tb, dp: dp, prev: proxytable.Empty()}
}

// Sync programs services, fully or as a delta from the last table
// programmed, and fails the test on error.
func (k *Driver) Sync(full bool, services ...*pb.Service) {
	k.tb.Helper()
	if err := k.TrySync(full, services...); err != nil {
		k.tb.Fatalf("Sync(full=%v): %v", full, err)
	}
}

// TrySync is Sync returning the error.
func (k *Driver) TrySync(full bool, services ...*pb.Service) error {
	k.tb.Helper()
	next := Table(k.tb, KernelNode(), services...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.dp.Sync(ctx, next, ChangedKeys(k.prev, next), full); err != nil {
		return err
	}
	k.prev = next
	return nil
}

// SpreadOver dials addr n times from namespace ns, checks that exactly
// the backends want answered, and returns how often each did.
func SpreadOver(tb testing.TB, tp *nstest.Topology, ns, addr string, n int, want ...string) map[string]int {
	tb.Helper()
	got, err := tp.Spread(ns, addr, n, DialTimeout)
	if err != nil {
		tb.Fatalf("Spread from %s to %s: %v (so far %v)", ns, addr, err, got)
	}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		tb.Fatalf("from %s to %s: backends %v, want %v", ns, addr, got, want)
	}
	return got
}

// CheckKernelServices proves, with real connections, what every dataplane
// does with services (KernelServices) as k has just programmed them into
// tp's node (IPv4): ClusterIP, NodePort, REJECT without endpoints,
// affinity (also across a full sync), eTP Local with and without a local
// endpoint, and source ranges.
func CheckKernelServices(t *testing.T, tp *nstest.Topology, k *Driver, services map[string]*pb.Service) {
	t.Helper()
	node, cl, pod0 := tp.NodeNS(), tp.ClientNS(), tp.PodNS(0)
	bridge := tp.BridgeIP()
	both := []string{"pod-0", "pod-1"}
	t.Run("ClusterIP spread from client (forwarded)", func(t *testing.T) {
		SpreadOver(t, tp, cl, "10.96.0.10:80", 40, both...)
		// Off-cluster source: masqueraded to the node's bridge address.
		r, err := tp.DialTCP(cl, "10.96.0.10:80", DialTimeout)
		if err != nil || r.SeenFrom != bridge {
			t.Fatalf("reply %+v, %v; want seen from %v", r, err, bridge)
		}
	})
	t.Run("ClusterIP spread from node (output)", func(t *testing.T) {
		SpreadOver(t, tp, node, "10.96.0.10:80", 40, both...)
	})
	t.Run("ClusterIP from pod keeps source, hairpin masquerades", func(t *testing.T) {
		got := map[string]netip.Addr{}
		for range 40 {
			r, err := tp.DialTCP(pod0, "10.96.0.10:80", DialTimeout)
			if err != nil {
				t.Fatal(err)
			}
			got[r.Backend] = r.SeenFrom
		}
		if got["pod-1"] != tp.PodIP(0) || got["pod-0"] != bridge {
			t.Fatalf("seen from %v: want pod-1 to see %v (unmasqueraded) and pod-0 to see %v (hairpin)", got, tp.PodIP(0), bridge)
		}
	})
	t.Run("UDP ClusterIP spread", func(t *testing.T) {
		seen := map[string]int{}
		for range 40 {
			r, err := tp.DialUDP(cl, "10.96.0.10:53", DialTimeout)
			if err != nil {
				t.Fatal(err)
			}
			seen[r.Backend]++
		}
		if len(seen) != 2 {
			t.Fatalf("UDP backends %v, want both pods", seen)
		}
	})
	t.Run("NodePort from client", func(t *testing.T) {
		SpreadOver(t, tp, cl, nstest.HostPort(tp.NodeIP(), 30080), 40, both...)
		r, err := tp.DialTCP(cl, nstest.HostPort(tp.NodeIP(), 30080), DialTimeout)
		if err != nil || r.SeenFrom != bridge {
			t.Fatalf("reply %+v, %v; want masqueraded to %v (eTP Cluster)", r, err, bridge)
		}
	})
	t.Run("no endpoints is refused", func(t *testing.T) {
		for _, ns := range []string{cl, node, pod0} {
			if _, err := tp.DialTCP(ns, "10.96.0.30:80", DialTimeout); !nstest.IsRefused(err) {
				t.Errorf("TCP from %s: %v, want refused", ns, err)
			}
		}
		if _, err := tp.DialUDP(cl, "10.96.0.30:53", DialTimeout); !nstest.IsRefused(err) {
			t.Errorf("UDP from client: %v, want refused", err)
		}
	})
	t.Run("ClientIP affinity sticks, across a full sync", func(t *testing.T) {
		first, err := tp.DialTCP(cl, "10.96.0.60:80", DialTimeout)
		if err != nil {
			t.Fatal(err)
		}
		SpreadOver(t, tp, cl, "10.96.0.60:80", 30, first.Backend)
		// Another source (the node) is not bound by the client's choice
		// but sticks to its own.
		mine, err := tp.DialTCP(node, "10.96.0.60:80", DialTimeout)
		if err != nil {
			t.Fatal(err)
		}
		SpreadOver(t, tp, node, "10.96.0.60:80", 30, mine.Backend)
		// A full sync keeps what the affinity records hold.
		k.Sync(true, Sorted(services)...)
		SpreadOver(t, tp, cl, "10.96.0.60:80", 20, first.Backend)
		SpreadOver(t, tp, node, "10.96.0.60:80", 20, mine.Backend)
	})
	t.Run("eTP Local keeps the client address", func(t *testing.T) {
		for _, addr := range []string{"198.51.100.40:80", nstest.HostPort(tp.NodeIP(), 30040)} {
			SpreadOver(t, tp, cl, addr, 10, "pod-0")
			r, err := tp.DialTCP(cl, addr, DialTimeout)
			if err != nil || r.SeenFrom != tp.ClientIP() {
				t.Fatalf("%s: reply %+v, %v; want seen from the client %v", addr, r, err, tp.ClientIP())
			}
		}
		// A pod reaching the LB IP short-circuits to every endpoint.
		SpreadOver(t, tp, pod0, "198.51.100.40:80", 40, both...)
	})
	t.Run("eTP Local without local endpoints drops external traffic", func(t *testing.T) {
		for _, addr := range []string{"198.51.100.41:80", nstest.HostPort(tp.NodeIP(), 30041)} {
			if _, err := tp.DialTCP(cl, addr, DropTimeout); !nstest.IsTimeout(err) {
				t.Errorf("%s: %v, want a timeout (dropped)", addr, err)
			}
		}
		SpreadOver(t, tp, pod0, "198.51.100.41:80", 40, both...)
		// The node's own traffic short-circuits too.
		SpreadOver(t, tp, node, "198.51.100.41:80", 40, both...)
	})
	t.Run("loadBalancerSourceRanges", func(t *testing.T) {
		// 20 dials, so that one endpoint takes them all once in 500,000
		// runs (with 10, once in 500).
		SpreadOver(t, tp, cl, "198.51.100.70:80", 20, both...)
		if _, err := tp.DialTCP(cl, "198.51.100.71:80", DropTimeout); !nstest.IsTimeout(err) {
			t.Errorf("denied source: %v, want a timeout (dropped)", err)
		}
		// NodePorts are not subject to the ranges.
		SpreadOver(t, tp, cl, nstest.HostPort(tp.NodeIP(), 30071), 20, both...)
	})
}
