package iptables

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// TestKernelLocalhostNodePorts proves localhost NodePorts with real
// connections in a node namespace: off, 127.0.0.1:<nodePort> is refused;
// on, the Dataplane sets route_localnet and the node reaches a backend
// through it; and the anti-martian rule drops a client's connection to a
// service the node keeps on 127.0.0.2, which route_localnet would
// otherwise let in (checked by flushing the rule by hand).
func TestKernelLocalhostNodePorts(t *testing.T) {
	nstest.RequireRoot(t)
	tp := dptest.KernelTopology(t)
	node, cl := tp.NodeNS(), tp.ClientNS()
	np := dptest.KernelServices(tp)["np"]
	tbl := dptest.Table(t, dptest.KernelNode(), np)
	sync := func(on bool) {
		t.Helper()
		cfg := kernelConfig(tp, dataplane.IPv4, xtables.BackendNFT)
		cfg.LocalhostNodePorts = on
		d, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Sync(ctx, tbl, nil, true); err != nil {
			t.Fatalf("Sync(localhostNodePorts=%v): %v", on, err)
		}
	}
	routeLocalnet := func() string {
		t.Helper()
		out, err := tp.Exec(node, "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
		if err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		return strings.TrimSpace(string(out))
	}

	// nstest turns route_localnet on everywhere in the node, for the
	// shared kernel tests: turn it off, so that the Dataplane's own write
	// is what this test sees.
	if out, err := tp.Exec(node, "sh", "-c", "for f in /proc/sys/net/ipv4/conf/*/route_localnet; do echo 0 > $f; done"); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	sync(false)
	if got := routeLocalnet(); got != "0" {
		t.Fatalf("route_localnet = %s with localhost NodePorts off, want 0 (untouched)", got)
	}
	if _, err := tp.DialTCP(node, "127.0.0.1:30080", dptest.DialTimeout); !nstest.IsRefused(err) {
		t.Errorf("off: node to 127.0.0.1:30080: %v, want refused", err)
	}

	sync(true)
	if got := routeLocalnet(); got != "1" {
		t.Errorf("route_localnet = %s with localhost NodePorts on, want 1", got)
	}
	for _, addr := range []string{"127.0.0.1:30080", "127.0.0.2:30080"} {
		if r, err := tp.DialTCP(node, addr, dptest.DialTimeout); err != nil || (r.Backend != "pod-0" && r.Backend != "pod-1") {
			t.Errorf("on: node to %s: %+v, %v; want a pod", addr, r, err)
		}
	}

	// The client sends to 127.0.0.2 through the node, as an attacker on
	// the node's LAN can once route_localnet is 1 (kubernetes#90259).
	tp.ServeTCPIn(node, "127.0.0.2", 9001)
	for _, args := range [][]string{
		{"sysctl", "-q", "-w", "net.ipv4.conf.all.route_localnet=1"},
		{"ip", "route", "add", "127.0.0.2/32", "via", tp.NodeIP().String(), "dev", nstest.PodLink},
	} {
		if out, err := tp.Exec(cl, args[0], args[1:]...); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
	}
	if _, err := tp.DialTCP(cl, "127.0.0.2:9001", dptest.DropTimeout); err == nil || nstest.IsRefused(err) {
		t.Errorf("client to the node's 127.0.0.2:9001: %v, want dropped (a timeout)", err)
	}
	if out, err := tp.Exec(node, "iptables-nft", "-F", chainLocalnet); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if r, err := tp.DialTCP(cl, "127.0.0.2:9001", dptest.DialTimeout); err != nil || r.Backend != "node-0" {
		t.Errorf("without the anti-martian rule, client to 127.0.0.2:9001: %+v, %v; want the node's server (else the test proves nothing)", r, err)
	}
}
