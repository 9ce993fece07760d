package nftables

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"context"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
	"google.golang.org/protobuf/proto"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// The real-kernel tests program namespaces built by nstest. They need
// root and the nft binary (to list what was programmed) and skip without
// them (CI runs as root).

func requireKernel(t testing.TB) {
	t.Helper()
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft binary to list rulesets: apt-get install -y nftables")
	}
}

// nsPath is the path of a namespace nstest created with ip netns add.
func nsPath(ns string) string { return filepath.Join("/run/netns", ns) }

// listTable returns "nft list table" of family's table in ns.
func listTable(t testing.TB, tp *nstest.Topology, ns string, f Family) string {
	t.Helper()
	out, err := tp.Exec(ns, "nft", "list", "table", f.nft(), TableName)
	if err != nil {
		t.Fatalf("nft list table: %v", err)
	}
	return string(out)
}

// nftLoad runs script through nft -f in ns.
func nftLoad(t testing.TB, tp *nstest.Topology, ns, script string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = stringsReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, out)
	}
}

// allCaseServices is every case's Services, each once.
func allCaseServices() []*pb.Service {
	var all []*pb.Service
	seen := map[string]bool{}
	for _, c := range cases {
		for _, s := range c.services() {
			if k := s.Namespace + "/" + s.Name; !seen[k] {
				seen[k] = true
				all = append(all, s)
			}
		}
	}
	return all
}

// TestKernelNetlinkMatchesNFT programs every case's ruleset over netlink
// in one namespace and the rendered nft script with nft -f in another,
// and compares what nft lists: the netlink encoding and the text are two
// renderings of one model, and this proves they program the same rules.
func TestKernelNetlinkMatchesNFT(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Nodes: 2, Pods: 1})
	viaNetlink, viaText := tp.Node(0).NS(), tp.Node(1).NS()
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			for _, c := range cases {
				cfg := c.config()
				if c.family != f {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					cfg.NetNS = nsPath(viaNetlink)
					d, err := New(cfg)
					if err != nil {
						t.Fatal(err)
					}
					tbl := newTable(t, testNode(), c.services()...)
					if err := d.Sync(context.Background(), tbl, nil, true); err != nil {
						t.Fatalf("Sync: %v", err)
					}
					if _, err := tp.Exec(viaText, "nft", "delete", "table", f.nft(), TableName); err != nil {
						t.Logf("no table to delete yet: %v", err)
					}
					nftLoad(t, tp, viaText, rulesetText(fullState(tbl, cfg), f))
					got, want := listTable(t, tp, viaNetlink, f), listTable(t, tp, viaText, f)
					if normalizeListing(got) != normalizeListing(want) {
						t.Errorf("netlink and nft -f programmed different rules:\n%s", lineDiff(normalizeListing(want), normalizeListing(got)))
					}
				})
			}
		})
	}
}

const (
	dialTimeout = 2 * time.Second // IPv6 ICMP refusals arrive ~1 s late (nstest)
	// dropTimeout is how long a dial waits to conclude "dropped".
	dropTimeout = time.Second
)

// kernelNode is the NodeInfo matching nstest's topology.
func kernelNode() *pb.NodeInfo {
	return &pb.NodeInfo{Name: "node", PodCidrs: []string{"10.244.1.0/24", "fd00:244:1::/64"}, Hash: 1}
}

// kernelConfig programs tp's node namespace.
func kernelConfig(tp *nstest.Topology, family Family) Config {
	c := DefaultConfig(family)
	c.LocalMode = LocalClusterCIDR
	c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
	c.NodeIPs = []string{tp.NodeIP().String(), tp.NodeIPv6().String()}
	c.NetNS = nsPath(tp.NodeNS())
	return c
}

// kernelDriver syncs tables into a namespace and computes changed keys.
type kernelDriver struct {
	t    *testing.T
	d    *Dataplane
	prev *proxytable.Table
}

func (k *kernelDriver) sync(full bool, services ...*pb.Service) {
	k.t.Helper()
	if err := k.trySync(full, services...); err != nil {
		k.t.Fatalf("Sync(full=%v): %v", full, err)
	}
}

func (k *kernelDriver) trySync(full bool, services ...*pb.Service) error {
	k.t.Helper()
	next := newTable(k.t, kernelNode(), services...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.d.Sync(ctx, next, changedKeys(k.prev, next), full); err != nil {
		return err
	}
	k.prev = next
	return nil
}

// podEP is pod i's endpoint on port.
func podEP(tp *nstest.Topology, i, port int) string {
	return nstest.HostPort(tp.PodIP(i), port)
}

func kernelServices(tp *nstest.Topology) map[string]*pb.Service {
	both := func(port int) []string { return []string{podEP(tp, 0, port), podEP(tp, 1, port)} }
	web := svc("ns", "web", "10.96.0.10")
	web.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, true), port("dns", udp, 53, 0, true)}
	web.ClusterEndpoints = []*pb.PortEndpoints{eps("http", both(8080)...), eps("dns", both(5353)...)}

	np := svc("ns", "np", "10.96.0.20")
	np.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	np.Ports = []*pb.ServicePort{port("", tcp, 80, 30080, true)}
	np.ClusterEndpoints = []*pb.PortEndpoints{eps("", both(8080)...)}

	empty := svc("ns", "empty", "10.96.0.30")
	empty.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, false), port("dns", udp, 53, 0, false)}

	sticky := svc("ns", "sticky", "10.96.0.60")
	sticky.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 300}
	sticky.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, true)}
	sticky.ClusterEndpoints = []*pb.PortEndpoints{eps("http", both(8080)...)}

	// eTP Local with this node's pod-0 as the local endpoint: the client's
	// address must reach the pod unmasqueraded.
	local := svc("ns", "local", "10.96.0.40")
	local.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	local.LoadBalancerIps = []string{"198.51.100.40"}
	local.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	local.Ports = []*pb.ServicePort{port("http", tcp, 80, 30040, true)}
	local.ClusterEndpoints = []*pb.PortEndpoints{eps("http", both(8080)...)}
	local.LocalEndpoints = []*pb.PortEndpoints{eps("http", podEP(tp, 0, 8080))}

	// eTP Local whose endpoints are all elsewhere: external traffic drops.
	elsewhere := svc("ns", "elsewhere", "10.96.0.41")
	elsewhere.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	elsewhere.LoadBalancerIps = []string{"198.51.100.41"}
	elsewhere.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	elsewhere.Ports = []*pb.ServicePort{port("http", tcp, 80, 30041, true)}
	elsewhere.ClusterEndpoints = []*pb.PortEndpoints{eps("http", both(8080)...)}

	// Source ranges that admit the client, and ones that do not.
	allowed := svc("ns", "allowed", "10.96.0.70")
	allowed.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	allowed.LoadBalancerIps = []string{"198.51.100.70"}
	allowed.LoadBalancerSourceRanges = []string{tp.ClientIP().String() + "/32"}
	allowed.Ports = []*pb.ServicePort{port("http", tcp, 80, 30070, true)}
	allowed.ClusterEndpoints = []*pb.PortEndpoints{eps("http", both(8080)...)}
	denied := svc("ns", "denied", "10.96.0.71")
	denied.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
	denied.LoadBalancerIps = []string{"198.51.100.71"}
	denied.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
	denied.Ports = []*pb.ServicePort{port("http", tcp, 80, 30071, true)}
	denied.ClusterEndpoints = []*pb.PortEndpoints{eps("http", both(8080)...)}

	dual := svc("ns", "dual", "10.96.0.100", "fd00:96::100")
	dual.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, true)}
	dual.ClusterEndpoints = []*pb.PortEndpoints{eps("http", append(both(8080),
		nstest.HostPort(tp.PodIPv6(0), 8080), nstest.HostPort(tp.PodIPv6(1), 8080))...)}

	return map[string]*pb.Service{
		"web": web, "np": np, "empty": empty, "sticky": sticky, "local": local,
		"elsewhere": elsewhere, "allowed": allowed, "denied": denied, "dual": dual,
	}
}

func values(m map[string]*pb.Service, except ...string) []*pb.Service {
	var out []*pb.Service
	for _, k := range sortedKeys(m) {
		if !slices.Contains(except, k) {
			out = append(out, m[k])
		}
	}
	return out
}

// TestKernel programs a node namespace and proves the rules with real TCP
// and UDP from the client, node and pod namespaces, through full and
// partial syncs.
func TestKernel(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{})
	for i := range 2 {
		tp.ServeTCP(i, 8080)
		tp.ServeUDP(i, 5353)
	}
	d, err := New(kernelConfig(tp, IPv4))
	if err != nil {
		t.Fatal(err)
	}
	k := &kernelDriver{t: t, d: d, prev: proxytable.Empty()}
	services := kernelServices(tp)
	k.sync(true, values(services)...)
	node, cl, pod0 := tp.NodeNS(), tp.ClientNS(), tp.PodNS(0)
	bridge := tp.BridgeIP()
	// A real node routes everything (default route); without a route the
	// node would answer "network unreachable" for a load balancer IP it
	// does not DNAT, before the filter chains could drop it.
	if out, err := tp.Exec(node, "ip", "route", "add", "198.51.100.0/24", "dev", nstest.NodeExternalLink); err != nil {
		t.Fatalf("%s: %v", out, err)
	}

	spreadOver := func(t *testing.T, ns, addr string, n int, want ...string) map[string]int {
		t.Helper()
		got, err := tp.Spread(ns, addr, n, dialTimeout)
		if err != nil {
			t.Fatalf("Spread from %s to %s: %v (so far %v)", ns, addr, err, got)
		}
		if keys := sortedKeys(got); !slices.Equal(keys, want) {
			t.Fatalf("from %s to %s: backends %v, want %v", ns, addr, got, want)
		}
		return got
	}
	both := []string{"pod-0", "pod-1"}

	t.Run("ClusterIP spread from client (forwarded)", func(t *testing.T) {
		spreadOver(t, cl, "10.96.0.10:80", 40, both...)
		// Off-cluster source: masqueraded to the node's bridge address.
		r, err := tp.DialTCP(cl, "10.96.0.10:80", dialTimeout)
		if err != nil || r.SeenFrom != bridge {
			t.Fatalf("reply %+v, %v; want seen from %v", r, err, bridge)
		}
	})
	t.Run("ClusterIP spread from node (output)", func(t *testing.T) {
		spreadOver(t, node, "10.96.0.10:80", 40, both...)
	})
	t.Run("ClusterIP from pod keeps source, hairpin masquerades", func(t *testing.T) {
		got := map[string]netip.Addr{}
		for range 40 {
			r, err := tp.DialTCP(pod0, "10.96.0.10:80", dialTimeout)
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
			r, err := tp.DialUDP(cl, "10.96.0.10:53", dialTimeout)
			if err != nil {
				t.Fatal(err)
			}
			seen[r.Backend]++
		}
		if len(seen) != 2 {
			t.Fatalf("UDP backends %v, want both pods", seen)
		}
	})
	t.Run("unknown port of a ClusterIP is refused", func(t *testing.T) {
		for _, ns := range []string{cl, node, pod0} {
			if _, err := tp.DialTCP(ns, "10.96.0.10:81", dropTimeout); !nstest.IsRefused(err) {
				t.Errorf("TCP from %s: %v, want refused", ns, err)
			}
		}
		if _, err := tp.DialUDP(pod0, "10.96.0.10:54", dialTimeout); !nstest.IsRefused(err) {
			t.Errorf("UDP from pod: %v, want refused", err)
		}
	})
	t.Run("NodePort from client", func(t *testing.T) {
		spreadOver(t, cl, nstest.HostPort(tp.NodeIP(), 30080), 40, both...)
		r, err := tp.DialTCP(cl, nstest.HostPort(tp.NodeIP(), 30080), dialTimeout)
		if err != nil || r.SeenFrom != bridge {
			t.Fatalf("reply %+v, %v; want masqueraded to %v (eTP Cluster)", r, err, bridge)
		}
	})
	t.Run("no endpoints is refused", func(t *testing.T) {
		for _, ns := range []string{cl, node, pod0} {
			if _, err := tp.DialTCP(ns, "10.96.0.30:80", dialTimeout); !nstest.IsRefused(err) {
				t.Errorf("TCP from %s: %v, want refused", ns, err)
			}
		}
		if _, err := tp.DialUDP(cl, "10.96.0.30:53", dialTimeout); !nstest.IsRefused(err) {
			t.Errorf("UDP from client: %v, want refused", err)
		}
	})
	t.Run("ClientIP affinity sticks, across a full sync", func(t *testing.T) {
		first, err := tp.DialTCP(cl, "10.96.0.60:80", dialTimeout)
		if err != nil {
			t.Fatal(err)
		}
		spreadOver(t, cl, "10.96.0.60:80", 30, first.Backend)
		// Another source (the node) is not bound by the client's choice
		// but sticks to its own.
		mine, err := tp.DialTCP(node, "10.96.0.60:80", dialTimeout)
		if err != nil {
			t.Fatal(err)
		}
		spreadOver(t, node, "10.96.0.60:80", 30, mine.Backend)
		// A full sync keeps the affinity sets and what they hold.
		k.sync(true, values(services)...)
		spreadOver(t, cl, "10.96.0.60:80", 20, first.Backend)
		spreadOver(t, node, "10.96.0.60:80", 20, mine.Backend)
	})
	t.Run("eTP Local keeps the client address", func(t *testing.T) {
		for _, addr := range []string{"198.51.100.40:80", nstest.HostPort(tp.NodeIP(), 30040)} {
			spreadOver(t, cl, addr, 10, "pod-0")
			r, err := tp.DialTCP(cl, addr, dialTimeout)
			if err != nil || r.SeenFrom != tp.ClientIP() {
				t.Fatalf("%s: reply %+v, %v; want seen from the client %v", addr, r, err, tp.ClientIP())
			}
		}
		// A pod reaching the LB IP short-circuits to every endpoint.
		spreadOver(t, pod0, "198.51.100.40:80", 40, both...)
	})
	t.Run("eTP Local without local endpoints drops external traffic", func(t *testing.T) {
		for _, addr := range []string{"198.51.100.41:80", nstest.HostPort(tp.NodeIP(), 30041)} {
			if _, err := tp.DialTCP(cl, addr, dropTimeout); !nstest.IsTimeout(err) {
				t.Errorf("%s: %v, want a timeout (dropped)", addr, err)
			}
		}
		spreadOver(t, pod0, "198.51.100.41:80", 40, both...)
		// The node's own traffic short-circuits too.
		spreadOver(t, node, "198.51.100.41:80", 40, both...)
	})
	t.Run("loadBalancerSourceRanges", func(t *testing.T) {
		spreadOver(t, cl, "198.51.100.70:80", 10, both...)
		if _, err := tp.DialTCP(cl, "198.51.100.71:80", dropTimeout); !nstest.IsTimeout(err) {
			t.Errorf("denied source: %v, want a timeout (dropped)", err)
		}
		// NodePorts are not subject to the ranges.
		spreadOver(t, cl, nstest.HostPort(tp.NodeIP(), 30071), 10, both...)
	})

	t.Run("partial sync removes an endpoint", func(t *testing.T) {
		web := proto.CloneOf(services["web"])
		web.ClusterEndpoints = []*pb.PortEndpoints{eps("http", podEP(tp, 0, 8080)), eps("dns", podEP(tp, 0, 5353))}
		services["web"] = web
		before := d.Stats().PartialSyncs
		k.sync(false, values(services)...)
		if d.Stats().PartialSyncs != before+1 {
			t.Fatalf("sync was not partial: %+v", d.Stats())
		}
		// Every dial is a new flow (fresh source port), so conntrack
		// cannot pin an old choice.
		spreadOver(t, cl, "10.96.0.10:80", 30, "pod-0")
		spreadOver(t, node, "10.96.0.10:80", 30, "pod-0")
		for range 10 {
			if r, err := tp.DialUDP(cl, "10.96.0.10:53", dialTimeout); err != nil || r.Backend != "pod-0" {
				t.Fatalf("UDP after removal: %+v, %v", r, err)
			}
		}
	})
	t.Run("partial sync adds and removes services", func(t *testing.T) {
		added := svc("ns", "added", "10.96.0.90")
		added.Ports = []*pb.ServicePort{port("http", tcp, 80, 0, true)}
		added.ClusterEndpoints = []*pb.PortEndpoints{eps("http", podEP(tp, 1, 8080))}
		services["added"] = added
		delete(services, "empty")
		delete(services, "sticky")
		before := d.Stats().PartialSyncs
		k.sync(false, values(services)...)
		if d.Stats().PartialSyncs != before+1 {
			t.Fatalf("sync was not partial: %+v", d.Stats())
		}
		spreadOver(t, cl, "10.96.0.90:80", 10, "pod-1")
		out := listTable(t, tp, node, IPv4)
		if strings.Contains(out, "10.96.0.60") || strings.Contains(out, "ns/sticky") {
			t.Errorf("removed service's elements, chains or sets survive:\n%s", out)
		}
		if _, err := tp.DialTCP(cl, "10.96.0.30:80", dropTimeout); nstest.IsRefused(err) {
			t.Errorf("removed service still rejected: its elements survived")
		}
		// Other services unaffected.
		spreadOver(t, cl, nstest.HostPort(tp.NodeIP(), 30080), 20, both...)
	})
	t.Run("partial syncs leave what a full sync writes", func(t *testing.T) {
		partial := listTable(t, tp, node, IPv4)
		k.sync(true, values(services)...)
		full := listTable(t, tp, node, IPv4)
		if normalizeListing(partial) != normalizeListing(full) {
			t.Errorf("the table after partial syncs differs from a full sync:\n%s", lineDiff(normalizeListing(full), normalizeListing(partial)))
		}
	})
	t.Run("full sync prunes and repairs what changed behind its back", func(t *testing.T) {
		// Someone deletes an element and adds a chain to our table.
		for _, args := range [][]string{
			{"delete", "element", "ip", TableName, mapServiceIPs, "{", "10.96.0.90", ".", "tcp", ".", "80", "}"},
			{"add", "chain", "ip", TableName, "intruder/x"},
		} {
			if out, err := tp.Exec(node, "nft", args...); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
		}
		if _, err := tp.DialTCP(cl, "10.96.0.90:80", dropTimeout); err == nil {
			t.Fatalf("service still answers without its element")
		}
		// A fresh Dataplane (as after a restart) lists the table first.
		d2, err := New(kernelConfig(tp, IPv4))
		if err != nil {
			t.Fatal(err)
		}
		k2 := &kernelDriver{t: t, d: d2, prev: proxytable.Empty()}
		k2.sync(true, services["web"], services["added"])
		spreadOver(t, cl, "10.96.0.90:80", 5, "pod-1")
		out := listTable(t, tp, node, IPv4)
		for _, gone := range []string{"intruder", "30080", "ns/np/"} {
			if strings.Contains(out, gone) {
				t.Errorf("full sync left %q:\n%s", gone, out)
			}
		}
		if n := strings.Count(out, "\tchain "); n != 16+2+2+1+1 {
			t.Errorf("%d chains after the full sync, want 16 shared + web (2 service, 2 endpoint) + added (1 + 1):\n%s", n, out)
		}
	})

	t.Run("IPv6", func(t *testing.T) {
		d6, err := New(kernelConfig(tp, IPv6))
		if err != nil {
			t.Fatal(err)
		}
		k6 := &kernelDriver{t: t, d: d6, prev: proxytable.Empty()}
		k6.sync(true, kernelServices(tp)["dual"])
		spreadOver(t, cl, "[fd00:96::100]:80", 40, both...)
		spreadOver(t, node, "[fd00:96::100]:80", 40, both...)
		if _, err := tp.DialTCP(pod0, "[fd00:96::100]:81", dropTimeout); !nstest.IsRefused(err) {
			t.Errorf("unknown port over IPv6: %v, want refused at once (TCP reset)", err)
		}
	})
}

// TestKernelRefusal makes the kernel refuse a partial sync (an element
// someone added behind the Dataplane's back conflicts with a new one) and
// checks that the error names the operation and the Service, that nothing
// of the transaction applied, and that the next (full) sync repairs it.
func TestKernelRefusal(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	tp.ServeTCP(0, 8080)
	d, err := New(kernelConfig(tp, IPv4))
	if err != nil {
		t.Fatal(err)
	}
	k := &kernelDriver{t: t, d: d, prev: proxytable.Empty()}
	good := svc("ns", "good", "10.96.0.10")
	good.Ports = []*pb.ServicePort{port("", tcp, 80, 0, true)}
	good.ClusterEndpoints = []*pb.PortEndpoints{eps("", podEP(tp, 0, 8080))}
	k.sync(true, good)
	if out, err := tp.Exec(tp.NodeNS(), "nft", "add", "element", "ip", TableName, mapServiceIPs, "{", "10.96.0.11", ".", "tcp", ".", "80", ":", "drop", "}"); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	before := listTable(t, tp, tp.NodeNS(), IPv4)
	bad := svc("ns", "bad", "10.96.0.11")
	bad.Ports = []*pb.ServicePort{port("", tcp, 80, 0, true)}
	bad.ClusterEndpoints = []*pb.PortEndpoints{eps("", podEP(tp, 0, 8080))}
	err = k.trySync(false, good, bad)
	var te *TransactionError
	if !errors.As(err, &te) {
		t.Fatalf("Sync error = %v, want a TransactionError", err)
	}
	t.Logf("error: %v", err)
	if te.Key != "ns/bad" || !strings.HasPrefix(te.Op, "add element ip proxyplane service-ips") || !errors.Is(err, syscall.EEXIST) || !te.Partial {
		t.Errorf("TransactionError %+v, want ns/bad's service-ips element refused with EEXIST", te)
	}
	if after := listTable(t, tp, tp.NodeNS(), IPv4); after != before {
		t.Errorf("a refused transaction changed the table:\n%s", lineDiff(before, after))
	}
	// The retry is full: it flushes the maps and converges.
	k.sync(false, good, bad)
	if st := d.Stats(); st.FullSyncs != 2 || st.Failures != 1 {
		t.Errorf("stats %+v, want the retry full", st)
	}
	if _, err := tp.DialTCP(tp.ClientNS(), "10.96.0.11:80", dialTimeout); err != nil {
		t.Errorf("ns/bad after the repair: %v", err)
	}
}

// TestKernelLargeTable loads a table whose maps need more than one
// netlink message each (the 64 KiB attribute limit) and checks every
// element arrived, then updates one Service.
func TestKernelLargeTable(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	d, err := New(kernelConfig(tp, IPv4))
	if err != nil {
		t.Fatal(err)
	}
	const n = 2500
	services := scaleServices(n, 3)
	k := &kernelDriver{t: t, d: d, prev: proxytable.Empty()}
	k.sync(true, services...)
	out, err := tp.Exec(tp.NodeNS(), "nft", "list", "map", "ip", TableName, mapServiceIPs)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(out), ": goto service-"); got != n {
		t.Fatalf("service-ips holds %d elements, want %d", got, n)
	}
	out, err = tp.Exec(tp.NodeNS(), "nft", "list", "chains", "ip")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(out), "chain endpoint-"); got != 3*n {
		t.Fatalf("%d endpoint chains, want %d", got, 3*n)
	}
	s := proto.CloneOf(services[7])
	s.ClusterEndpoints = []*pb.PortEndpoints{eps("http", "10.64.0.1:8080")}
	services[7] = s
	k.sync(false, services...)
	out, err = tp.Exec(tp.NodeNS(), "nft", "list", "chain", "ip", TableName, prefixClusterPolicyChain+portNameBase("ns/svc-7", "tcp", "http"))
	if err != nil || !strings.Contains(string(out), "10.64.0.1/8080") {
		t.Fatalf("partial sync in a large table: %s %v", out, err)
	}
}

// TestKernelSeamErrors runs a transaction that fails half-way through the
// netlink kernel directly: the error blames the right operation and
// Service, carries the kernel's message, and the operations before it did
// not apply.
func TestKernelSeamErrors(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	k := newNetlinkKernel(IPv4, nsPath(tp.NodeNS()))
	inv, err := k.List(context.Background())
	if err != nil || inv != nil {
		t.Fatalf("List of a namespace without the table = %v, %v; want nil, nil", inv, err)
	}
	tx := &transaction{}
	c := &chain{name: "a/chain"}
	r := newRule(goTo("missing/chain"))
	tx.add(op{kind: opAddTable}, op{kind: opAddChain, chain: c}, op{kind: opAddRule, name: c.name, rule: &r, owner: "ns/x"})
	err = k.Run(context.Background(), tx)
	var te *TransactionError
	if !errors.As(err, &te) || te.Key != "ns/x" || !errors.Is(err, syscall.ENOENT) || !strings.HasPrefix(te.Op, "add rule ip proxyplane a/chain goto missing/chain") {
		t.Fatalf("Run error = %v (%+v), want ENOENT blamed on ns/x's rule", err, te)
	}
	t.Logf("error: %v", err)
	if inv, err := k.List(context.Background()); err != nil || inv != nil {
		t.Fatalf("after a refused transaction the table exists: %+v, %v", inv, err)
	}
	// The socket still works.
	if err := k.Run(context.Background(), &transaction{ops: []op{{kind: opAddTable}, {kind: opAddChain, chain: c}}}); err != nil {
		t.Fatal(err)
	}
	inv, err = k.List(context.Background())
	if err != nil || inv == nil || len(inv.chains) != 1 {
		t.Fatalf("List = %+v, %v; want one chain", inv, err)
	}
}
