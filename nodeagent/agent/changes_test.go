package agent

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// withEndpoints returns e with one cluster endpoint at ip, and a new hash.
func withEndpoints(e *pb.ServiceEntry, hash uint64, ip string) *pb.ServiceEntry {
	c := proto.CloneOf(e)
	c.Hash = hash
	c.Service.ClusterEndpoints = []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{{Ip: ip, Port: 8080, Ready: true}}}}
	c.Service.Ports[0].HasEndpoints = true
	return c
}

func table(t *testing.T, entries ...*pb.ServiceEntry) *proxytable.Table {
	t.Helper()
	tb, err := proxytable.FromSnapshot(&pb.Snapshot{Version: version(node, entries...), Node: node, Entries: entries})
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestChanges(t *testing.T) {
	a := entry("a", 1, 80)
	aEP := withEndpoints(a, 2, "10.0.0.1")
	aEP2 := withEndpoints(a, 3, "10.0.0.2")
	aPortEP := withEndpoints(entry("a", 1, 81), 4, "10.0.0.2") // port and endpoints changed
	b := entry("b", 5, 80)
	for _, tc := range []struct {
		name      string
		cur, next []*pb.ServiceEntry
		changed   []string // nil: a snapshot
		svc, eps  int
	}{
		{"nothing", []*pb.ServiceEntry{a}, []*pb.ServiceEntry{a}, nil, 0, 0},
		{"added without endpoints", nil, []*pb.ServiceEntry{a}, []string{"default/a"}, 1, 0},
		{"added with endpoints", nil, []*pb.ServiceEntry{aEP}, []string{"default/a"}, 1, 1},
		{"removed with endpoints", []*pb.ServiceEntry{aEP}, nil, []string{"default/a"}, 1, 1},
		{"endpoints appear", []*pb.ServiceEntry{a}, []*pb.ServiceEntry{aEP}, []string{"default/a"}, 0, 1},
		{"endpoint moves", []*pb.ServiceEntry{aEP}, []*pb.ServiceEntry{aEP2}, []string{"default/a"}, 0, 1},
		{"port changes", []*pb.ServiceEntry{a}, []*pb.ServiceEntry{entry("a", 9, 81)}, []string{"default/a"}, 1, 0},
		{"port and endpoints change", []*pb.ServiceEntry{aEP}, []*pb.ServiceEntry{aPortEP}, []string{"default/a"}, 1, 1},
		{"snapshot compares every key", []*pb.ServiceEntry{aEP, b}, []*pb.ServiceEntry{aEP2}, nil, 1, 1},
		{"delta counts only its keys", []*pb.ServiceEntry{aEP, b}, []*pb.ServiceEntry{aEP2, b}, []string{"default/a"}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, eps := changes(table(t, tc.cur...), table(t, tc.next...), tc.changed)
			if svc != tc.svc || eps != tc.eps {
				t.Errorf("changes = %d services, %d endpoints; want %d, %d", svc, eps, tc.svc, tc.eps)
			}
		})
	}
}

// TestApplyCountsChanges drives a delta through the agent and reads
// kube-proxy's change metrics and the per-family programming latency back.
func TestApplyCountsChanges(t *testing.T) {
	r := newRecorder()
	a := newAgent(r, nil)
	run(t, a)
	base := entry("a", 1, 80)
	if _, err := a.Apply(context.Background(), snapshot(base), false); err != nil {
		t.Fatal(err)
	}
	svcBefore, epsBefore := testutil.ToFloat64(metrics.ServiceChangesTotal), testutil.ToFloat64(metrics.EndpointChangesTotal)
	latency := func() uint64 {
		var m dto.Metric
		if err := metrics.NetworkProgrammingDuration.WithLabelValues("IPv4").(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	latencyBefore := latency()

	moved := withEndpoints(base, 2, "10.0.0.1")
	moved.TriggerTime = timestamppb.Now()
	added := entry("b", 3, 80)
	delta := &pb.Delta{
		BaseVersion: version(node, base), Version: version(node, moved, added),
		Upserts: []*pb.ServiceEntry{moved, added},
	}
	if _, err := a.Apply(context.Background(), &pb.SyncResponse{Nonce: "2", Kind: &pb.SyncResponse_Delta{Delta: delta}}, false); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(metrics.ServiceChangesTotal) - svcBefore; got != 1 {
		t.Errorf("service_changes_total rose by %v, want 1 (b added)", got)
	}
	if got := testutil.ToFloat64(metrics.EndpointChangesTotal) - epsBefore; got != 1 {
		t.Errorf("endpoint_changes_total rose by %v, want 1 (a's endpoints)", got)
	}
	if got := testutil.ToFloat64(metrics.ServiceChangesPending) + testutil.ToFloat64(metrics.EndpointChangesPending); got != 0 {
		t.Errorf("changes pending = %v after the sync, want 0", got)
	}
	if got := latency() - latencyBefore; got != 1 {
		t.Errorf("network_programming_duration_seconds{ip_family=IPv4} got %d observations, want 1 (a's trigger time)", got)
	}
}
