package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/nftables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// TestKernelRogueServiceCIDRs is issue 21, row 4, on the real kernel in
// nftables mode: a rogue replica sends service CIDRs holding the control
// plane's address, whose drop rule would cut the node off for good. The
// agent NACKs them, and the node still reaches the control plane (the
// client namespace stands in for it, on 9640) and the Service in force.
func TestKernelRogueServiceCIDRs(t *testing.T) {
	nstest.RequireRoot(t)
	topo := nstest.New(t, nstest.Options{})
	topo.ServeTCP(0, 8080)
	topo.ServeTCP(1, 8080)
	topo.ServeTCPIn(topo.ClientNS(), "", 9640)
	controlPlane := netip.AddrPortFrom(topo.ClientIP(), 9640)

	cfg := nftables.DefaultConfig(dataplane.IPv4)
	cfg.LocalMode, cfg.ClusterCIDRs = dataplane.LocalClusterCIDR, []string{"10.244.0.0/16"}
	cfg.NetNS = filepath.Join("/run/netns", topo.NodeNS())
	dp, err := nftables.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	c, _, err := cache.Open(filepath.Join(t.TempDir(), "table.db"), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	a := agent.New(agent.Config{
		SyncPeriod: time.Hour, RetryMin: 100 * time.Millisecond, RetryMax: time.Second,
		Policy: &proxytable.Policy{ControlPlanes: []netip.AddrPort{controlPlane}},
	}, dp, c, nil, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	web := webService(topo, 0, 0, 1)
	snapshot := func(cidrs ...string) *pb.SyncResponse {
		n := &pb.NodeInfo{Name: "node-1", ServiceCidrs: cidrs}
		if n.Hash, err = tablehash.Node(n); err != nil {
			t.Fatal(err)
		}
		return &pb.SyncResponse{Nonce: "n", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
			Version: fmt.Sprintf("%016x", n.GetHash()+web.GetHash()), Node: n, Entries: []*pb.ServiceEntry{web},
		}}}
	}
	dialsControlPlane := func(what string) {
		t.Helper()
		r, err := topo.DialTCP(topo.NodeNS(), controlPlane.String(), 2*time.Second)
		if err != nil || r.Backend != "client" {
			t.Fatalf("%s: the node does not reach the control plane at %s: %+v, %v", what, controlPlane, r, err)
		}
	}

	if _, err := a.Apply(ctx, snapshot("10.96.0.0/24"), false); err != nil {
		t.Fatalf("the honest table: %v", err)
	}
	good := a.Held().Version
	reaches(t, topo, "the honest table")
	dialsControlPlane("the honest table")

	for _, cidrs := range [][]string{{"0.0.0.0/0"}, {"10.96.0.0/24", "192.168.100.0/24"}} {
		if _, err := a.Apply(ctx, snapshot(cidrs...), false); !errors.Is(err, proxytable.ErrInvalidTable) {
			t.Errorf("service CIDRs %v: %v, want a NACK", cidrs, err)
		}
		if v := a.Held().Version; v != good {
			t.Errorf("service CIDRs %v: holds %s, want the last good %s", cidrs, v, good)
		}
		dialsControlPlane(fmt.Sprintf("after service CIDRs %v", cidrs))
		reaches(t, topo, fmt.Sprintf("after service CIDRs %v", cidrs))
	}
}
