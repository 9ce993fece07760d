package iptables

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// The real-kernel tests program a node namespace built by nstest and prove
// the rules with real TCP and UDP from the client, node and pod
// namespaces. They need root and skip without it (CI runs as root).

// kernelConfig programs tp's node namespace with backend.
func kernelConfig(tp *nstest.Topology, family dataplane.Family, backend xtables.Backend) Config {
	c := DefaultConfig(family)
	c.Backend = backend
	c.LocalMode = dataplane.LocalClusterCIDR
	c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
	c.NodeIPs = []string{tp.NodeIP().String(), tp.NodeIPv6().String()}
	c.CommandPrefix = []string{"ip", "netns", "exec", tp.NodeNS()}
	return c
}

// backends lists the backends whose tools are installed.
func backends(t *testing.T) []xtables.Backend {
	t.Helper()
	var out []xtables.Backend
	for _, b := range []xtables.Backend{xtables.BackendNFT, xtables.BackendLegacy} {
		if _, err := exec.LookPath(xtables.BinariesOf(dataplane.IPv4, b).Restore); err == nil {
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

// TestKernel programs a node namespace with each installed backend,
// proves the rules with real connections (dptest.CheckKernelServices),
// then changes them through partial and full syncs.
func TestKernel(t *testing.T) {
	nstest.RequireRoot(t)
	for _, backend := range backends(t) {
		t.Run(string(backend), func(t *testing.T) { testKernel(t, backend) })
	}
}

func testKernel(t *testing.T, backend xtables.Backend) {
	t.Helper()
	tp := dptest.KernelTopology(t)
	var last dataplane.SyncResult
	d, err := New(kernelConfig(tp, dataplane.IPv4, backend), func(r dataplane.SyncResult) { last = r })
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewDriver(t, d)
	services := dptest.KernelServices(tp)
	k.Sync(true, dptest.Sorted(services)...)
	dptest.CheckKernelServices(t, tp, k, services)

	node, cl := tp.NodeNS(), tp.ClientNS()
	both := []string{"pod-0", "pod-1"}
	t.Run("partial sync removes an endpoint", func(t *testing.T) {
		web := proto.CloneOf(services["web"])
		web.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.PodEP(tp, 0, 8080)), dptest.Eps("dns", dptest.PodEP(tp, 0, 5353))}
		services["web"] = web
		k.Sync(false, dptest.Sorted(services)...)
		if last.Full {
			t.Fatalf("sync was not partial: %+v", last)
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
		if last.Full {
			t.Fatalf("sync was not partial: %+v", last)
		}
		dptest.SpreadOver(t, tp, cl, "10.96.0.90:80", 10, "pod-1")
		out, err := tp.Exec(node, xtables.BinariesOf(dataplane.IPv4, backend).Save, "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "10.96.0.60") || strings.Contains(string(out), portHash("ns/sticky:http", "tcp")) {
			t.Errorf("removed service's dispatch rule or chains survive:\n%s", out)
		}
		if _, err := tp.DialTCP(cl, "10.96.0.30:80", dptest.DropTimeout); nstest.IsRefused(err) {
			t.Errorf("removed service still rejected: its filter rules survived")
		}
		// Other services unaffected.
		dptest.SpreadOver(t, tp, cl, nstest.HostPort(tp.NodeIP(), 30080), 20, both...)
	})
	t.Run("full sync prunes stale chains", func(t *testing.T) {
		k.Sync(true, services["web"], services["added"])
		out, err := tp.Exec(node, xtables.BinariesOf(dataplane.IPv4, backend).Save, "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		chains, _ := xtables.ScanSave(out)
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
		dptest.SpreadOver(t, tp, cl, "10.96.0.90:80", 5, "pod-1")
	})
	t.Run("full sync repairs flushed jumps", func(t *testing.T) {
		ipt := xtables.BinariesOf(dataplane.IPv4, backend).IPTables
		for _, chain := range []string{"PREROUTING", "OUTPUT"} {
			if out, err := tp.Exec(node, ipt, "-w", "5", "-t", "nat", "-F", chain); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
		}
		if _, err := tp.DialTCP(cl, "10.96.0.90:80", dptest.DropTimeout); err == nil {
			t.Fatalf("service still answers with PREROUTING flushed")
		}
		k.Sync(true, services["web"], services["added"])
		dptest.SpreadOver(t, tp, cl, "10.96.0.90:80", 5, "pod-1")
		dptest.SpreadOver(t, tp, node, "10.96.0.90:80", 5, "pod-1")
	})
	t.Run("full sync repairs chains deleted by hand", func(t *testing.T) {
		// Another program (or an operator) empties the dispatch chain and
		// deletes a service's chain: the next periodic full sync restores
		// both, without the agent restarting.
		ipt := xtables.BinariesOf(dataplane.IPv4, backend).IPTables
		svc := prefixSvc + portHash("ns/added:http", "tcp")
		for _, args := range [][]string{{"-F", chainServices}, {"-F", svc}, {"-X", svc}} {
			if out, err := tp.Exec(node, ipt, append([]string{"-w", "5", "-t", "nat"}, args...)...); err != nil {
				t.Fatalf("%s %v: %v: %s", ipt, args, err, out)
			}
		}
		if r, err := tp.DialTCP(cl, "10.96.0.90:80", dptest.DropTimeout); err == nil {
			t.Fatalf("service still answers (%+v) with its chains gone", r)
		}
		k.Sync(true, services["web"], services["added"])
		if last.Err != nil || !last.Full {
			t.Fatalf("repairing sync: %+v", last)
		}
		dptest.SpreadOver(t, tp, cl, "10.96.0.90:80", 5, "pod-1")
		dptest.SpreadOver(t, tp, cl, "10.96.0.10:80", 5, "pod-0")
	})

	t.Run("IPv6", func(t *testing.T) {
		d6, err := New(kernelConfig(tp, dataplane.IPv6, backend), nil)
		if err != nil {
			t.Fatal(err)
		}
		k6 := dptest.NewDriver(t, d6)
		k6.Sync(true, dptest.KernelServices(tp)["dual"])
		dptest.SpreadOver(t, tp, cl, "[fd00:96::100]:80", 40, both...)
		dptest.SpreadOver(t, tp, node, "[fd00:96::100]:80", 40, both...)
	})

	t.Run("cleanup removes every chain and jump, then a sync restores them", func(t *testing.T) {
		ctx := context.Background()
		for range 2 { // idempotent
			if err := d.Cleanup(ctx); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
		}
		for _, table := range []string{"nat", "filter"} {
			out, err := tp.Exec(node, xtables.BinariesOf(dataplane.IPv4, backend).Save, "-t", table)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(out), "PP-") {
				t.Errorf("%s still holds proxyplane's rules after cleanup:\n%s", table, out)
			}
		}
		if r, err := tp.DialTCP(cl, "10.96.0.90:80", dptest.DropTimeout); err == nil {
			t.Fatalf("service answers (%+v) after cleanup", r)
		}
		k.Sync(false, services["web"], services["added"])
		if !last.Full {
			t.Errorf("the sync after a cleanup was partial: %+v", last)
		}
		dptest.SpreadOver(t, tp, cl, "10.96.0.90:80", 5, "pod-1")
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
	cfg := kernelConfig(tp, dataplane.IPv4, xtables.BackendAuto)
	cfg.CommandPrefix = nil
	s := dptest.KernelServices(tp)
	tbl := dptest.Table(t, dptest.KernelNode(), s["web"], s["np"])
	var d *Dataplane
	err := tp.Do(tp.NodeNS(), func() error {
		var err error
		if d, err = New(cfg, nil); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return d.Sync(ctx, tbl, nil, true)
	})
	if err != nil {
		t.Fatal(err)
	}
	if b := d.b.tools.Backend(); b != xtables.BackendNFT {
		t.Errorf("detected backend %q in an empty namespace, want nft", b)
	}
	got, err := tp.Spread(tp.ClientNS(), "10.96.0.10:80", 30, dptest.DialTimeout)
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
	d, err := New(kernelConfig(tp, dataplane.IPv4, xtables.BackendAuto), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Sync(ctx, dptest.Table(t, dptest.KernelNode()), nil, true); err != nil {
		t.Fatal(err)
	}
	if b := d.b.tools.Backend(); b != xtables.BackendLegacy {
		t.Fatalf("detected %q, want legacy (the node's rules are legacy)", b)
	}
}

// TestKernelRestoreError checks that a rule the kernel refuses comes back
// as a RestoreError naming the Service, with nothing changed.
func TestKernelRestoreError(t *testing.T) {
	nstest.RequireRoot(t)
	tp := nstest.New(t, nstest.Options{Pods: 1})
	d, err := New(kernelConfig(tp, dataplane.IPv4, xtables.BackendNFT), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	good := dptest.Svc("ns", "good", "10.96.0.10")
	good.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	good.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", dptest.PodEP(tp, 0, 8080))}
	if err := d.Sync(ctx, dptest.Table(t, dptest.KernelNode(), good), nil, true); err != nil {
		t.Fatal(err)
	}
	bad := dptest.Svc("ns", "bad", "10.96.0.11")
	bad.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	bad.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", dptest.PodEP(tp, 0, 8080))}
	tbl := dptest.Table(t, dptest.KernelNode(), good, bad)
	// Corrupt the entry after validation, as a renderer bug would: a
	// DNAT port iptables-restore refuses.
	tbl.Entries["ns/bad"].Service.ClusterEndpoints[0].Endpoints[0].Port = 99999
	err = d.Sync(ctx, tbl, []string{"ns/bad"}, false)
	var re *xtables.RestoreError
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
			d, err := New(kernelConfig(tp, dataplane.IPv4, backend), nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := d.Sync(ctx, dptest.Table(t, dptest.KernelNode(), dptest.ScaleServices(300, 3)...), nil, true); err != nil {
				t.Fatal(err)
			}
			out, err := tp.Exec(tp.NodeNS(), xtables.BinariesOf(dataplane.IPv4, backend).Save, "-t", "nat")
			if err != nil {
				t.Fatal(err)
			}
			chains, rules := xtables.ScanSave(out)
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
