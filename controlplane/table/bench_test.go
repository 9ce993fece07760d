package table

// Benchmarks of the table layer on a synthetic cluster of 1,000 nodes and
// 1,000 Services. They measure the three costs the design rests on:
//
//   - BenchmarkComputeTables: building every Service and producing every
//     node's full table (version and encoded snapshot), as after a control
//     plane restart when all agents reconnect with nothing;
//   - BenchmarkEndpointChange: the steady state, one endpoint changing and
//     the change fanned out to every connected agent as a delta;
//   - BenchmarkWorldMemory: what a published world costs in memory, to show
//     that it grows with Services, not with nodes x Services.
//
// scale_bench_test.go measures the last two at 10,000 Services.
//
// Run them with, for example:
//
//	go test -run '^$' -bench . -benchtime=5x ./controlplane/table/

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

const (
	benchNodes    = 1000
	benchServices = 1000
	benchEPs      = 3 // ready endpoints per Service
)

var benchZones = []string{"zone-a", "zone-b", "zone-c"}

// benchMix says which Services use topology: every hintedEvery-th Service
// (i%hintedEvery == 0) has zone hints on all endpoints, and every
// localEvery-th one (i%localEvery == localEvery/4, so never a hinted one)
// has externalTrafficPolicy Local. Zero means none.
type benchMix struct {
	name                    string
	hintedEvery, localEvery int
}

var (
	benchPlain = benchMix{name: "plain"}
	benchMixed = benchMix{name: "hints10-etplocal5", hintedEvery: 10, localEvery: 20}
)

func (m benchMix) hinted(i int) bool { return m.hintedEvery > 0 && i%m.hintedEvery == 0 }
func (m benchMix) local(i int) bool  { return m.localEvery > 0 && i%m.localEvery == m.localEvery/4 }

// benchEndpoint is one ready endpoint of a synthetic Service.
type benchEndpoint struct {
	ip     netip.Addr
	node   int  // index of the node hosting it
	hinted bool // a forZones hint naming the node's zone
}

// benchObjects are the Kubernetes objects of one Service: what the
// informers hand to compute.Build.
type benchObjects struct {
	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
}

func (o benchObjects) build(b testing.TB) *compute.Service {
	b.Helper()
	s, err := compute.Build(o.svc, o.slices)
	if err != nil {
		b.Fatalf("build %s/%s: %v", o.svc.Namespace, o.svc.Name, err)
	}
	return s
}

// benchCluster is a synthetic cluster: nodes named node-0000... spread
// round-robin over three zones, and Services svc-0000... of type NodePort
// (so each has a ClusterIP and a NodePort) with one TCP port and three
// ready endpoints on random nodes.
type benchCluster struct {
	nodes    []*compute.Node
	nodeMap  map[string]*compute.Node
	services []benchObjects
}

func benchNodeName(i int) string { return fmt.Sprintf("node-%04d", i) }
func benchZone(node int) string  { return benchZones[node%len(benchZones)] }

// benchAddr is the n-th address after base.
func benchAddr(base netip.Addr, n int) netip.Addr {
	a := base.As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

var (
	benchClusterIPs = netip.MustParseAddr("10.96.0.0")
	benchPodIPs     = netip.MustParseAddr("10.128.0.0")
	benchAltPodIPs  = netip.MustParseAddr("10.192.0.0") // for changed endpoints
)

func newBenchCluster(nodes, services int, mix benchMix) *benchCluster {
	// A fixed seed: every run benchmarks the same cluster.
	rng := rand.New(rand.NewPCG(1, uint64(nodes)))
	c := &benchCluster{nodeMap: make(map[string]*compute.Node, nodes)}
	for i := range nodes {
		n := compute.BuildNode(benchNodeName(i), &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: benchNodeName(i), Labels: map[string]string{corev1.LabelTopologyZone: benchZone(i)}},
			Spec:       corev1.NodeSpec{PodCIDRs: []string{fmt.Sprintf("10.%d.%d.0/24", 128+i/256, i%256)}},
		})
		c.nodes = append(c.nodes, n)
		c.nodeMap[n.Name] = n
	}
	for i := range services {
		eps := make([]benchEndpoint, benchEPs)
		for k := range eps {
			eps[k] = benchEndpoint{ip: benchAddr(benchPodIPs, i*8+k+1), node: rng.IntN(nodes), hinted: mix.hinted(i)}
		}
		c.services = append(c.services, benchServiceObjects(i, eps, mix.local(i)))
	}
	return c
}

// benchServiceObjects renders Service i with endpoints eps.
func benchServiceObjects(i int, eps []benchEndpoint, etpLocal bool) benchObjects {
	name := fmt.Sprintf("svc-%04d", i)
	ip := benchAddr(benchClusterIPs, i+1).String()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeNodePort,
			ClusterIP:             ip,
			ClusterIPs:            []string{ip},
			Ports:                 []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: int32(30000 + i%2768)}},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
		},
	}
	if etpLocal {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "bench", Name: name + "-abcde"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr(benchNodeName(e.node)),
			Zone:       ptr(benchZone(e.node)),
		}
		if e.hinted {
			ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: benchZone(e.node)}}}
		}
		slice.Endpoints = append(slice.Endpoints, ep)
	}
	return benchObjects{svc: svc, slices: []*discoveryv1.EndpointSlice{slice}}
}

var benchLBIPs = netip.MustParseAddr("172.16.0.0") // load balancer ingress IPs

// benchLoadBalancer makes Service i's object a LoadBalancer with a VIP
// ingress address and a health check node port, keeping its node port.
func benchLoadBalancer(svc *corev1.Service, i int) {
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: benchAddr(benchLBIPs, i+1).String()}}
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		svc.Spec.HealthCheckNodePort = int32(32768 + i%2768)
	}
}

// buildAll builds every Service, keyed for Publish.
func (c *benchCluster) buildAll(b testing.TB) map[string]*compute.Service {
	b.Helper()
	out := make(map[string]*compute.Service, len(c.services))
	for _, o := range c.services {
		s := o.build(b)
		out[s.Key] = s
	}
	return out
}

// BenchmarkComputeTables measures the cold path: from Kubernetes objects to
// every node's full table. Each iteration builds all Services, publishes
// them, and for every node computes its table version by walking every
// Service (World.Version) and encodes its snapshot (what an agent
// connecting with nothing gets). ns/node-table is the whole iteration
// divided by the number of nodes, so it includes each node's share of the
// Service builds; bytes/snapshot is the average encoded snapshot.
//
// The "hints10-etplocal5" variant gives 10% of Services zone hints and 5%
// externalTrafficPolicy Local, so that some nodes see their own views;
// compute shares those views by zone and local node, which this shows
// costs little more than the plain case.
func BenchmarkComputeTables(b *testing.B) {
	for _, mix := range []benchMix{benchPlain, benchMixed} {
		b.Run(mix.name, func(b *testing.B) {
			c := newBenchCluster(benchNodes, benchServices, mix)
			snapshotBytes := 0
			b.ReportAllocs()
			for b.Loop() {
				store := NewStore(benchServices)
				store.Publish(c.buildAll(b), c.nodeMap)
				w := store.Current()
				for _, n := range c.nodes {
					version := w.Version(w.Node(n.Name))
					cur, err := NewCursor(n.Name, w, Held{}, true, benchServices)
					if err != nil {
						b.Fatal(err)
					}
					r := cur.Next()
					if r == nil || !r.Snapshot || r.Version != version {
						b.Fatalf("%s: snapshot %+v does not match version %016x", n.Name, r, version)
					}
					snapshotBytes += r.Body.Len()
				}
			}
			perNode := float64(b.N * len(c.nodes))
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/perNode, "ns/node-table")
			b.ReportMetric(float64(snapshotBytes)/perNode, "bytes/snapshot")
		})
	}
}

// benchPeer plays one agent's stream goroutine without the network: its
// subscription and cursor.
type benchPeer struct {
	sub *Subscription
	cur *Cursor
}

// benchSubscribeAll subscribes an agent for every node and brings each one
// up to date: its cursor sends a snapshot, which the agent acknowledges.
// It also returns the snapshots' total size.
func benchSubscribeAll(b *testing.B, store *Store, nodes []*compute.Node, maxPending int) (peers []benchPeer, snapshotBytes int) {
	b.Helper()
	peers = make([]benchPeer, 0, len(nodes))
	for _, n := range nodes {
		sub := store.Subscribe()
		w, pend := sub.Take()
		cur, err := NewCursor(n.Name, w, Held{}, true, maxPending)
		if err != nil {
			b.Fatal(err)
		}
		cur.Update(w, pend)
		r := cur.Next()
		if r == nil || !r.Snapshot {
			b.Fatalf("%s: want a snapshot, got %+v", n.Name, r)
		}
		if err := cur.Ack(r.Version); err != nil {
			b.Fatal(err)
		}
		snapshotBytes += r.Body.Len()
		peers = append(peers, benchPeer{sub: sub, cur: cur})
	}
	return peers, snapshotBytes
}

// benchFanOut does, for every peer, what its stream goroutine does after a
// publish: Take, Update, Next, and Ack what was sent. It returns how many
// agents got a response and the bytes sent to them all.
func benchFanOut(b *testing.B, peers []benchPeer) (sent, bytes int) {
	b.Helper()
	for _, p := range peers {
		select {
		case <-p.sub.Wake():
		default:
		}
		p.cur.Update(p.sub.Take())
		r := p.cur.Next()
		if r == nil {
			continue
		}
		if err := p.cur.Ack(r.Version); err != nil {
			b.Fatal(err)
		}
		sent++
		bytes += r.Body.Len()
	}
	return sent, bytes
}

// benchChange is the kind of Service whose endpoint changes.
type benchChange int

const (
	// changePlain: no topology, Cluster policies; every node sees the
	// endpoint.
	changePlain benchChange = iota
	// changeZoneHinted: every endpoint hinted for its own zone; only the
	// changed endpoint's zone sees it.
	changeZoneHinted
	// changeETPLocal: a LoadBalancer with externalTrafficPolicy Local;
	// every node sees the change in its cluster endpoints (kept for
	// traffic from inside the cluster), and the hosting node in its local
	// endpoints too.
	changeETPLocal
)

// benchChangedObjects returns two versions (gen 0 and 1) of Service 0 that
// differ in one endpoint: the one on node 0, in zone-a. Its three endpoints
// sit on nodes 0, 1 and 2, one per zone. When zone-hinted, each endpoint
// is hinted for its own zone, so nodes in zone-b and zone-c do not see the
// endpoint that changes and their tables stay the same.
func benchChangedObjects(kind benchChange) [2]benchObjects {
	var out [2]benchObjects
	for gen := range out {
		hinted := kind == changeZoneHinted
		eps := []benchEndpoint{
			{ip: benchAddr(benchPodIPs, 1), node: 0, hinted: hinted},
			{ip: benchAddr(benchPodIPs, 2), node: 1, hinted: hinted},
			{ip: benchAddr(benchPodIPs, 3), node: 2, hinted: hinted},
		}
		if gen == 1 {
			eps[0].ip = benchAddr(benchAltPodIPs, 1)
		}
		out[gen] = benchServiceObjects(0, eps, kind == changeETPLocal)
		if kind == changeETPLocal {
			benchLoadBalancer(out[gen].svc, 0)
		}
	}
	return out
}

// benchChanged is benchChangedObjects, built.
func benchChanged(b *testing.B, kind benchChange) [2]*compute.Service {
	b.Helper()
	objs := benchChangedObjects(kind)
	return [2]*compute.Service{objs[0].build(b), objs[1].build(b)}
}

// BenchmarkEndpointChange measures the steady state: one endpoint of one
// Service changes, and every connected agent gets what it needs. The store
// holds the 1,000 x 1,000 world and 1,000 subscriptions, each with a cursor
// whose snapshot has been sent and acknowledged. Each iteration publishes
// the changed Service (alternating between two versions) and then does,
// for every subscription, what its stream goroutine would: Take, Update,
// Next, and Ack what was sent.
//
// ns/change is the whole fan-out; bytes/change the encoded responses
// summed over all agents; agents-sent/change how many agents got one. In
// "plain" every node sees the endpoint, so every agent gets a delta. In
// "zone-hinted" the changed endpoint is hinted for zone-a only, so only
// zone-a's third of the nodes must get anything: an agent whose table did
// not change receives nothing, which the benchmark checks.
func BenchmarkEndpointChange(b *testing.B) {
	for _, tc := range []struct {
		name string
		kind benchChange
	}{{"plain", changePlain}, {"zone-hinted", changeZoneHinted}} {
		b.Run(tc.name, func(b *testing.B) {
			c := newBenchCluster(benchNodes, benchServices, benchPlain)
			versions := benchChanged(b, tc.kind)
			initial := c.buildAll(b)
			initial[versions[0].Key] = versions[0]
			store := NewStore(benchServices)
			store.Publish(initial, c.nodeMap)
			peers, _ := benchSubscribeAll(b, store, c.nodes, benchServices)

			changes := map[string]*compute.Service{versions[0].Key: nil}
			totalBytes, totalSent, gen := 0, 0, 0
			b.ReportAllocs()
			for b.Loop() {
				gen ^= 1
				changes[versions[0].Key] = versions[gen]
				if n, _ := store.Publish(changes, nil); n != 1 {
					b.Fatalf("publish changed %d services, want 1", n)
				}
				sent, bytes := benchFanOut(b, peers)
				totalSent += sent
				totalBytes += bytes
				checkReach(b, tc.kind, sent, len(peers))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/change")
			b.ReportMetric(float64(totalBytes)/float64(b.N), "bytes/change")
			b.ReportMetric(float64(totalSent)/float64(b.N), "agents-sent/change")
		})
	}
}

// checkReach fails b when a change of kind reached the wrong number of
// agents: a zone-hinted one only its zone's (about a third), any other all.
func checkReach(b *testing.B, kind benchChange, sent, agents int) {
	b.Helper()
	switch {
	case kind == changeZoneHinted && (sent == 0 || sent >= agents):
		b.Fatalf("zone-hinted change reached %d of %d agents; want only zone-a's (about a third)", sent, agents)
	case kind != changeZoneHinted && sent != agents:
		b.Fatalf("change reached %d of %d agents, want all", sent, agents)
	}
}

// BenchmarkWorldMemory measures the live heap a published world costs per
// Service: the heap growth from building and publishing every Service and
// asking every node for its view of every Service (which builds and memoises
// every distinct view), divided by the number of Services. The nodes'
// own compute.Node values and the Kubernetes objects exist before and
// after, so they are not counted; the world's node map is.
//
// With 1,000 and 2,000 nodes the figure should stay about the same: views
// are shared by topology class, not stored per node. No assertion; compare
// the nodes=1000 and nodes=2000 lines.
func BenchmarkWorldMemory(b *testing.B) {
	for _, mix := range []benchMix{benchPlain, benchMixed} {
		for _, nodes := range []int{1000, 2000} {
			b.Run(fmt.Sprintf("%s/nodes=%d", mix.name, nodes), func(b *testing.B) {
				c := newBenchCluster(nodes, benchServices, mix)
				var growth int64
				for b.Loop() {
					growth += benchWorldHeap(b, c)
				}
				b.ReportMetric(float64(growth)/float64(b.N*benchServices), "bytes/service")
			})
		}
	}
}

// benchWorldHeap returns the live heap growth of publishing c's world and
// forcing every node's entry for every Service.
func benchWorldHeap(b *testing.B, c *benchCluster) int64 {
	b.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	store := NewStore(benchServices)
	store.Publish(c.buildAll(b), c.nodeMap)
	w := store.Current()
	keys := w.Keys()
	for _, n := range c.nodes {
		node := w.Node(n.Name)
		for _, k := range keys {
			w.Service(k).EntryFor(node)
		}
	}

	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(store)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}
