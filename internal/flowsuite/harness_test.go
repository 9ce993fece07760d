package flowsuite

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
	"github.com/proxyplane/proxyplane/nodeagent/conntrack"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/healthcheck"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Cluster layout: nstest's addresses, and the zone of each node.
var (
	zones       = []string{"zone-a", "zone-b"}
	clusterCIDR = []string{"10.244.0.0/16", "fd00:244::/32"}
)

// backendPort is where every pod serves TCP and UDP.
const backendPort = 8080

// applyTimeout bounds one table apply on one node (a full iptables sync of
// a few dozen services takes well under a second).
const applyTimeout = 30 * time.Second

// dataplaneKind is one dataplane the suite runs against.
type dataplaneKind struct {
	name string
	// new returns the dataplane (both IP families joined) programming
	// node n's namespace.
	new func(t *testing.T, tp *nstest.Topology, n *nstest.Node) dataplane.Dataplane
	// rejectsUnknownPorts is true when the mode rejects traffic to a
	// ClusterIP on a port the Service does not have (upstream's nftables
	// mode does; its iptables mode lets the packet be routed on).
	rejectsUnknownPorts bool
}

// cluster is the control plane's computation plus one real agent per node.
// One goroutine at a time uses it: the suite's subtests run in sequence.
type cluster struct {
	kind     dataplaneKind
	tp       *nstest.Topology
	store    *table.Store
	services map[string]*corev1.Service
	slices   map[string][]*discoveryv1.EndpointSlice
	nodes    []*clusterNode
}

// clusterNode is one node: its namespace, Node object and agent.
type clusterNode struct {
	ns    *nstest.Node
	obj   *corev1.Node
	agent *agent.Agent
}

// newCluster builds the topology and starts an agent per node on kind's
// dataplane. Every pod serves TCP and UDP on backendPort.
func newCluster(t *testing.T, kind dataplaneKind) *cluster {
	t.Helper()
	tp := nstest.New(t, nstest.Options{Nodes: len(zones), Pods: 2})
	c := &cluster{
		kind: kind, tp: tp, store: table.NewStore(1000),
		services: map[string]*corev1.Service{}, slices: map[string][]*discoveryv1.EndpointSlice{},
	}
	// The agents stop with ctx; the cleanup waits for those started, so a
	// constructor failing part-way (t.Fatal, t.Skip) cannot hang it.
	ctx, cancel := context.WithCancel(context.Background())
	var agents sync.WaitGroup
	t.Cleanup(func() { cancel(); agents.Wait() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	nodes := map[string]*compute.Node{}
	for k := range tp.Nodes() {
		n := tp.Node(k)
		obj := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name(), Labels: map[string]string{corev1.LabelTopologyZone: zones[k]}},
		}
		for _, p := range n.PodCIDRs() {
			obj.Spec.PodCIDRs = append(obj.Spec.PodCIDRs, p.String())
		}
		obj.Spec.PodCIDR = obj.Spec.PodCIDRs[0]
		nodes[n.Name()] = compute.BuildNode(n.Name(), obj)

		store, cached, err := cache.Open(filepath.Join(t.TempDir(), "cache.db"), log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		hc := healthcheck.New(healthcheck.Config{Listen: listenIn(tp, n.NS())}, log)
		t.Cleanup(func() { _ = hc.Close() })
		cleaners := conntrackIn(t, n.NS(), log)
		a := agent.New(agent.Config{
			SyncPeriod: time.Hour, RetryMin: time.Second, RetryMax: time.Minute,
			AfterSync: []func(context.Context, *proxytable.Table){
				func(_ context.Context, tb *proxytable.Table) {
					if err := hc.Sync(tb); err != nil {
						t.Errorf("%s: health check server: %v", n.Name(), err)
					}
				},
				func(ctx context.Context, tb *proxytable.Table) {
					for _, c := range cleaners {
						if _, err := c.Clean(ctx, tb); err != nil {
							t.Errorf("%s: conntrack cleanup: %v", n.Name(), err)
						}
					}
				},
			},
		}, kind.new(t, tp, n), store, cached, log)
		agents.Go(func() { _ = a.Run(ctx) })
		c.nodes = append(c.nodes, &clusterNode{ns: n, obj: obj, agent: a})
	}
	c.store.Publish(nil, nodes)

	for i := range tp.Pods() {
		tp.ServeTCP(i, backendPort)
		tp.ServeUDP(i, backendPort)
	}
	return c
}

// apply sets Services (with their slices) and brings every node's table
// and kernel up to date. A nil slice list removes the Service's slices.
func (c *cluster) apply(t *testing.T, objs ...serviceObjects) {
	t.Helper()
	changed := map[string]*compute.Service{}
	for _, o := range objs {
		key := compute.Key(o.svc.Namespace, o.svc.Name)
		c.services[key], c.slices[key] = o.svc, o.slices
		changed[key] = c.build(t, key)
	}
	c.store.Publish(changed, nil)
	c.sync(t)
}

// build does what the control plane's watcher does with one Service:
// skipped and invalid Services are absent from every table.
func (c *cluster) build(t *testing.T, key string) *compute.Service {
	t.Helper()
	svc := c.services[key]
	if compute.SkipReason(svc) != "" {
		return nil
	}
	s, err := compute.Build(svc, c.slices[key])
	if err != nil {
		t.Logf("service %s skipped: %v", key, err)
		return nil
	}
	return s
}

// sync sends each agent what the control plane would: a delta from the
// entries it holds (as after a reconnect), applied by the agent and then
// acknowledged.
func (c *cluster) sync(t *testing.T) {
	t.Helper()
	world := c.store.Current()
	for _, n := range c.nodes {
		held := n.agent.Held()
		cur, err := table.NewCursor(n.ns.Name(), world,
			table.Held{Version: held.Version, Entries: held.Hashes(), NodeHash: held.Node.GetHash()}, true, 1000)
		if err != nil {
			t.Fatalf("%s: %v", n.ns.Name(), err)
		}
		r := cur.Next()
		if r == nil {
			continue // already current
		}
		resp := &pb.SyncResponse{Nonce: "1"}
		if r.Snapshot {
			s := &pb.Snapshot{}
			if err := proto.Unmarshal(r.Body.Bytes(), s); err != nil {
				t.Fatal(err)
			}
			resp.Kind = &pb.SyncResponse_Snapshot{Snapshot: s}
		} else {
			d := &pb.Delta{}
			if err := proto.Unmarshal(r.Body.Bytes(), d); err != nil {
				t.Fatal(err)
			}
			resp.Kind = &pb.SyncResponse_Delta{Delta: d}
		}
		ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
		v, err := n.agent.Apply(ctx, resp, false)
		cancel()
		if err != nil {
			t.Fatalf("%s: applying version %s: %v", n.ns.Name(), compute.FormatVersion(r.Version), err)
		}
		if want := compute.FormatVersion(r.Version); v != want {
			t.Fatalf("%s: agent holds %s after applying %s", n.ns.Name(), v, want)
		}
	}
}

// listenIn listens inside namespace ns, as the agent of that node would.
func listenIn(tp *nstest.Topology, ns string) func(network, addr string) (net.Listener, error) {
	return func(network, addr string) (net.Listener, error) {
		var l net.Listener
		err := tp.Do(ns, func() error {
			var err error
			l, err = net.Listen(network, addr)
			return err
		})
		return l, err
	}
}

// conntrackIn returns a stale-flow cleaner per family working on
// namespace ns's conntrack table, as the agent of that node would.
func conntrackIn(t *testing.T, ns string, log *slog.Logger) []*conntrack.Cleaner {
	t.Helper()
	nsh, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = nsh.Close() }()
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return []*conntrack.Cleaner{
		conntrack.NewWithHandle(dataplane.IPv4, h, log),
		conntrack.NewWithHandle(dataplane.IPv6, h, log),
	}
}

// serviceObjects is a Service and its EndpointSlices.
type serviceObjects struct {
	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
}

// String names the node for messages.
func (n *clusterNode) String() string {
	return fmt.Sprintf("%s (%s)", n.ns.Name(), n.obj.Labels[corev1.LabelTopologyZone])
}
