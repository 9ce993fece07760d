package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
)

// bigSnapshot is a table of n ClusterIP+NodePort Services with 3
// endpoints each, as the control plane would send it.
func bigSnapshot(n int) *pb.SyncResponse {
	entries := make([]*pb.ServiceEntry, n)
	sum := node.GetHash()
	for i := range n {
		var eps []*pb.Endpoint
		for j := range 3 {
			eps = append(eps, &pb.Endpoint{Ip: fmt.Sprintf("10.%d.%d.%d", 128+j, i/250, i%250+1), Port: 8080, Ready: true, Serving: true})
		}
		name := fmt.Sprintf("svc-%05d", i)
		entries[i] = &pb.ServiceEntry{Key: "default/" + name, Hash: uint64(i)*2654435761 + 1, Service: &pb.Service{
			Namespace: "default", Name: name, Type: pb.ServiceType_SERVICE_TYPE_NODE_PORT,
			ClusterIps:            []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER, InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
			Ports:            []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, NodePort: int32(30000 + i%2000), HasEndpoints: true}},
			ClusterEndpoints: []*pb.PortEndpoints{{PortName: "http", Endpoints: eps}},
		}}
		sum += entries[i].Hash
	}
	return &pb.SyncResponse{Nonce: "1", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{
		Version: fmt.Sprintf("%016x", sum), Node: node, Entries: entries,
	}}}
}

// procStatus reads a size field (VmRSS, VmHWM) of this process.
func procStatus(b *testing.B, field string) uint64 {
	b.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// BenchmarkAgentMemory applies a 10,000-service snapshot through the real
// path (validation, bbolt cache, iptables-restore in a namespace) and
// reports the agent's memory while it holds that table: the live heap, the
// resident set once freed memory is returned to the OS (steady state), and
// the process's peak resident set. RSS is the whole test process's (the
// test's own copy of the snapshot included), so it is an upper bound for
// the agent binary.
func BenchmarkAgentMemory(b *testing.B) {
	nstest.RequireRoot(b)
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			topo := nstest.New(b, nstest.Options{})
			resp := bigSnapshot(n)
			for range b.N {
				c, _, err := cache.Open(filepath.Join(b.TempDir(), "table.db"), slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				cfg := iptables.DefaultConfig(dataplane.IPv4)
				cfg.CommandPrefix = []string{"ip", "netns", "exec", topo.NodeNS()}
				dp, err := iptables.New(cfg, nil)
				if err != nil {
					b.Fatal(err)
				}
				a := agent.New(agent.Config{SyncPeriod: time.Hour, RetryMin: time.Second, RetryMax: time.Second}, dp, c, nil, slog.New(slog.DiscardHandler))
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); _ = a.Run(ctx) }()
				start := time.Now()
				if _, err := a.Apply(ctx, resp, false); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(time.Since(start).Seconds(), "s/apply")
				debug.FreeOSMemory()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "MiB-heap")
				b.ReportMetric(float64(procStatus(b, "VmRSS"))/(1<<20), "MiB-rss")
				b.ReportMetric(float64(procStatus(b, "VmHWM"))/(1<<20), "MiB-peak-rss")
				cancel()
				<-done
				_ = c.Close()
			}
			runtime.KeepAlive(resp)
		})
	}
}
