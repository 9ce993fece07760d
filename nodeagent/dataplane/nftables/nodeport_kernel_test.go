package nftables

import (
	"context"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// TestKernelNodePortPrimary proves nodePortAddresses "primary", upstream's
// default in nftables mode, with real connections: a NodePort answers on
// the node's primary IP, which the table's NodeInfo carries, and not on a
// secondary address of the same node; it follows the NodeInfo when the
// primary IP changes, and opens on every address when the Node has none,
// as upstream does.
func TestKernelNodePortPrimary(t *testing.T) {
	requireKernel(t)
	tp := dptest.KernelTopology(t)
	node, cl := tp.NodeNS(), tp.ClientNS()
	// A second address of the node, which the client routes via the node
	// (nstest's external range): what an internal or secondary interface
	// would hold.
	secondary := tp.Node(0).ExternalIP(29)
	if out, err := tp.Exec(node, "ip", "addr", "add", secondary.String()+"/32", "dev", nstest.NodeExternalLink); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	primary := nstest.HostPort(tp.NodeIP(), 30080)
	other := nstest.HostPort(secondary, 30080)

	cfg := kernelConfig(tp, dataplane.IPv4)
	cfg.NodeIPs = nil // the primary IP comes from the table, as from the Node
	cfg.NodePortPrimary = true
	d, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	np := dptest.KernelServices(tp)["np"]
	sync := func(nodeIPs ...string) {
		t.Helper()
		n := dptest.KernelNode()
		n.NodeIps = nodeIPs
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Full each time, as the agent's Driver makes a sync whose
		// NodeInfo moved the NodePort addresses.
		if err := d.Sync(ctx, dptest.Table(t, n, np), nil, true); err != nil {
			t.Fatalf("Sync with node IPs %v: %v", nodeIPs, err)
		}
	}
	both := []string{"pod-0", "pod-1"}
	// Nothing listens on the node's own port 30080: an address without
	// the NodePort refuses.
	notServed := func(addr string) {
		t.Helper()
		if r, err := tp.DialTCP(cl, addr, dptest.DialTimeout); !nstest.IsRefused(err) {
			t.Errorf("NodePort on %s: %+v, %v; want refused by the node itself", addr, r, err)
		}
	}

	t.Run("primary only", func(t *testing.T) {
		sync(tp.NodeIP().String(), tp.NodeIPv6().String())
		dptest.SpreadOver(t, tp, cl, primary, 20, both...)
		notServed(other)
		// The node's own connections follow the same rule.
		dptest.SpreadOver(t, tp, node, primary, 10, both...)
		if r, err := tp.DialTCP(node, other, dptest.DialTimeout); !nstest.IsRefused(err) {
			t.Errorf("NodePort on %s from the node: %+v, %v; want refused", other, r, err)
		}
	})
	t.Run("follows the Node's primary IP", func(t *testing.T) {
		sync(secondary.String())
		dptest.SpreadOver(t, tp, cl, other, 20, both...)
		notServed(primary)
	})
	t.Run("no primary IP: every address, as upstream", func(t *testing.T) {
		sync()
		dptest.SpreadOver(t, tp, cl, primary, 20, both...)
		dptest.SpreadOver(t, tp, cl, other, 20, both...)
	})
}
