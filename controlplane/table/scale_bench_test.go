package table

// Benchmarks at the scale of the "scaling measure" issue: 1,000 nodes in
// three zones and 10,000 Services with three endpoints each, 10% of them
// zone-hinted and 5% with externalTrafficPolicy Local (half NodePort, half
// LoadBalancer). They answer two questions:
//
//   - BenchmarkScaleEndpointChange: what one endpoint change costs, from
//     building the changed Service to every agent's cursor being current,
//     for a plain, a zone-hinted and an eTP Local Service;
//   - BenchmarkScaleMemory: what the control plane retains, at 1,000 and
//     2,000 nodes and 10,000 and 20,000 Services, to show that it grows
//     with nodes + Services, not nodes x Services.
//
// Run them with (a few minutes; the worlds are large):
//
//	go test -run '^$' -bench ScaleEndpointChange -benchmem -benchtime=50x -timeout 30m ./controlplane/table/
//	go test -run '^$' -bench ScaleMemory -benchtime=1x -timeout 30m ./controlplane/table/

import (
	"fmt"
	"maps"
	"runtime"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

const (
	scaleNodes    = 1000
	scaleServices = 10000
)

// newScaleCluster is newBenchCluster with benchMixed's topology, where
// every other eTP Local Service is a LoadBalancer with an ingress IP rather
// than a NodePort.
func newScaleCluster(nodes, services int) *benchCluster {
	c := newBenchCluster(nodes, services, benchMixed)
	for i, o := range c.services {
		if benchMixed.local(i) && (i/benchMixed.localEvery)%2 == 1 {
			benchLoadBalancer(o.svc, i)
		}
	}
	return c
}

// BenchmarkScaleEndpointChange is BenchmarkEndpointChange on the mixed
// 1,000-node, 10,000-Service world, with two differences that make it the
// whole cost of a change: each iteration builds the changed Service from
// its objects (as the watcher does), so its views are encoded afresh on
// first use; and the world around it has topology and local policies.
//
// ns/change is from compute.Build to the last cursor's Ack, and
// build+publish-ns/change its first part, before any cursor runs;
// bytes/change the responses summed over all agents; agents-sent/change
// how many got one; bytes/snapshot the average full table sent to an
// agent at setup, what a per-node table would cost. An eTP Local
// Service's change reaches every agent: its cluster endpoints serve
// traffic from inside the cluster everywhere.
func BenchmarkScaleEndpointChange(b *testing.B) {
	c := newScaleCluster(scaleNodes, scaleServices)
	built := c.buildAll(b)
	for _, tc := range []struct {
		name string
		kind benchChange
	}{{"plain", changePlain}, {"zone-hinted", changeZoneHinted}, {"etp-local", changeETPLocal}} {
		b.Run(tc.name, func(b *testing.B) {
			objs := benchChangedObjects(tc.kind)
			initial := maps.Clone(built)
			first := objs[0].build(b)
			initial[first.Key] = first
			store := NewStore(scaleServices)
			store.Publish(initial, c.nodeMap)
			peers, snapshotBytes := benchSubscribeAll(b, store, c.nodes, scaleServices)

			changes := map[string]*compute.Service{first.Key: nil}
			totalBytes, totalSent, gen := 0, 0, 0
			var publishTime time.Duration
			// Settle the collector after the setup's snapshots, so that the
			// loop pays only for the garbage it makes itself.
			runtime.GC()
			b.ReportAllocs()
			for b.Loop() {
				gen ^= 1
				start := time.Now()
				changes[first.Key] = objs[gen].build(b)
				if n, _ := store.Publish(changes, nil); n != 1 {
					b.Fatalf("publish changed %d services, want 1", n)
				}
				publishTime += time.Since(start)
				sent, bytes := benchFanOut(b, peers)
				totalSent += sent
				totalBytes += bytes
				checkReach(b, tc.kind, sent, len(peers))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/change")
			b.ReportMetric(float64(publishTime.Nanoseconds())/float64(b.N), "build+publish-ns/change")
			b.ReportMetric(float64(totalBytes)/float64(b.N), "bytes/change")
			b.ReportMetric(float64(totalSent)/float64(b.N), "agents-sent/change")
			b.ReportMetric(float64(snapshotBytes)/float64(len(peers)), "bytes/snapshot")
		})
	}
}

// BenchmarkScaleMemory measures the live heap the control plane retains
// for a mixed world, in three layers, each the heap growth after a full
// GC:
//
//   - inputs-MiB: the Kubernetes objects (what the informer caches hold,
//     before the watcher's trimming) and the computed Nodes;
//   - world-MiB: every Service built and published, with every node's
//     view of every Service asked for, so that every distinct view is
//     encoded and memoised; world-bytes/service is world-MiB per Service;
//   - agents-MiB: one subscription and one current cursor per node, as
//     for that many connected agents; bytes/agent is it per node.
//
// total-MiB is the three together. Compare the four sizes: if anything
// were kept per node and Service, doubling both would quadruple it.
func BenchmarkScaleMemory(b *testing.B) {
	for _, size := range []struct{ nodes, services int }{
		{1000, 10000}, {2000, 10000}, {1000, 20000}, {2000, 20000},
	} {
		b.Run(fmt.Sprintf("nodes=%d/services=%d", size.nodes, size.services), func(b *testing.B) {
			var m scaleHeap
			for b.Loop() {
				m = measureScaleHeap(b, size.nodes, size.services)
			}
			const mib = 1 << 20
			b.ReportMetric(float64(m.inputs)/mib, "inputs-MiB")
			b.ReportMetric(float64(m.world)/mib, "world-MiB")
			b.ReportMetric(float64(m.world)/float64(size.services), "world-bytes/service")
			b.ReportMetric(float64(m.agents)/mib, "agents-MiB")
			b.ReportMetric(float64(m.agents)/float64(size.nodes), "bytes/agent")
			b.ReportMetric(float64(m.inputs+m.world+m.agents)/mib, "total-MiB")
		})
	}
}

// scaleHeap is the live heap growth of each layer, in bytes.
type scaleHeap struct{ inputs, world, agents int64 }

// measureScaleHeap builds a mixed world of nodes and services layer by
// layer and returns what each layer added to the live heap.
func measureScaleHeap(b *testing.B, nodes, services int) scaleHeap {
	b.Helper()
	heap := func() int64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	var out scaleHeap
	versions := make([]uint64, nodes) // allocated first: counted in no layer
	start := heap()

	c := newScaleCluster(nodes, services)
	afterInputs := heap()
	out.inputs = afterInputs - start

	store := NewStore(services)
	store.Publish(c.buildAll(b), c.nodeMap)
	w := store.Current()
	for i, n := range c.nodes {
		// Version asks for n's entry of every Service.
		versions[i] = w.Version(w.Node(n.Name))
	}
	afterWorld := heap()
	out.world = afterWorld - afterInputs

	peers := make([]benchPeer, len(c.nodes))
	for i, n := range c.nodes {
		sub := store.Subscribe()
		held := Held{Version: compute.FormatVersion(versions[i])}
		cur, err := NewCursor(n.Name, w, held, true, services)
		if err != nil {
			b.Fatal(err)
		}
		if !cur.Current() {
			b.Fatalf("%s: cursor from the current version is not current", n.Name)
		}
		peers[i] = benchPeer{sub: sub, cur: cur}
	}
	out.agents = heap() - afterWorld

	runtime.KeepAlive(c)
	runtime.KeepAlive(store)
	runtime.KeepAlive(peers)
	return out
}
