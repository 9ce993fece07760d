package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
	"github.com/proxyplane/proxyplane/nodeagent/client"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
)

const (
	clusterIP = "10.96.0.10"
	waitFor   = 20 * time.Second
)

// fakeControlPlane is a scripted TableService on loopback.
type fakeControlPlane struct {
	pb.UnimplementedTableServiceServer
	addr    string
	streams chan grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]
	stop    func()
}

func (f *fakeControlPlane) Sync(s grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) error {
	f.streams <- s
	<-s.Context().Done()
	return nil
}

func startControlPlane(t *testing.T) *fakeControlPlane {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeControlPlane{addr: lis.Addr().String(), streams: make(chan grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse], 4)}
	gs := grpc.NewServer()
	pb.RegisterTableServiceServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	f.stop = gs.Stop
	t.Cleanup(gs.Stop)
	return f
}

func (f *fakeControlPlane) accept(t *testing.T) grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse] {
	t.Helper()
	select {
	case s := <-f.streams:
		return s
	case <-time.After(waitFor):
		t.Fatal("the agent never connected")
		return nil
	}
}

func recv(t *testing.T, s grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) *pb.SyncRequest {
	t.Helper()
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("receiving from the agent: %v", err)
		}
		if m.GetKeepalive() == nil {
			return m
		}
	}
}

// webService is a ClusterIP Service on clusterIP:80 with the given pods'
// port 8080 as endpoints.
func webService(topo *nstest.Topology, hash uint64, pods ...int) *pb.ServiceEntry {
	var eps []*pb.Endpoint
	for _, i := range pods {
		eps = append(eps, &pb.Endpoint{Ip: topo.PodIP(i).String(), Port: 8080, Ready: true, Serving: true})
	}
	e := &pb.ServiceEntry{Key: "default/web", Hash: hash, Service: &pb.Service{
		Namespace: "default", Name: "web", Type: pb.ServiceType_SERVICE_TYPE_CLUSTER_IP,
		ClusterIps:            []string{clusterIP},
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER, InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		Ports:            []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, HasEndpoints: len(eps) > 0}},
		ClusterEndpoints: []*pb.PortEndpoints{{PortName: "http", Endpoints: eps}},
	}}
	// The agent recomputes hashes when it loads its cache: the hash
	// must be the content's (hash only labels the call).
	h, err := tablehash.Entry(e.Key, e.Service)
	if err != nil {
		panic(err)
	}
	e.Hash = h
	return e
}

// node carries its real hash, which the agent recomputes.
var node = func() *pb.NodeInfo {
	n := &pb.NodeInfo{Name: "node-1"}
	h, err := tablehash.Node(n)
	if err != nil {
		panic(err)
	}
	n.Hash = h
	return n
}()

func version(entries ...*pb.ServiceEntry) string {
	sum := node.GetHash()
	for _, e := range entries {
		sum += e.GetHash()
	}
	return fmt.Sprintf("%016x", sum)
}

// runAgent assembles an agent as the binary does, with its iptables
// dataplane programming the topology's node namespace.
func runAgent(t *testing.T, topo *nstest.Topology, cachePath, controlPlane string) (stop func()) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	c, cached, err := cache.Open(cachePath, log)
	if err != nil {
		t.Fatal(err)
	}
	cfg := iptables.DefaultConfig(dataplane.IPv4)
	cfg.CommandPrefix = []string{"ip", "netns", "exec", topo.NodeNS()}
	cfg.LocalMode, cfg.ClusterCIDRs = dataplane.LocalClusterCIDR, []string{"10.244.0.0/16"}
	dp, err := iptables.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := agent.New(agent.Config{SyncPeriod: time.Minute, RetryMin: 100 * time.Millisecond, RetryMax: time.Second}, dp, c, cached, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = a.Run(ctx); done <- struct{}{} }()
	go func() {
		_ = client.Run(ctx, client.Options{
			Addresses: []string{controlPlane}, NodeName: "node-1", Capabilities: &pb.Capabilities{Deltas: true},
			// The fake control plane serves plaintext.
			Credentials: client.Credentials{Insecure: true},
			BackoffMin:  50 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
			SilenceTimeout: time.Minute, MaxRecvMessageBytes: 4 << 20,
		}, a, log)
		done <- struct{}{}
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		<-done
		_ = c.Close()
	}
	t.Cleanup(stop)
	return stop
}

// reaches waits until a TCP dial from the client to the ClusterIP is
// answered by one of the pods.
func reaches(t *testing.T, topo *nstest.Topology, what string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		r, err := topo.DialTCP(topo.ClientNS(), clusterIP+":80", time.Second)
		if err == nil && (r.Backend == "pod-0" || r.Backend == "pod-1") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the ClusterIP is not answered by a pod: %v %v", what, r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wipeRules empties the node's tables in both iptables backends, as a
// reboot would.
func wipeRules(t *testing.T, topo *nstest.Topology) {
	t.Helper()
	for _, bin := range []string{"iptables-nft", "iptables-legacy"} {
		for _, table := range []string{"nat", "filter"} {
			_, _ = topo.Exec(topo.NodeNS(), bin, "-t", table, "-F")
			_, _ = topo.Exec(topo.NodeNS(), bin, "-t", table, "-X")
		}
	}
	if _, err := topo.DialTCP(topo.ClientNS(), clusterIP+":80", 500*time.Millisecond); err == nil {
		t.Fatal("the ClusterIP still answers after the rules were wiped")
	}
}

func TestAgentOnTheKernel(t *testing.T) {
	nstest.RequireRoot(t)
	topo := nstest.New(t, nstest.Options{})
	topo.ServeTCP(0, 8080)
	topo.ServeTCP(1, 8080)
	cachePath := filepath.Join(t.TempDir(), "table.db")

	// A control plane sends a table: it is programmed and acknowledged.
	cp := startControlPlane(t)
	stop := runAgent(t, topo, cachePath, cp.addr)
	s := cp.accept(t)
	if h := recv(t, s).GetHello(); h.GetNodeName() != "node-1" || h.GetVersion() != "" {
		t.Fatalf("first hello %v: want node-1 holding nothing", h)
	}
	web := webService(topo, 11, 0, 1)
	v1 := version(web)
	_ = s.Send(&pb.SyncResponse{Nonce: "1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: v1, Node: node, Entries: []*pb.ServiceEntry{web}}}})
	if ack := recv(t, s).GetAck(); ack.GetVersion() != v1 || ack.GetNonce() != "1" {
		t.Fatalf("want an ack of %s", v1)
	}
	reaches(t, topo, "after the first table")

	// An invalid delta is rejected and the rules in force stay.
	bad := webService(topo, 12, 0, 1)
	bad.Service.Ports[0].Port = 0
	_ = s.Send(&pb.SyncResponse{Nonce: "2", Kind: &pb.SyncResponse_Delta{Delta: &pb.Delta{
		BaseVersion: v1, Version: version(bad), Upserts: []*pb.ServiceEntry{bad},
	}}})
	if nack := recv(t, s).GetNack(); nack.GetNonce() != "2" || len(nack.GetEntryErrors()) != 1 {
		t.Fatalf("want a nack of nonce 2 naming default/web, got %v", nack)
	}
	reaches(t, topo, "after a rejected table")

	// The node loses its rules and the control plane is gone: a restarted
	// agent programs its cache before reaching any control plane.
	stop()
	cp.stop()
	wipeRules(t, topo)
	stop = runAgent(t, topo, cachePath, cp.addr)
	reaches(t, topo, "after a restart without a control plane")

	// A corrupt cache is moved aside; the rules in the kernel, which the
	// agent cannot replace, are left alone.
	stop()
	if err := os.WriteFile(cachePath, []byte("not a bbolt file"), 0o600); err != nil {
		t.Fatal(err)
	}
	runAgent(t, topo, cachePath, cp.addr)
	moved, _ := filepath.Glob(cachePath + ".corrupt-*")
	if len(moved) != 1 {
		t.Errorf("corrupt cache not moved aside: %v", moved)
	}
	reaches(t, topo, "after starting with a corrupt cache")
}
