package nftables

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
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
func listTable(t testing.TB, tp *nstest.Topology, ns string, f dataplane.Family) string {
	t.Helper()
	out, err := tp.Exec(ns, "nft", "list", "table", nftFamily(f), TableName)
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

// TestKernelNetlinkMatchesNFT programs every case's ruleset over netlink
// in one namespace and the rendered nft script with nft -f in another,
// and compares what nft lists: the netlink encoding and the text are two
// renderings of one model, and this proves they program the same rules.
func TestKernelNetlinkMatchesNFT(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Nodes: 2, Pods: 1})
	viaNetlink, viaText := tp.Node(0).NS(), tp.Node(1).NS()
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		// Cascades (the default at these sizes) and endpoint maps.
		for _, mapMin := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/endpoint-map-min-%d", f, mapMin), func(t *testing.T) {
				for _, c := range dptest.Cases {
					cfg := caseConfig(c)
					cfg.EndpointMapMin = mapMin
					if c.Family != f {
						continue
					}
					t.Run(c.Name, func(t *testing.T) {
						cfg.NetNS = nsPath(viaNetlink)
						d, err := New(cfg, nil)
						if err != nil {
							t.Fatal(err)
						}
						tbl := dptest.Table(t, dptest.Node(), c.Services()...)
						if err := d.Sync(context.Background(), tbl, nil, true); err != nil {
							t.Fatalf("Sync: %v", err)
						}
						if _, err := tp.Exec(viaText, "nft", "delete", "table", nftFamily(f), TableName); err != nil {
							t.Logf("no table to delete yet: %v", err)
						}
						nftLoad(t, tp, viaText, rulesetText(fullState(tbl, cfg), f))
						got, want := listTable(t, tp, viaNetlink, f), listTable(t, tp, viaText, f)
						if normalizeListing(got) != normalizeListing(want) {
							t.Errorf("netlink and nft -f programmed different rules:\n%s", dptest.LineDiff(normalizeListing(want), normalizeListing(got)))
						}
					})
				}
			})
		}
	}
}

// kernelConfig programs tp's node namespace.
func kernelConfig(tp *nstest.Topology, family dataplane.Family) Config {
	c := DefaultConfig(family)
	c.LocalMode = dataplane.LocalClusterCIDR
	c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
	c.NodeIPs = []string{tp.NodeIP().String(), tp.NodeIPv6().String()}
	c.NetNS = nsPath(tp.NodeNS())
	// Endpoint maps for every service port, so that real traffic goes
	// through them (internal/flowsuite runs the default: cascades).
	c.EndpointMapMin = 1
	return c
}

// TestKernel programs a node namespace and proves the rules with real TCP
// and UDP from the client, node and pod namespaces, through full and
// partial syncs.
func TestKernel(t *testing.T) {
	requireKernel(t)
	tp := dptest.KernelTopology(t)
	rec := &dptest.Recorder{}
	d, err := New(kernelConfig(tp, dataplane.IPv4), rec.Observe)
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewDriver(t, d)
	services := dptest.KernelServices(tp)
	k.Sync(true, dptest.Sorted(services)...)
	dptest.CheckKernelServices(t, tp, k, services)

	node, cl, pod0 := tp.NodeNS(), tp.ClientNS(), tp.PodNS(0)
	both := []string{"pod-0", "pod-1"}
	t.Run("unknown port of a ClusterIP is refused", func(t *testing.T) {
		for _, ns := range []string{cl, node, pod0} {
			if _, err := tp.DialTCP(ns, "10.96.0.10:81", dptest.DropTimeout); !nstest.IsRefused(err) {
				t.Errorf("TCP from %s: %v, want refused", ns, err)
			}
		}
		if _, err := tp.DialUDP(pod0, "10.96.0.10:54", dptest.DialTimeout); !nstest.IsRefused(err) {
			t.Errorf("UDP from pod: %v, want refused", err)
		}
	})
	t.Run("partial sync removes an endpoint", func(t *testing.T) {
		web := proto.CloneOf(services["web"])
		web.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.PodEP(tp, 0, 8080)), dptest.Eps("dns", dptest.PodEP(tp, 0, 5353))}
		services["web"] = web
		k.Sync(false, dptest.Sorted(services)...)
		if res := rec.Last(t); res.Full {
			t.Fatalf("sync was not partial: %+v", res)
		}
		// Every dial is a new flow (fresh source port), so conntrack
		// cannot pin an old choice.
		dptest.SpreadOver(t, tp, cl, "10.96.0.10:80", 30, "pod-0")
		dptest.SpreadOver(t, tp, node, "10.96.0.10:80", 30, "pod-0")
		for range 10 {
			if r, err := tp.DialUDP(cl, "10.96.0.10:53", dptest.DialTimeout); err != nil || r.Backend != "pod-0" {
				t.Fatalf("UDP after removal: %+v, %v", r, err)
			}
		}
	})
	t.Run("partial sync adds and removes services", func(t *testing.T) {
		added := dptest.Svc("ns", "added", "10.96.0.90")
		added.Ports = []*pb.ServicePort{dptest.Port("http", dptest.TCP, 80, 0, true)}
		added.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.PodEP(tp, 1, 8080))}
		services["added"] = added
		delete(services, "empty")
		delete(services, "sticky")
		k.Sync(false, dptest.Sorted(services)...)
		if res := rec.Last(t); res.Full {
			t.Fatalf("sync was not partial: %+v", res)
		}
		dptest.SpreadOver(t, tp, cl, "10.96.0.90:80", 10, "pod-1")
		out := listTable(t, tp, node, dataplane.IPv4)
		if strings.Contains(out, "10.96.0.60") || strings.Contains(out, "ns/sticky") {
			t.Errorf("removed service's elements, chains or sets survive:\n%s", out)
		}
		if _, err := tp.DialTCP(cl, "10.96.0.30:80", dptest.DropTimeout); nstest.IsRefused(err) {
			t.Errorf("removed service still rejected: its elements survived")
		}
		// Other services unaffected.
		dptest.SpreadOver(t, tp, cl, nstest.HostPort(tp.NodeIP(), 30080), 20, both...)
	})
	t.Run("partial syncs leave what a full sync writes", func(t *testing.T) {
		partial := listTable(t, tp, node, dataplane.IPv4)
		k.Sync(true, dptest.Sorted(services)...)
		full := listTable(t, tp, node, dataplane.IPv4)
		if normalizeListing(partial) != normalizeListing(full) {
			t.Errorf("the table after partial syncs differs from a full sync:\n%s", dptest.LineDiff(normalizeListing(full), normalizeListing(partial)))
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
		if _, err := tp.DialTCP(cl, "10.96.0.90:80", dptest.DropTimeout); err == nil {
			t.Fatalf("service still answers without its element")
		}
		// A fresh Dataplane (as after a restart) lists the table first.
		d2, err := New(kernelConfig(tp, dataplane.IPv4), nil)
		if err != nil {
			t.Fatal(err)
		}
		k2 := dptest.NewDriver(t, d2)
		k2.Sync(true, services["web"], services["added"])
		dptest.SpreadOver(t, tp, cl, "10.96.0.90:80", 5, "pod-1")
		out := listTable(t, tp, node, dataplane.IPv4)
		for _, gone := range []string{"intruder", "30080", "ns/np/"} {
			if strings.Contains(out, gone) {
				t.Errorf("full sync left %q:\n%s", gone, out)
			}
		}
		if n := strings.Count(out, "\tchain "); n != 16+2+1 {
			t.Errorf("%d chains after the full sync, want 16 shared + web (2 service) + added (1):\n%s", n, out)
		}
		if n := strings.Count(out, "\tmap endpoints-"); n != 2+1 {
			t.Errorf("%d endpoint maps after the full sync, want web (2) + added (1):\n%s", n, out)
		}
	})

	t.Run("IPv6", func(t *testing.T) {
		d6, err := New(kernelConfig(tp, dataplane.IPv6), nil)
		if err != nil {
			t.Fatal(err)
		}
		k6 := dptest.NewDriver(t, d6)
		k6.Sync(true, dptest.KernelServices(tp)["dual"])
		dptest.SpreadOver(t, tp, cl, "[fd00:96::100]:80", 40, both...)
		dptest.SpreadOver(t, tp, node, "[fd00:96::100]:80", 40, both...)
		// ICMPv6 port unreachable, reported with the retransmitted SYN
		// about a second late (see nstest).
		if _, err := tp.DialTCP(pod0, "[fd00:96::100]:81", 3*time.Second); !nstest.IsRefused(err) {
			t.Errorf("unknown port over IPv6: %v, want refused", err)
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
	rec := &dptest.Recorder{}
	d, err := New(kernelConfig(tp, dataplane.IPv4), rec.Observe)
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewDriver(t, d)
	good := dptest.Svc("ns", "good", "10.96.0.10")
	good.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	good.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", dptest.PodEP(tp, 0, 8080))}
	k.Sync(true, good)
	if out, err := tp.Exec(tp.NodeNS(), "nft", "add", "element", "ip", TableName, mapServiceIPs, "{", "10.96.0.11", ".", "tcp", ".", "80", ":", "drop", "}"); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	before := listTable(t, tp, tp.NodeNS(), dataplane.IPv4)
	bad := dptest.Svc("ns", "bad", "10.96.0.11")
	bad.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	bad.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", dptest.PodEP(tp, 0, 8080))}
	err = k.TrySync(false, good, bad)
	var te *TransactionError
	if !errors.As(err, &te) {
		t.Fatalf("Sync error = %v, want a TransactionError", err)
	}
	t.Logf("error: %v", err)
	if te.Key != "ns/bad" || !strings.HasPrefix(te.Op, "add element ip proxyplane service-ips") || !errors.Is(err, syscall.EEXIST) || !te.Partial {
		t.Errorf("TransactionError %+v, want ns/bad's service-ips element refused with EEXIST", te)
	}
	if after := listTable(t, tp, tp.NodeNS(), dataplane.IPv4); after != before {
		t.Errorf("a refused transaction changed the table:\n%s", dptest.LineDiff(before, after))
	}
	// The retry is full: it flushes the maps and converges.
	k.Sync(false, good, bad)
	if rec.Count(true, false) != 2 || rec.Count(false, true) != 1 || len(rec.Results) != 3 {
		t.Errorf("observed syncs %+v, want the retry full", rec.Results)
	}
	if _, err := tp.DialTCP(tp.ClientNS(), "10.96.0.11:80", dptest.DialTimeout); err != nil {
		t.Errorf("ns/bad after the repair: %v", err)
	}
}

// TestKernelLargeTable loads a table whose maps need more than one
// netlink message each (the 64 KiB attribute limit) and checks every
// element arrived, then updates one Service.
func TestKernelLargeTable(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	d, err := New(kernelConfig(tp, dataplane.IPv4), nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2500
	services := dptest.ScaleServices(n, 3)
	k := dptest.NewDriver(t, d)
	k.Sync(true, services...)
	out, err := tp.Exec(tp.NodeNS(), "nft", "list", "map", "ip", TableName, mapServiceIPs)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(out), ": goto service-"); got != n {
		t.Fatalf("service-ips holds %d elements, want %d", got, n)
	}
	out, err = tp.Exec(tp.NodeNS(), "nft", "list", "maps", "ip")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(out), "map endpoints-"); got != n {
		t.Fatalf("%d endpoint maps, want %d", got, n)
	}
	s := proto.CloneOf(services[7])
	s.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", "10.64.0.1:8080")}
	services[7] = s
	k.Sync(false, services...)
	out, err = tp.Exec(tp.NodeNS(), "nft", "list", "map", "ip", TableName, prefixEndpointsMap+portNameBase("ns/svc-7", "tcp", "http"))
	if err != nil || !strings.Contains(string(out), "0 : 10.64.0.1 . 8080") {
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
	k := newNetlinkKernel(dataplane.IPv4, nsPath(tp.NodeNS()))
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

// kernelWeb returns a topology with one pod serving TCP 8080, and
// ClusterIP 10.96.0.10:80 on it.
func kernelWeb(t *testing.T) (*nstest.Topology, *pb.Service) {
	t.Helper()
	tp := nstest.New(t, nstest.Options{Pods: 1})
	tp.ServeTCP(0, 8080)
	web := dptest.Svc("ns", "web", "10.96.0.10")
	web.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	web.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", dptest.PodEP(tp, 0, 8080))}
	return tp, web
}

// TestKernelDrift is issue 14 on the real kernel: after a good sync, a
// table, a service chain, a map element or a base chain's rule is deleted
// by hand with nft, and the next full sync (what the agent's periodic sync
// runs) must succeed and make packets flow again, leaving the table as it
// was. The same tamperings without the drift check show what it repairs:
// a full sync from memory fails on a missing table or chain (rules and
// elements it refills anyway), and only the next one repairs.
func TestKernelDrift(t *testing.T) {
	requireKernel(t)
	tp, web := kernelWeb(t)
	node, cl := tp.NodeNS(), tp.ClientNS()
	webChain := prefixClusterPolicyChain + portNameBase("ns/web", "tcp", "")
	webElement := []string{"{", "10.96.0.10", ".", "tcp", ".", "80", "}"}
	nft := func(t *testing.T, args ...string) {
		t.Helper()
		if out, err := tp.Exec(node, "nft", args...); err != nil {
			t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, tt := range []struct {
		name   string
		tamper func(t *testing.T)
		trips  bool // a full sync from memory fails on it
	}{
		{name: "table", trips: true, tamper: func(t *testing.T) {
			t.Helper()
			nft(t, "delete", "table", "ip", TableName)
		}},
		{name: "service chain", trips: true, tamper: func(t *testing.T) {
			t.Helper()
			// Only an unreferenced chain can go: its element first.
			nft(t, append([]string{"delete", "element", "ip", TableName, mapServiceIPs}, webElement...)...)
			nft(t, "flush", "chain", "ip", TableName, webChain)
			nft(t, "delete", "chain", "ip", TableName, webChain)
		}},
		{name: "map element", tamper: func(t *testing.T) {
			t.Helper()
			nft(t, append([]string{"delete", "element", "ip", TableName, mapServiceIPs}, webElement...)...)
		}},
		{name: "base chain jump", tamper: func(t *testing.T) {
			t.Helper()
			out, err := tp.Exec(node, "nft", "-a", "list", "chain", "ip", TableName, chainNATPrerouting)
			if err != nil {
				t.Fatalf("nft -a list chain: %v: %s", err, out)
			}
			handle := ""
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "jump "+chainServices) {
					if _, h, ok := strings.Cut(line, "# handle "); ok {
						handle = strings.TrimSpace(h)
					}
				}
			}
			if handle == "" {
				t.Fatalf("no jump to %s in:\n%s", chainServices, out)
			}
			nft(t, "delete", "rule", "ip", TableName, chainNATPrerouting, "handle", handle)
		}},
	} {
		for _, check := range []bool{true, false} {
			name := tt.name
			if !check {
				name += "/without the check"
			}
			t.Run(name, func(t *testing.T) {
				rec := &dptest.Recorder{}
				d, err := New(kernelConfig(tp, dataplane.IPv4), rec.Observe)
				if err != nil {
					t.Fatal(err)
				}
				if !check {
					d = withoutDriftCheck(d, rec.Observe)
				}
				k := dptest.NewDriver(t, d)
				k.Sync(true, web)
				dptest.SpreadOver(t, tp, cl, "10.96.0.10:80", 3, "pod-0")
				before := listTable(t, tp, node, dataplane.IPv4)

				tt.tamper(t)
				if _, err := tp.DialTCP(cl, "10.96.0.10:80", dptest.DropTimeout); err == nil {
					t.Fatalf("the service still answers after the tampering")
				}

				err = k.TrySync(true, web)
				switch {
				case check && err != nil:
					t.Fatalf("full sync after the tampering: %v", err)
				case check && rec.Last(t).Drifted != tt.trips:
					t.Errorf("sync reported Drifted=%v, want %v", rec.Last(t).Drifted, tt.trips)
				case !check && (err != nil) != tt.trips:
					t.Fatalf("full sync from memory: %v; want failing %v", err, tt.trips)
				case err != nil:
					t.Logf("without the check: %v", err)
					if !errors.Is(err, syscall.ENOENT) {
						t.Errorf("error %v, want ENOENT", err)
					}
					k.Sync(true, web)
				}
				dptest.SpreadOver(t, tp, cl, "10.96.0.10:80", 3, "pod-0")
				if after := listTable(t, tp, node, dataplane.IPv4); normalizeListing(after) != normalizeListing(before) {
					t.Errorf("the repaired table differs:\n%s", dptest.LineDiff(normalizeListing(before), normalizeListing(after)))
				}
			})
		}
	}
}

// TestKernelGen checks the generation the drift check relies on: it moves
// by one at each of our commits and at another program's, and not with
// no commit, even while packets fill an affinity set.
func TestKernelGen(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	tp.ServeTCP(0, 8080)
	k := newNetlinkKernel(dataplane.IPv4, nsPath(tp.NodeNS()))
	gen := func() uint32 {
		t.Helper()
		g, err := k.Gen(context.Background())
		if err != nil {
			t.Fatalf("Gen: %v", err)
		}
		return g
	}
	d, err := New(kernelConfig(tp, dataplane.IPv4), nil)
	if err != nil {
		t.Fatal(err)
	}
	sticky := dptest.Svc("ns", "sticky", "10.96.0.60")
	sticky.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 600} // as affinitySet names it
	sticky.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	sticky.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", dptest.PodEP(tp, 0, 8080))}
	dk := dptest.NewDriver(t, d)
	dk.Sync(true, sticky)

	g0 := gen()
	dptest.SpreadOver(t, tp, tp.ClientNS(), "10.96.0.60:80", 3, "pod-0")
	out, err := tp.Exec(tp.NodeNS(), "nft", "list", "set", "ip", TableName, affinitySet("ns/sticky", "", dptest.PodEP(tp, 0, 8080)))
	if err != nil || !strings.Contains(string(out), tp.ClientIP().String()) {
		t.Fatalf("the affinity set did not learn the client: %v\n%s", err, out)
	}
	if g := gen(); g != g0 {
		t.Fatalf("generation went from %d to %d with no commit", g0, g)
	}
	dk.Sync(false, sticky, dptest.NodePortService())
	if g := gen(); g != nextGen(g0) {
		t.Fatalf("generation %d after our commit, want %d", g, nextGen(g0))
	}
	if out, err := tp.Exec(tp.NodeNS(), "nft", "add", "table", "ip", "someone-else"); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if g := gen(); g != nextGen(nextGen(g0)) {
		t.Fatalf("generation %d after another commit, want %d", g, nextGen(nextGen(g0)))
	}
}

// TestKernelCleanup checks --cleanup's part in nftables mode: the table
// goes with everything in it, a second cleanup finds nothing to do, and
// the next sync, full, programs it all again.
func TestKernelCleanup(t *testing.T) {
	requireKernel(t)
	tp, web := kernelWeb(t)
	node, cl := tp.NodeNS(), tp.ClientNS()
	rec := &dptest.Recorder{}
	d, err := New(kernelConfig(tp, dataplane.IPv4), rec.Observe)
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewDriver(t, d)
	k.Sync(true, web)
	dptest.SpreadOver(t, tp, cl, "10.96.0.10:80", 3, "pod-0")
	for range 2 {
		if err := d.Cleanup(context.Background()); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
	}
	if out, err := tp.Exec(node, "nft", "list", "table", "ip", TableName); err == nil {
		t.Fatalf("the table survived cleanup:\n%s", out)
	}
	if _, err := tp.DialTCP(cl, "10.96.0.10:80", dptest.DropTimeout); err == nil {
		t.Fatal("the service answers after cleanup")
	}
	k.Sync(false, web)
	if !rec.Last(t).Full {
		t.Errorf("the sync after a cleanup was partial: %+v", rec.Last(t))
	}
	dptest.SpreadOver(t, tp, cl, "10.96.0.10:80", 3, "pod-0")
}
