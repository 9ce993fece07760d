package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// The attacks of a rogue control plane replica (issue 21, rows 4 and 7):
// each table must be NACKed, nothing of it saved or programmed, and the
// last good table stay in force.

// controlPlane is the address the agent under attack dials; nodeAddr is
// its node's own.
var (
	controlPlane = netip.MustParseAddrPort("192.0.2.10:9640")
	nodeAddr     = netip.MustParseAddr("192.0.2.20")
)

func testPolicy() *proxytable.Policy {
	return &proxytable.Policy{
		ControlPlanes: []netip.AddrPort{controlPlane},
		NodeAddresses: func() ([]netip.Addr, error) { return []netip.Addr{nodeAddr}, nil },
	}
}

// honestNode is a node whose hash is its content's, as a control plane
// sends it; edit changes it first.
func honestNode(t *testing.T, edit func(*pb.NodeInfo)) *pb.NodeInfo {
	t.Helper()
	n := &pb.NodeInfo{Name: "node-1", ServiceCidrs: []string{"10.96.0.0/16"}}
	if edit != nil {
		edit(n)
	}
	h, err := tablehash.Node(n)
	if err != nil {
		t.Fatal(err)
	}
	n.Hash = h
	return n
}

// honestEntry is a NodePort Service whose hash is its content's; edit
// changes it first.
func honestEntry(t *testing.T, name string, edit func(*pb.Service)) *pb.ServiceEntry {
	t.Helper()
	s := &pb.Service{
		Namespace: "default", Name: name, Type: pb.ServiceType_SERVICE_TYPE_NODE_PORT, ClusterIps: []string{"10.96.0.10"},
		Ports:            []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, NodePort: 30080, HasEndpoints: true}},
		ClusterEndpoints: []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{{Ip: "10.244.1.5", Port: 8080, Ready: true, Serving: true}}}},
	}
	if edit != nil {
		edit(s)
	}
	key := "default/" + name
	h, err := tablehash.Entry(key, s)
	if err != nil {
		t.Fatal(err)
	}
	return &pb.ServiceEntry{Key: key, Hash: h, Service: s}
}

func honestSnapshot(n *pb.NodeInfo, entries ...*pb.ServiceEntry) *pb.SyncResponse {
	return &pb.SyncResponse{Nonce: "n", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: version(n, entries...), Node: n, Entries: entries,
	}}}
}

func newPolicyAgent(r *recorder, cached *proxytable.Table) *Agent {
	return New(Config{
		SyncPeriod: time.Hour, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond,
		Families: []dataplane.Family{dataplane.IPv4}, Policy: testPolicy(),
	}, r, r, cached, slog.New(slog.DiscardHandler))
}

func TestRogueTablesAreRefused(t *testing.T) {
	r := newRecorder()
	a := newPolicyAgent(r, nil)
	run(t, a)
	ctx := context.Background()
	good := honestSnapshot(honestNode(t, nil), honestEntry(t, "web", nil))
	if _, err := a.Apply(ctx, good, false); err != nil {
		t.Fatalf("the honest table was refused: %v", err)
	}
	goodVersion := a.Held().Version

	forged := honestEntry(t, "web", nil)
	forged.Service.ClusterEndpoints[0].Endpoints[0].Ip = "203.0.113.66" // the honest hash, kept
	for _, tc := range []struct {
		name      string
		resp      *pb.SyncResponse
		wantEntry string // the entry the NACK pins, "" for a table error
		want      string
	}{
		{"service CIDR of the whole Internet", honestSnapshot(honestNode(t, func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"0.0.0.0/0"} }), honestEntry(t, "web", nil)), "", "0.0.0.0/0"},
		{"service CIDR holding the control plane", honestSnapshot(honestNode(t, func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"192.0.2.0/24"} }), honestEntry(t, "web", nil)), "", "control plane"},
		{"external IP on the control plane address", honestSnapshot(honestNode(t, nil), honestEntry(t, "web", func(s *pb.Service) {
			s.ExternalIps = []string{controlPlane.Addr().String()}
			s.Ports[0].Port = int32(controlPlane.Port())
		})), "default/web", "control plane"},
		{"load balancer IP on the control plane address", honestSnapshot(honestNode(t, nil), honestEntry(t, "web", func(s *pb.Service) {
			s.LoadBalancerIps = []string{controlPlane.Addr().String()}
			s.Ports[0].Port = int32(controlPlane.Port())
		})), "default/web", "control plane"},
		{"cluster IP on the control plane address", honestSnapshot(honestNode(t, nil), honestEntry(t, "web", func(s *pb.Service) {
			s.ClusterIps = []string{controlPlane.Addr().String()}
		})), "default/web", "control plane"},
		{"nodePort 22", honestSnapshot(honestNode(t, nil), honestEntry(t, "web", func(s *pb.Service) { s.Ports[0].NodePort = 22 })), "default/web", "node port range"},
		{"healthCheckNodePort 2379", honestSnapshot(honestNode(t, nil), honestEntry(t, "web", func(s *pb.Service) { s.HealthCheckNodePort = 2379 })), "default/web", "node port range"},
		{"external IP on the node's ssh port", honestSnapshot(honestNode(t, nil), honestEntry(t, "web", func(s *pb.Service) {
			s.ExternalIps = []string{nodeAddr.String()}
			s.Ports[0].Port = 22
		})), "default/web", "address of the node"},
		{"forged entry under the honest hash", honestSnapshot(honestNode(t, nil), forged), "default/web", "content"},
		{"forged entry in a delta", &pb.SyncResponse{Nonce: "d", Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{
			BaseVersion: goodVersion, Version: goodVersion, Upserts: []*pb.ServiceEntry{forged},
		}}}, "default/web", "content"},
		{"forged node under the honest hash", func() *pb.SyncResponse {
			resp := honestSnapshot(honestNode(t, nil), honestEntry(t, "web", nil))
			n := proto.CloneOf(resp.GetSnapshot().GetNode())
			n.PodCidrs = []string{"0.0.0.0/1"}
			resp.GetSnapshot().Node = n
			return resp
		}(), "", "node info hash"},
	} {
		// Hashes the client computed or checked from the bytes of a
		// snapshot (hashesKnown) are not recomputed, but the policy is
		// still applied to it, and a delta's hashes always are.
		forgedSnapshot := tc.resp.GetSnapshot() != nil && (tc.want == "content" || tc.want == "node info hash")
		for _, known := range []bool{false, true} {
			if known && forgedSnapshot {
				continue
			}
			t.Run(fmt.Sprintf("%s/hashes known %v", tc.name, known), func(t *testing.T) {
				before := len(r.log())
				_, err := a.Apply(ctx, tc.resp, known)
				if !errors.Is(err, proxytable.ErrInvalidTable) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Apply = %v, want an ErrInvalidTable NACK mentioning %q", err, tc.want)
				}
				if tc.wantEntry != "" {
					if ee := proxytable.EntryErrors(err); len(ee) != 1 || ee[0].GetKey() != tc.wantEntry {
						t.Errorf("NACK entry errors %v, want one for %s", ee, tc.wantEntry)
					}
				}
				if calls := r.log()[before:]; len(calls) > 0 {
					t.Errorf("the refused table was saved or programmed: %v", calls)
				}
				if got := a.Held().Version; got != goodVersion {
					t.Errorf("table in force %s, want the last good %s", got, goodVersion)
				}
			})
		}
	}
	// And the agent goes on taking good tables.
	next := honestSnapshot(honestNode(t, nil), honestEntry(t, "web", nil), honestEntry(t, "api", nil))
	if _, err := a.Apply(ctx, next, false); err != nil {
		t.Fatalf("a good table after the refused ones: %v", err)
	}
}

// TestCachedTableBreakingPolicy: a cache planted with a table that cuts
// the node off (or written before the policy existed) is not programmed
// at start; the agent waits for the control plane instead.
func TestCachedTableBreakingPolicy(t *testing.T) {
	bad := honestSnapshot(honestNode(t, func(n *pb.NodeInfo) { n.ServiceCidrs = []string{"192.0.2.0/24"} })).GetSnapshot()
	cached, err := proxytable.FromSnapshot(bad)
	if err != nil {
		t.Fatalf("the table is well formed, only the policy refuses it: %v", err)
	}
	r := newRecorder()
	a := newPolicyAgent(r, cached)
	run(t, a)
	select {
	case <-a.Started():
	case <-time.After(5 * time.Second):
		t.Fatal("Started never closed")
	}
	if calls := r.log(); len(calls) > 0 {
		t.Errorf("the cached table was programmed: %v", calls)
	}
	if v := a.Held().Version; v != "" {
		t.Errorf("holds %s, want nothing", v)
	}
	good := honestSnapshot(honestNode(t, nil), honestEntry(t, "web", nil))
	if _, err := a.Apply(context.Background(), good, false); err != nil {
		t.Fatalf("a good table: %v", err)
	}
	if want := fmt.Sprintf("save %s full=true changed=[]", good.GetSnapshot().GetVersion()); r.log()[0] != want {
		t.Errorf("first call %q, want %q", r.log()[0], want)
	}
}

// TestLearnedReplicasAreProtected: the replicas a table names
// (control_plane_addresses, which the agent dials) are as safe from
// capture as the configured ones, also when only a delta's node moves
// them under an entry that was accepted before.
func TestLearnedReplicasAreProtected(t *testing.T) {
	r := newRecorder()
	a := newPolicyAgent(r, nil)
	run(t, a)
	ctx := context.Background()
	web := honestEntry(t, "web", func(s *pb.Service) { s.ExternalIps = []string{"198.51.100.7"} })
	good := honestSnapshot(honestNode(t, nil), web)
	if _, err := a.Apply(ctx, good, false); err != nil {
		t.Fatalf("the honest table was refused: %v", err)
	}
	goodVersion := a.Held().Version
	learning := honestNode(t, func(n *pb.NodeInfo) { n.ControlPlaneAddresses = []string{"198.51.100.7:80"} })
	for _, tc := range []struct {
		name string
		resp *pb.SyncResponse
	}{
		{"snapshot", honestSnapshot(learning, web)},
		{"delta moving only the node", &pb.SyncResponse{Nonce: "d", Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{
			BaseVersion: goodVersion, Version: version(learning, web), Node: learning,
		}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := a.Apply(ctx, tc.resp, false)
			if !errors.Is(err, proxytable.ErrInvalidTable) || !strings.Contains(err.Error(), "control plane") {
				t.Fatalf("Apply = %v, want a NACK: external IP 198.51.100.7:80 captures a learned replica", err)
			}
			if got := a.Held().Version; got != goodVersion {
				t.Errorf("table in force %s, want the last good %s", got, goodVersion)
			}
		})
	}
}
