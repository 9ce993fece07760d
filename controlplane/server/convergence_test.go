package server

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// trackerOn returns a tracker of store (driven by the test, not run) and
// a subscription positioned at the current world.
func trackerOn(store *table.Store) (*tracker, *table.Subscription) {
	tr := newTracker(store, newRegistry(func(string) bool { return true }))
	sub := store.Subscribe()
	sub.Take()
	return tr, sub
}

// take feeds the tracker the worlds published since the last take, with
// connected as the nodes connected to the replica, and returns the latest
// world.
func take(tr *tracker, sub *table.Subscription, connected []string) *table.World {
	w, p := sub.Take()
	tr.publish(w, p, connected)
	return w
}

func nodeNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return out
}

// histogramCount is how many observations ConvergenceSeconds holds for q.
func histogramCount(t *testing.T, q string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.ConvergenceSeconds.WithLabelValues(q).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func reachedOf(c *pb.Convergence) map[float64]time.Duration {
	out := map[float64]time.Duration{}
	for _, r := range c.GetReached() {
		out[r.GetQuantile()] = r.GetAfter().AsDuration()
	}
	return out
}

func TestConvergenceQuantiles(t *testing.T) {
	store := cluster(t)
	tr, sub := trackerOn(store)
	nodes := nodeNames("node", 10)
	before := map[string]uint64{}
	for _, q := range quantileLabels {
		before[q] = histogramCount(t, q)
	}

	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	w := take(tr, sub, nodes)
	// Node i acknowledges i+1 ms after the change started.
	for i, n := range nodes {
		tr.apply(heldReport{node: n, rev: w.Revision, at: w.Published.Add(time.Duration(i+1) * time.Millisecond)})
		c := tr.snapshot()[0]
		if int(c.GetConverged()) != i+1 {
			t.Fatalf("after %d ACKs converged = %d", i+1, c.GetConverged())
		}
		if i == 3 && len(c.GetReached()) != 0 {
			t.Errorf("4 of 10 converged: reached %v, want nothing", reachedOf(c))
		}
		if i == 4 && len(c.GetReached()) != 1 {
			t.Errorf("5 of 10 converged: reached %v, want 0.5 only", reachedOf(c))
		}
		if i == 8 && len(c.GetPending()) != 1 || i == 8 && c.GetPending()[0].GetNodeName() != "node-09" {
			t.Errorf("9 of 10 converged: pending %v, want node-09", c.GetPending())
		}
	}
	c := tr.snapshot()[0]
	want := map[float64]time.Duration{0.5: 5 * time.Millisecond, 0.9: 9 * time.Millisecond, 0.99: 10 * time.Millisecond, 1: 10 * time.Millisecond}
	if got := reachedOf(c); len(got) != len(want) || got[0.5] != want[0.5] || got[0.9] != want[0.9] || got[0.99] != want[0.99] || got[1] != want[1] {
		t.Errorf("reached %v, want %v", got, want)
	}
	if c.GetNodes() != 10 || len(c.GetPending()) != 0 || !slices.Equal(c.GetServices(), []string{"default/a"}) || c.GetServicesChanged() != 1 {
		t.Errorf("change = %v; want 10 nodes, none pending, Service default/a", c)
	}
	for _, q := range quantileLabels {
		if got := histogramCount(t, q) - before[q]; got != 1 {
			t.Errorf("convergence_seconds{quantile_reached=%q} got %d observations, want 1", q, got)
		}
	}
	// A later report for an older revision, or the same, changes nothing.
	tr.apply(heldReport{node: "node-00", rev: w.Revision, at: time.Now()})
	if got := reachedOf(tr.snapshot()[0]); got[1] != want[1] {
		t.Errorf("after a repeated report: reached %v", got)
	}
}

// sliceWithTrigger builds Service name with one endpoint on node, whose
// slice carries a trigger time when trigger is not zero. With
// internalTrafficPolicy Local only that node's table holds the endpoint.
func localService(t *testing.T, name, node, addr string, trigger time.Time) *compute.Service {
	t.Helper()
	local := corev1.ServiceInternalTrafficPolicyLocal
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "172.30.0.20", InternalTrafficPolicy: &local,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{addr}, NodeName: ptr(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true)},
		}},
	}
	if !trigger.IsZero() {
		slice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	}
	s, err := compute.Build(svc, []*discoveryv1.EndpointSlice{slice})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConvergenceCountsOnlyNodesWhoseTableChanges(t *testing.T) {
	store := cluster(t)
	nodes := nodeNames("node", 3)
	publish(t, store, map[string]*compute.Service{"local": localService(t, "local", nodes[1], "10.9.0.1", time.Time{})})
	tr, sub := trackerOn(store)

	// The endpoint on node-01 moves: only node-01's table changes. Its
	// slice says when the change was triggered.
	trigger := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	publish(t, store, map[string]*compute.Service{"local": localService(t, "local", nodes[1], "10.9.0.2", trigger)})
	w := take(tr, sub, nodes)
	c := tr.snapshot()[0]
	if c.GetNodes() != 1 || len(c.GetPending()) != 1 || c.GetPending()[0].GetNodeName() != nodes[1] {
		t.Fatalf("change = %v; want node-01 alone to count", c)
	}
	if !c.GetFromTriggerTime() || !c.GetStartedAt().AsTime().Equal(trigger) {
		t.Errorf("started %v (from trigger time %v); want the trigger time %v", c.GetStartedAt().AsTime(), c.GetFromTriggerTime(), trigger)
	}
	at := w.Published.Add(time.Millisecond)
	tr.apply(heldReport{node: nodes[1], rev: w.Revision, at: at})
	if got := reachedOf(tr.snapshot()[0])[1]; got != at.Sub(trigger) {
		t.Errorf("100%% after %v, want %v (from the trigger time)", got, at.Sub(trigger))
	}

	// A Service change that brings no newer trigger time starts when it
	// was published. The stream reported holding it before the tracker
	// took the world: it counts as converged at once.
	svc := localService(t, "local", nodes[1], "10.9.0.3", trigger)
	publish(t, store, map[string]*compute.Service{"local": svc})
	tr.apply(heldReport{node: nodes[1], rev: store.Current().Revision, at: time.Now()})
	take(tr, sub, nodes)
	c = tr.snapshot()[0]
	if c.GetFromTriggerTime() || !c.GetStartedAt().AsTime().Equal(store.Current().Published) {
		t.Errorf("started %v (from trigger time %v); want the publication %v", c.GetStartedAt().AsTime(), c.GetFromTriggerTime(), store.Current().Published)
	}
	if c.GetConverged() != 1 || len(c.GetReached()) != len(quantiles) {
		t.Errorf("change held before it was taken: %v; want converged at once", c)
	}

	// A change of a Service no node's table holds differently (removing a
	// Service alters every table; re-publishing the same one none) makes
	// no record.
	n := len(tr.snapshot())
	store.Publish(nil, map[string]*compute.Node{"node-00": compute.BuildNode("node-00", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-00"}})})
	take(tr, sub, nodes)
	if got := len(tr.snapshot()); got != n {
		t.Errorf("a Node change made a record: %d changes, want %d", got, n)
	}
}

func TestConvergenceIsBounded(t *testing.T) {
	store := cluster(t)
	tr, sub := trackerOn(store)
	incomplete := counterValue(t, metrics.ConvergenceIncompleteTotal.WithLabelValues("1"))
	first := nodeNames("first", 300)
	then := nodeNames("then", 300)
	const changes = maxChanges + 40
	for i := range changes {
		connected := first
		if i >= 20 {
			connected = then // the first agents left after 20 changes
		}
		publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 10+i)})
		take(tr, sub, connected)
	}
	got := tr.snapshot()
	if len(got) != maxChanges {
		t.Fatalf("kept %d changes, want the bound %d", len(got), maxChanges)
	}
	if got[0].GetRevision() != store.Current().Revision {
		t.Errorf("newest kept change is revision %d, want the latest %d", got[0].GetRevision(), store.Current().Revision)
	}
	for _, c := range got {
		if len(c.GetPending()) != maxPendingListed || c.GetNodes() != 300 {
			t.Fatalf("change %d names %d pending nodes of %d; want %d of 300", c.GetRevision(), len(c.GetPending()), c.GetNodes(), maxPendingListed)
		}
	}
	if d := counterValue(t, metrics.ConvergenceIncompleteTotal.WithLabelValues("1")) - incomplete; d != changes-maxChanges {
		t.Errorf("convergence_incomplete_total{quantile_reached=\"1\"} rose by %v, want %d (changes evicted)", d, changes-maxChanges)
	}
	// No kept change requires the first agents: they are forgotten, and
	// their bits reused.
	if len(tr.nodes) > len(then)+pruneSlack || len(tr.byIndex) > len(first)+len(then)+pruneSlack {
		t.Errorf("tracking %d nodes in %d slots; want at most %d", len(tr.nodes), len(tr.byIndex), len(then)+pruneSlack)
	}
	for _, c := range tr.changes {
		if words := len(c.required); words > (len(tr.byIndex)+63)/64 {
			t.Errorf("change %d holds %d words of bits for %d slots", c.rev, words, len(tr.byIndex))
		}
	}
}

// changeOn waits until node's replica lists a change of revision rev.
func changeOn(t *testing.T, client pb.TableServiceClient, rev uint64, cond func(*pb.Convergence) bool) *pb.Convergence {
	t.Helper()
	var got *pb.Convergence
	eventually(t, fmt.Sprintf("change %d in ListNodes", rev), func() bool {
		resp, err := client.ListNodes(context.Background(), &pb.ListNodesRequest{})
		if err != nil {
			t.Fatalf("ListNodes: %v", err)
		}
		for _, c := range resp.GetConvergence() {
			if c.GetRevision() == rev {
				got = c
				return cond(c)
			}
		}
		return false
	})
	return got
}

func TestConvergenceNamesNackedNodesAndCountsThoseThatLeft(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	var agents []*agent
	for _, n := range nodeNames("node", 3) {
		a := connect(t, client, &pb.Hello{NodeName: n})
		a.ack(a.recv())
		agents = append(agents, a)
	}
	eventually(t, "every agent current", func() bool {
		for _, a := range agents {
			if nodeStatus(t, client, a.node).GetLag() != nil {
				return false
			}
		}
		return true
	})

	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	rev := store.Current().Revision
	changeOn(t, client, rev, func(c *pb.Convergence) bool { return c.GetNodes() == 3 })
	agents[0].ack(agents[0].recv())
	agents[1].nack(agents[1].recv(), "refused")
	agents[2].recv()
	agents[2].close()
	// node-02 left this replica before converging (to another replica,
	// say): it no longer counts, and is not named as pending here.
	c := changeOn(t, client, rev, func(c *pb.Convergence) bool {
		return c.GetLeft() == 1 && len(c.GetPending()) == 1 && c.GetPending()[0].GetReason() == "nacked"
	})
	if c.GetPending()[0].GetNodeName() != "node-01" || c.GetNodes() != 2 || c.GetConverged() != 1 {
		t.Errorf("change = %v; want node-01 nacked, 1 of 2 converged, node-02 left", c)
	}
	if got := reachedOf(c); len(got) != 1 || got[0.5] <= 0 {
		t.Errorf("reached %v, want 0.5 alone (1 of 2)", got)
	}

	// node-02 comes back and catches up: the change does not wait for it
	// again. node-01, which rejected the table, leaves too: every node
	// still counted has converged, as of node-00's ACK.
	back := connect(t, client, agents[2].hello())
	back.version, back.entries, back.nodeHash = agents[2].version, agents[2].entries, agents[2].nodeHash
	back.ack(back.recv())
	agents[1].close()
	c = changeOn(t, client, rev, func(c *pb.Convergence) bool { return c.GetLeft() == 2 })
	got := reachedOf(c)
	if c.GetNodes() != 1 || c.GetConverged() != 1 || len(c.GetPending()) != 0 || len(got) != len(quantiles) || got[1] != got[0.5] {
		t.Errorf("change = %v; want node-00 alone, converged, every quantile at its ACK", c)
	}
}

func TestDriftReport(t *testing.T) {
	store := cluster(t)
	// A node with a Node object: the registry remembers it once its agent
	// leaves.
	store.Publish(nil, map[string]*compute.Node{"node-1": compute.BuildNode("node-1", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})})
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.ack(a.recv())
	before := counterValue(t, metrics.DriftRepairsTotal)
	rose := func(want float64) {
		t.Helper()
		if d := counterValue(t, metrics.DriftRepairsTotal) - before; d != want {
			t.Errorf("drift_repairs_total rose by %v, want %v", d, want)
		}
	}

	// The agent started a minute ago and repaired once before this stream.
	first := timestamppb.New(time.Now().Add(-time.Minute))
	report := func(first *timestamppb.Timestamp, count uint64, detail string) *pb.SyncRequest {
		return &pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}, Drift: &pb.DriftReport{Repairs: []*pb.DriftRepair{{
			Dataplane: "nftables", IpFamily: "IPv4", Count: count, FirstRepairedAt: first, LastRepairedAt: timestamppb.Now(), Detail: detail,
		}}}}
	}
	a.send(report(first, 2, "IPv4 table proxyplane: chains deleted services"))
	eventually(t, "the drift in ListNodes", func() bool {
		d := nodeStatus(t, client, "node-1").GetDrift()
		return len(d) == 1 && d[0].GetCount() == 2 && d[0].GetDetail() == "IPv4 table proxyplane: chains deleted services"
	})
	// This replica had no report of the node: only the repair made since
	// the stream connected counts; the first may be another replica's.
	rose(1)
	a.send(report(first, 3, "again"))
	eventually(t, "the next repair", func() bool { return nodeStatus(t, client, "node-1").GetDrift()[0].GetCount() == 3 })
	rose(2)
	// The stream goes on: the report rode on a keepalive.
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	a.ack(a.recv())

	// The report outlives the stream, like the last NACK.
	a.close()
	eventually(t, "node-1 disconnected", func() bool { return !nodeStatus(t, client, "node-1").GetConnected() })
	if d := nodeStatus(t, client, "node-1").GetDrift(); len(d) != 1 || d[0].GetCount() != 3 {
		t.Errorf("after disconnecting: drift %v, want the last report", d)
	}
	// A restarted agent counts from 0 again, with a new first repair: all
	// of its repairs are new, even when they outnumber the old agent's.
	b := connect(t, client, &pb.Hello{NodeName: "node-1"})
	b.send(report(timestamppb.Now(), 4, "after restart"))
	eventually(t, "the restarted agent's report", func() bool { return nodeStatus(t, client, "node-1").GetDrift()[0].GetCount() == 4 })
	rose(6)
	b.close()

	// Another replica (or this one, restarted) hears the same report when
	// the agent connects to it: nothing in it happened since, and the
	// repairs were counted where they were made.
	other, _, _ := newTestServer(t, store, Options{})
	c := connect(t, other, &pb.Hello{NodeName: "node-1"})
	c.ack(c.recv())
	old := report(timestamppb.Now(), 4, "after restart")
	old.Drift.Repairs[0].FirstRepairedAt = timestamppb.New(time.Now().Add(-time.Minute))
	old.Drift.Repairs[0].LastRepairedAt = timestamppb.New(time.Now().Add(-time.Second))
	c.send(old)
	eventually(t, "the report on the other replica", func() bool { return len(nodeStatus(t, other, "node-1").GetDrift()) == 1 })
	rose(6)
}

func TestDriftReportBoundedKeepsTheStream(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	long := strings.Repeat("x", maxDriftDetail+1)
	many := make([]*pb.DriftRepair, maxDriftRepairs+1)
	for i := range many {
		many[i] = &pb.DriftRepair{Dataplane: "nftables", IpFamily: fmt.Sprint(i), Count: 1}
	}
	for name, tc := range map[string]struct {
		d    *pb.DriftReport
		want func([]*pb.DriftRepair) bool
	}{
		"detail too long": {
			&pb.DriftReport{Repairs: []*pb.DriftRepair{{Dataplane: "nftables", Count: 1, Detail: long}}},
			func(r []*pb.DriftRepair) bool { return len(r) == 1 && len(r[0].GetDetail()) <= maxDriftDetail },
		},
		"too many": {&pb.DriftReport{Repairs: many}, func(r []*pb.DriftRepair) bool { return len(r) == maxDriftRepairs }},
		"family name too long": {
			&pb.DriftReport{Repairs: []*pb.DriftRepair{{Dataplane: "nftables", IpFamily: long, Count: 1}, {Dataplane: "nftables", IpFamily: "IPv4", Count: 1}}},
			func(r []*pb.DriftRepair) bool { return len(r) == 1 && r[0].GetIpFamily() == "IPv4" },
		},
	} {
		t.Run(name, func(t *testing.T) {
			trimmed := counterValue(t, metrics.DriftReportsTrimmedTotal)
			node := "node-" + strings.ReplaceAll(name, " ", "-")
			a := connect(t, client, &pb.Hello{NodeName: node})
			a.ack(a.recv())
			a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}, Drift: tc.d})
			eventually(t, "the trimmed report in ListNodes", func() bool { return tc.want(nodeStatus(t, client, node).GetDrift()) })
			if d := counterValue(t, metrics.DriftReportsTrimmedTotal) - trimmed; d != 1 {
				t.Errorf("drift_reports_trimmed_total rose by %v, want 1", d)
			}
			// The stream goes on delivering tables.
			publish(t, store, map[string]*compute.Service{name: service(t, name, 1, 1)})
			a.ack(a.recv())
			a.close()
		})
	}
}

// BenchmarkConvergencePerChange is the tracker's cost of one change at n
// agents: finding the nodes whose table it alters, and one report from
// each agent's stream through the queue, as the streams send them. The
// Services are built before the timer; the store's publish is timed, and
// costs the same without a tracker (publish-only).
func BenchmarkConvergencePerChange(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		for _, tracked := range []bool{true, false} {
			name := fmt.Sprintf("agents=%d/publish-only", n)
			if tracked {
				name = fmt.Sprintf("agents=%d/tracked", n)
			}
			b.Run(name, func(b *testing.B) {
				store := cluster(b)
				gens := []*compute.Service{service(b, "a", 2, 101), service(b, "a", 2, 102)}
				tr := newTracker(store, newRegistry(func(string) bool { return true }))
				nodes := nodeNames("node", n)
				for _, name := range nodes {
					tr.reg.attach(&streamStatus{node: name, cancel: func(error) {}})
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan struct{})
				if tracked {
					go func() { tr.run(ctx); close(done) }()
				} else {
					close(done)
				}
				b.ResetTimer()
				for i := range b.N {
					store.Publish(map[string]*compute.Service{"default/a": gens[i%2]}, nil)
					if tracked {
						rev := store.Current().Revision
						for _, name := range nodes {
							tr.report(name, rev)
						}
					}
				}
				if tracked {
					// Every report applied: the last change has converged.
					for {
						out, err := tr.list(ctx)
						if err != nil {
							b.Fatal(err)
						}
						if len(out) > 0 && out[0].GetRevision() == store.Current().Revision && out[0].GetConverged() == out[0].GetNodes() {
							break
						}
					}
				}
				b.StopTimer()
				cancel()
				<-done
			})
		}
	}
}

// TestDriftReportIsAKeepaliveToOlderControlPlanes decodes an agent's
// drift report with SyncRequest as it was before the drift field: a
// keepalive, with the report an unknown field that proto3 keeps aside.
func TestDriftReportIsAKeepaliveToOlderControlPlanes(t *testing.T) {
	fd := protodesc.ToFileDescriptorProto(pb.File_proxyplane_v1_sync_proto)
	for _, m := range fd.GetMessageType() {
		if m.GetName() == "SyncRequest" {
			m.Field = slices.DeleteFunc(m.Field, func(f *descriptorpb.FieldDescriptorProto) bool { return f.GetName() == "drift" })
		}
	}
	old, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&pb.SyncRequest{
		Kind:  &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}},
		Drift: &pb.DriftReport{Repairs: []*pb.DriftRepair{{Dataplane: "nftables", IpFamily: "IPv4", Count: 1}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	md := old.Messages().ByName("SyncRequest")
	if md.Fields().ByName("drift") != nil {
		t.Fatal("the drift field is still there")
	}
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatalf("an older SyncRequest does not decode the report: %v", err)
	}
	if which := m.WhichOneof(md.Oneofs().ByName("kind")); which == nil || which.Name() != "keepalive" {
		t.Errorf("an older control plane sees kind %v, want keepalive", which)
	}
	if len(m.GetUnknown()) == 0 {
		t.Error("the report is not kept as an unknown field")
	}
}

// hintedService builds Service name with one endpoint per zone in zones,
// on node "<zone>-node-0", hinted for its zone: a node sees the endpoint
// of its own zone, and the endpoint's address depends on gen.
func hintedService(t *testing.T, name string, gen int, zones ...string) *compute.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "172.30.0.30",
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for i, z := range zones {
		addr := fmt.Sprintf("10.8.%d.%d", i, 1+gen%250)
		if z != "zone-a" {
			addr = fmt.Sprintf("10.8.%d.1", i) // only zone-a's endpoint moves
		}
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{addr}, NodeName: ptr(z + "-node-0"), Zone: ptr(z),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true)},
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: z}}},
		})
	}
	s, err := compute.Build(svc, []*discoveryv1.EndpointSlice{slice})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConvergenceAlterationMatchesEveryNode checks the per-zone shortcut
// against comparing every changed Service's entry for every node.
func TestConvergenceAlterationMatchesEveryNode(t *testing.T) {
	store := cluster(t)
	zones := []string{"zone-a", "zone-b", "zone-c"}
	nodes := map[string]*compute.Node{}
	var names []string
	for _, z := range zones {
		for i := range 3 {
			name := fmt.Sprintf("%s-node-%d", z, i)
			names = append(names, name)
			nodes[name] = compute.BuildNode(name, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: z}}})
		}
	}
	names = append(names, "unknown-node") // no Node object: no zone
	store.Publish(nil, nodes)
	publish(t, store, map[string]*compute.Service{
		"hinted": hintedService(t, "hinted", 1, zones...),
		"local":  localService(t, "local", "zone-b-node-1", "10.9.0.1", time.Time{}),
	})
	sub := store.Subscribe()
	sub.Take()

	for _, step := range []struct {
		name     string
		services map[string]*compute.Service
		// altered: some node, but not every one, must be altered.
		altered []string
	}{
		{"hinted endpoint of zone-a moves", map[string]*compute.Service{"hinted": hintedService(t, "hinted", 2, zones...)}, []string{"zone-a-node-0", "zone-a-node-1", "zone-a-node-2", "unknown-node"}}, // no zone: every endpoint
		{"local endpoint moves", map[string]*compute.Service{"local": localService(t, "local", "zone-b-node-1", "10.9.0.2", time.Time{})}, []string{"zone-b-node-1"}},
		{"local endpoint moves node", map[string]*compute.Service{"local": localService(t, "local", "zone-c-node-2", "10.9.0.2", time.Time{})}, []string{"zone-b-node-1", "zone-c-node-2"}},
		{"both, and a plain one", map[string]*compute.Service{
			"hinted": hintedService(t, "hinted", 3, zones...),
			"local":  localService(t, "local", "zone-c-node-2", "10.9.0.3", time.Time{}),
			"a":      service(t, "a", 2, 7),
		}, nil},
		{"hints dropped: zone-b sees zone-a's endpoint", map[string]*compute.Service{"hinted": hintedService(t, "hinted", 3, "zone-a", "zone-b", "zone-c", "")}, nil},
	} {
		publish(t, store, step.services)
		w, p := sub.Take()
		var changed []string
		for k := range p.Services {
			changed = append(changed, k)
		}
		slices.Sort(changed)
		alt := newAlteration(w, p, changed)
		var got []string
		for _, name := range names {
			n := w.Node(name)
			want := false
			for _, k := range changed {
				oldHash, hadOld := entryHash(p.Services[k], n)
				newHash, hasNew := entryHash(w.Service(k), n)
				want = want || hadOld != hasNew || oldHash != newHash
			}
			if alt.alters(n) != want {
				t.Errorf("%s: alters(%s) = %v, comparing its entries says %v", step.name, name, !want, want)
			}
			if want {
				got = append(got, name)
			}
		}
		if step.altered != nil && !slices.Equal(got, step.altered) {
			t.Errorf("%s: altered %v, want %v", step.name, got, step.altered)
		}
	}
}

// TestConvergenceTrackerNeverDelaysTables holds the tracker busy while
// every agent of a large cluster reports at once: a stream still sends
// its next table, and the reports wait for the tracker, not the streams.
func TestConvergenceTrackerNeverDelaysTables(t *testing.T) {
	store := cluster(t)
	srv := New(store, Options{}, slog.New(slog.DiscardHandler))
	client, _, _, _ := serve(t, srv)
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.ack(a.recv())

	// The tracker answers a query nobody reads: it is stuck until then.
	busy := make(chan []*pb.Convergence)
	srv.conv.queries <- busy
	released := false
	release := func() {
		if !released {
			released = true
			<-busy
		}
	}
	defer release()
	// 5,000 agents report the same world, as one change wakes them all.
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		for i := range 5000 {
			srv.conv.report(fmt.Sprintf("other-%04d", i), store.Current().Revision)
		}
	}()
	select {
	case <-reported:
	case <-time.After(waitFor):
		t.Error("reports wait for the busy tracker")
	}
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	a.ack(a.recv())
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 3)})
	a.ack(a.recv())

	// Once free, the tracker sees node-1 converge to the change.
	release()
	rev := store.Current().Revision
	changeOn(t, client, rev, func(c *pb.Convergence) bool { return c.GetConverged() == 1 && c.GetNodes() == 1 })
}

// TestConvergenceDatesChangesFromTheirFirstWorld has the tracker take two
// worlds at once, as one that lags does: the change starts when the first
// was published, not the last.
func TestConvergenceDatesChangesFromTheirFirstWorld(t *testing.T) {
	store := cluster(t)
	tr, sub := trackerOn(store)
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	first := store.Current().Published
	publish(t, store, map[string]*compute.Service{"b": service(t, "b", 2, 2)})
	if !store.Current().Published.After(first) {
		t.Skip("the clock did not move between two publications")
	}
	take(tr, sub, nodeNames("node", 2))
	c := tr.snapshot()[0]
	if got := c.GetStartedAt().AsTime(); !got.Equal(first) || c.GetFromTriggerTime() {
		t.Errorf("started %v (from trigger %v), want the first world's publication %v", got, c.GetFromTriggerTime(), first)
	}
}

// TestConvergenceOfNodesAheadOfTheTracker: nodes that reported a world
// before the tracker took it reach each quantile when the node that
// completes it reported, not all when the last did.
func TestConvergenceOfNodesAheadOfTheTracker(t *testing.T) {
	store := cluster(t)
	tr, sub := trackerOn(store)
	nodes := nodeNames("node", 10)
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	w := store.Current()
	// In reverse order: the tracker sorts them.
	for i := len(nodes) - 1; i >= 0; i-- {
		tr.apply(heldReport{node: nodes[i], rev: w.Revision, at: w.Published.Add(time.Duration(i+1) * time.Millisecond)})
	}
	take(tr, sub, nodes)
	want := map[float64]time.Duration{0.5: 5 * time.Millisecond, 0.9: 9 * time.Millisecond, 0.99: 10 * time.Millisecond, 1: 10 * time.Millisecond}
	if got := reachedOf(tr.snapshot()[0]); !maps.Equal(got, want) {
		t.Errorf("reached %v, want %v", got, want)
	}
}

// BenchmarkTrackerDrainAfterEveryAgent: one report and the drain it
// wakes, after every one of 5,000 agents has reported once, as in the
// steady phase, where agents ACK one by one and the tracker wakes for a
// few reports at a time. A drain's cost must not follow the number of
// agents that ever reported (the mailbox's map grown to one slot each).
func BenchmarkTrackerDrainAfterEveryAgent(b *testing.B) {
	store := cluster(b)
	tr, _ := trackerOn(store)
	names := nodeNames("node", 5000)
	for i, name := range names {
		tr.report(name, uint64(i+1))
	}
	tr.drain()
	b.ReportAllocs()
	rev := uint64(len(names))
	for i := 0; b.Loop(); i++ {
		rev++
		tr.report(names[i%len(names)], rev)
		tr.drain()
	}
}
