package nftables

import (
	"context"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// TestKernelServiceCIDRs proves the service-CIDR drop with real packets.
// The node routes 10.96.0.0/16 out of its LAN link, where the client
// answers for two addresses: 10.96.0.77, inside the table's service CIDR
// 10.96.0.0/24 but no ClusterIP, and 10.96.7.7, outside it. Without the
// CIDR both connect to the client (the traffic leaves the node); with it
// the first is dropped on the node, from a pod and from the node itself,
// the second still connects, and a ClusterIP still works.
func TestKernelServiceCIDRs(t *testing.T) {
	requireKernel(t)
	tp := dptest.KernelTopology(t)
	node, cl, pod0 := tp.NodeNS(), tp.ClientNS(), tp.PodNS(0)
	const unallocated, outside = "10.96.0.77", "10.96.7.7"
	for _, a := range []string{unallocated, outside} {
		if out, err := tp.Exec(cl, "ip", "addr", "add", a+"/32", "dev", nstest.PodLink); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
	}
	tp.ServeTCPIn(cl, "", 9000)

	d, err := New(kernelConfig(tp, dataplane.IPv4), nil)
	if err != nil {
		t.Fatal(err)
	}
	web := dptest.KernelServices(tp)["web"]
	sync := func(cidrs ...string) {
		t.Helper()
		n := dptest.KernelNode()
		n.ServiceCidrs = cidrs
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Sync(ctx, dptest.Table(t, n, web), nil, true); err != nil {
			t.Fatalf("Sync: %v", err)
		}
	}
	reaches := func(ns, addr string) bool {
		r, err := tp.DialTCP(ns, addr, dptest.DropTimeout)
		return err == nil && r.Backend == "client"
	}

	sync()
	for _, ns := range []string{pod0, node} {
		if !reaches(ns, unallocated+":9000") {
			t.Fatalf("without service CIDRs, %s does not reach %s: the test cannot tell a drop", tp.ClientNS(), unallocated)
		}
	}

	sync("10.96.0.0/24", "fd00:96::/112")
	for _, ns := range []string{pod0, node} {
		if _, err := tp.DialTCP(ns, unallocated+":9000", dptest.DropTimeout); err == nil || nstest.IsRefused(err) {
			t.Errorf("from %s to unallocated %s: %v, want dropped (a timeout)", ns, unallocated, err)
		}
		if !reaches(ns, outside+":9000") {
			t.Errorf("from %s to %s, outside the service CIDRs: not reached, want untouched", ns, outside)
		}
		if r, err := tp.DialTCP(ns, "10.96.0.10:80", dptest.DialTimeout); err != nil || (r.Backend != "pod-0" && r.Backend != "pod-1") {
			t.Errorf("from %s to the ClusterIP: %+v, %v; want a pod", ns, r, err)
		}
		if _, err := tp.DialTCP(ns, "10.96.0.10:81", dptest.DialTimeout); !nstest.IsRefused(err) {
			t.Errorf("from %s to the ClusterIP's unknown port: %v, want refused", ns, err)
		}
	}
}
