package iptables

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// TestKernelClosedSourceRange shows on the real kernel, with the nft
// backend (which takes no lock), what the control plane sends for a
// Service whose every loadBalancerSourceRanges entry is invalid: the
// single range 0.0.0.0/32 (compute.ClosedSourceRange) admits no client to
// the load balancer IP, where upstream, left with no range, admits every
// client. The NodePort stays open, as source ranges never guard it.
func TestKernelClosedSourceRange(t *testing.T) {
	nstest.RequireRoot(t)
	tp := dptest.KernelTopology(t)
	d, err := New(kernelConfig(tp, dataplane.IPv4, xtables.BackendNFT), nil)
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewDriver(t, d)
	lb := proto.CloneOf(dptest.KernelServices(tp)["allowed"])
	cl, node := tp.ClientNS(), tp.NodeNS()
	both := []string{"pod-0", "pod-1"}
	lbAddr := nstest.HostPort(netip.MustParseAddr(lb.LoadBalancerIps[0]), 80)

	lb.LoadBalancerSourceRanges = nil
	k.Sync(true, lb)
	dptest.SpreadOver(t, tp, cl, lbAddr, 10, both...)

	lb.LoadBalancerSourceRanges = []string{"0.0.0.0/32"}
	k.Sync(true, lb)
	for _, ns := range []string{cl, node} {
		if r, err := tp.DialTCP(ns, lbAddr, dptest.DropTimeout); err == nil {
			t.Errorf("load balancer from %s answered by %s through the closed range", ns, r.Backend)
		}
	}
	dptest.SpreadOver(t, tp, cl, nstest.HostPort(tp.NodeIP(), int(lb.Ports[0].NodePort)), 10, both...)
}
