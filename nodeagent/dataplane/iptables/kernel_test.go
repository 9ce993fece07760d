package iptables

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// The real-kernel tests program a node namespace built by nstest and prove
// the rules with real TCP and UDP from the client, node and pod
// namespaces. They need root and skip without it (CI runs as root).

const (
	dialTimeout = 2 * time.Second
	// dropTimeout is how long a dial waits to conclude "dropped".
	dropTimeout = time.Second
)

// kernelNode is the NodeInfo matching nstest's topology.
func kernelNode() *pb.NodeInfo {
	return &pb.NodeInfo{Name: "node", PodCidrs: []string{"10.244.1.0/24", "fd00:244:1::/64"}, Hash: 1}
}

// kernelConfig programs tp's node namespace with backend.
func kernelConfig(tp *nstest.Topology, family Family, backend Backend) Config {
	c := DefaultConfig(family)
	c.Backend = backend
	c.LocalMode = LocalClusterCIDR
	c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
	c.NodeIPs = []string{tp.NodeIP().String(), tp.NodeIPv6().String()}
	c.CommandPrefix = []string{"ip", "netns", "exec", tp.NodeNS()}
	return c
}

// backends lists the backends whose tools are installed.
func backends(t *testing.T) []Backend {
	t.Helper()
	var out []Backend
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		if _, err := exec.LookPath(binaryNames(IPv4, b).restore); err == nil {
			out = append(out, b)
		} else {
			t.Logf("%s iptables not installed, not tested: %v", b, err)
		}
	}
	if len(out) == 0 {
		t.Fatal("no iptables tools installed (apt-get install -y iptables)")
	}
	return out
}

// kernelDriver syncs tables into a namespace and computes changed keys.
type kernelDriver struct {
	t    *testing.T
	d    *Dataplane
	prev *proxytable.Table
}

func (k *kernelDriver) sync(full bool, services ...*pb.Service) {
	k.t.Helper()
	next := newTable(k.t, kernelNode(), services...)
	var changed []string
	for key, e := range next.Entries {
		if old, ok := k.prev.Entries[key]; !ok || old.GetHash() != e.GetHash() {
			changed = append(changed, key)
		}
	}
	for key := range k.prev.Entries {
		if _, ok := next.Entries[key]; !ok {
			changed = append(changed, key)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.d.Sync(ctx, next, changed, full); err != nil {
		k.t.Fatalf("Sync(full=%v): %v", full, err)
	}
	k.prev = next
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
	for _, k := range slices.Sorted(mapsKeys(m)) {
		if !slices.Contains(except, k) {
			out = append(out, m[k])
		}
	}
	return out
}

func TestKernel(t *testing.T) {
	nstest.RequireRoot(t)
	for _, backend := range backends(t) {
		t.Run(string(backend), func(t *testing.T) { testKernel(t, backend) })
	}
}

func testKernel(t *testing.T, backend Backend) {
	t.Helper()
	tp := nstest.New(t, nstest.Options{})
	for i := range 2 {
		tp.ServeTCP(i, 8080)
		tp.ServeUDP(i, 5353)
	}
	d, err := New(kernelConfig(tp, IPv4, backend))
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
	// does not DNAT, before the filter table could drop it.
	if out, err := tp.Exec(node, "ip", "route", "add", "198.51.100.0/24", "dev", nstest.NodeExternalLink); err != nil {
		t.Fatalf("%s: %v", out, err)
	}

	spreadOver := func(t *testing.T, ns, addr string, n int, want ...string) map[string]int {
		t.Helper()
		got, err := tp.Spread(ns, addr, n, dialTimeout)
		if err != nil {
			t.Fatalf("Spread from %s to %s: %v (so far %v)", ns, addr, err, got)
		}
		if keys := slices.Sorted(mapsKeys(got)); !slices.Equal(keys, want) {
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
	t.Run("ClusterIP spread from node (OUTPUT)", func(t *testing.T) {
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
	t.Run("ClientIP affinity sticks", func(t *testing.T) {
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
		out, err := tp.Exec(node, binaryNames(IPv4, backend).save, "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "10.96.0.60") || strings.Contains(string(out), portHash("ns/sticky:http", "tcp")) {
			t.Errorf("removed service's dispatch rule or chains survive:\n%s", out)
		}
		if _, err := tp.DialTCP(cl, "10.96.0.30:80", dropTimeout); nstest.IsRefused(err) {
			t.Errorf("removed service still rejected: its filter rules survived")
		}
		// Other services unaffected.
		spreadOver(t, cl, nstest.HostPort(tp.NodeIP(), 30080), 20, both...)
	})
	t.Run("full sync prunes stale chains", func(t *testing.T) {
		k.sync(true, services["web"], services["added"])
		out, err := tp.Exec(node, binaryNames(IPv4, backend).save, "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		chains, _ := scanSave(out)
		var ours []string
		for _, c := range chains {
			if isServiceChain(c) {
				ours = append(ours, c)
			}
		}
		// web: SVC (http, dns) + 1 SEP each; added: SVC + SEP.
		if len(ours) != 6 {
			t.Fatalf("service chains after full sync: %v, want 6", ours)
		}
		if strings.Contains(string(out), "30080") {
			t.Fatalf("removed NodePort still in nat:\n%s", out)
		}
		spreadOver(t, cl, "10.96.0.90:80", 5, "pod-1")
	})
	t.Run("full sync repairs flushed jumps", func(t *testing.T) {
		ipt := binaryNames(IPv4, backend).iptables
		for _, chain := range []string{"PREROUTING", "OUTPUT"} {
			if out, err := tp.Exec(node, ipt, "-w", "5", "-t", "nat", "-F", chain); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
		}
		if _, err := tp.DialTCP(cl, "10.96.0.90:80", dropTimeout); err == nil {
			t.Fatalf("service still answers with PREROUTING flushed")
		}
		k.sync(true, services["web"], services["added"])
		spreadOver(t, cl, "10.96.0.90:80", 5, "pod-1")
		spreadOver(t, node, "10.96.0.90:80", 5, "pod-1")
	})

	t.Run("IPv6", func(t *testing.T) {
		d6, err := New(kernelConfig(tp, IPv6, backend))
		if err != nil {
			t.Fatal(err)
		}
		k6 := &kernelDriver{t: t, d: d6, prev: proxytable.Empty()}
		k6.sync(true, kernelServices(tp)["dual"])
		spreadOver(t, cl, "[fd00:96::100]:80", 40, both...)
		spreadOver(t, node, "[fd00:96::100]:80", 40, both...)
	})
}

// TestKernelProductionPath runs the Dataplane without a command prefix
// inside the node namespace (as the agent runs on a node), so the jumps go
// through go-iptables, and lets it detect the backend.
func TestKernelProductionPath(t *testing.T) {
	nstest.RequireRoot(t)
	tp := nstest.New(t, nstest.Options{})
	tp.ServeTCP(0, 8080)
	tp.ServeTCP(1, 8080)
	cfg := kernelConfig(tp, IPv4, BackendAuto)
	cfg.CommandPrefix = nil
	s := kernelServices(tp)
	tbl := newTable(t, kernelNode(), s["web"], s["np"])
	var d *Dataplane
	err := tp.Do(tp.NodeNS(), func() error {
		var err error
		if d, err = New(cfg); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return d.Sync(ctx, tbl, nil, true)
	})
	if err != nil {
		t.Fatal(err)
	}
	if b := d.Stats().Backend; b != BackendNFT {
		t.Errorf("detected backend %q in an empty namespace, want nft", b)
	}
	got, err := tp.Spread(tp.ClientNS(), "10.96.0.10:80", 30, dialTimeout)
	if err != nil || len(got) != 2 {
		t.Fatalf("Spread: %v, %v", got, err)
	}
	out, err := tp.Exec(tp.NodeNS(), "iptables-nft", "-t", "nat", "-S", "PREROUTING")
	if err != nil || !strings.Contains(string(out), "-j PP-SERVICES") {
		t.Fatalf("go-iptables did not install the PREROUTING jump: %s %v", out, err)
	}
}

// TestKernelDetectsLegacy checks detection on a node whose rules are in
// legacy iptables.
func TestKernelDetectsLegacy(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Skip("iptables-legacy not installed")
	}
	tp := nstest.New(t, nstest.Options{Pods: 1})
	for _, args := range [][]string{
		{"-w", "5", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"},
		{"-w", "5", "-A", "FORWARD", "-p", "tcp", "--dport", "23", "-j", "ACCEPT"},
	} {
		if out, err := tp.Exec(tp.NodeNS(), "iptables-legacy", args...); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
	}
	d, err := New(kernelConfig(tp, IPv4, BackendAuto))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Sync(ctx, newTable(t, kernelNode()), nil, true); err != nil {
		t.Fatal(err)
	}
	if b := d.Stats().Backend; b != BackendLegacy {
		t.Fatalf("detected %q, want legacy (the node's rules are legacy)", b)
	}
}

// TestKernelRestoreError checks that a rule the kernel refuses comes back
// as a RestoreError naming the Service, with nothing changed.
func TestKernelRestoreError(t *testing.T) {
	nstest.RequireRoot(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	d, err := New(kernelConfig(tp, IPv4, BackendNFT))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	good := svc("ns", "good", "10.96.0.10")
	good.Ports = []*pb.ServicePort{port("", tcp, 80, 0, true)}
	good.ClusterEndpoints = []*pb.PortEndpoints{eps("", podEP(tp, 0, 8080))}
	if err := d.Sync(ctx, newTable(t, kernelNode(), good), nil, true); err != nil {
		t.Fatal(err)
	}
	bad := svc("ns", "bad", "10.96.0.11")
	bad.Ports = []*pb.ServicePort{port("", tcp, 80, 0, true)}
	bad.ClusterEndpoints = []*pb.PortEndpoints{eps("", podEP(tp, 0, 8080))}
	tbl := newTable(t, kernelNode(), good, bad)
	// Corrupt the entry after validation, as a renderer bug would: a
	// DNAT port iptables-restore refuses.
	tbl.Entries["ns/bad"].Service.ClusterEndpoints[0].Endpoints[0].Port = 99999
	err = d.Sync(ctx, tbl, []string{"ns/bad"}, false)
	var re *RestoreError
	if !errors.As(err, &re) {
		t.Fatalf("Sync error = %v, want a RestoreError", err)
	}
	t.Logf("error: %v", err)
	if re.Line == 0 || re.Key != "ns/bad" {
		t.Errorf("RestoreError line %d key %q, want a line of ns/bad", re.Line, re.Key)
	}
	out, err := tp.Exec(tp.NodeNS(), "iptables-nft-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "10.96.0.11") || !strings.Contains(string(out), "10.96.0.10") {
		t.Errorf("failed sync changed the nat table:\n%s", out)
	}
}

// TestKernelLargeInput loads a table large enough for the nft input's
// "-S" speed-up and checks every chain arrived, on each backend.
func TestKernelLargeInput(t *testing.T) {
	nstest.RequireRoot(t)
	for _, backend := range backends(t) {
		t.Run(string(backend), func(t *testing.T) {
			tp := nstest.New(t, nstest.Options{Pods: 1})
			d, err := New(kernelConfig(tp, IPv4, backend))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := d.Sync(ctx, newTable(t, kernelNode(), scaleServices(300, 3)...), nil, true); err != nil {
				t.Fatal(err)
			}
			out, err := tp.Exec(tp.NodeNS(), binaryNames(IPv4, backend).save, "-t", "nat")
			if err != nil {
				t.Fatal(err)
			}
			chains, rules := scanSave(out)
			seps := 0
			for _, c := range chains {
				if strings.HasPrefix(c, prefixSep) {
					seps++
				}
			}
			if seps != 900 || rules < 300*8 {
				t.Fatalf("nat holds %d endpoint chains and %d rules, want 900 and at least %d", seps, rules, 300*8)
			}
		})
	}
}
