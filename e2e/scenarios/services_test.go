package scenarios

import (
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
)

// testServicesReachEveryNode creates a Service and its EndpointSlices
// through the API server and checks that every node's table gets them
// from both replicas, every agent programs them, and packets flow: from
// a pod on every node, over TCP and UDP and both families, and from the
// client outside the cluster, spread over the backends.
func (e *env) testServicesReachEveryNode(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	var pods []int
	for i := range tp.Pods() {
		pods = append(pods, i)
	}
	web, created, err := b.CreateService(ctx, box.NewService("web"), pods...)
	if err != nil {
		t.Fatal(err)
	}
	if len(web.Spec.ClusterIPs) != 2 {
		t.Errorf("web got ClusterIPs %v, want one per family (the box's API server is dual-stack)", web.Spec.ClusterIPs)
	}
	// First answer on each node, measured from the create, in parallel
	// so that one slow node does not delay the others' figures.
	took := make([]time.Duration, tp.Nodes())
	errs := make([]error, tp.Nodes())
	var wg sync.WaitGroup
	for k := range tp.Nodes() {
		wg.Go(func() {
			var at time.Time
			at, errs[k] = b.DialUntil(ctx, tp.PodNS(podOn(b, k)), box.ClusterAddr(web), "")
			took[k] = at.Sub(created)
		})
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("node-%d: %v", k, err)
		}
	}
	figure(t, "service-create-to-traffic", "%s", percentiles(took))
	if _, err := b.WaitProgrammed(ctx, hasEntry(e, "e2e/web", pods...)); err != nil {
		t.Fatal(err)
	}
	e.web = web

	for k := range tp.Nodes() {
		ns := tp.PodNS(podOn(b, k))
		counts, err := tp.Spread(ns, box.ClusterAddr(web), 30, time.Second)
		if err != nil {
			t.Fatalf("node-%d: %v", k, err)
		}
		if len(counts) < 2 {
			t.Errorf("node-%d: 30 dials reached only %v", k, counts)
		}
		if r, err := tp.DialUDP(ns, box.ClusterAddr(web), time.Second); err != nil {
			t.Errorf("node-%d: UDP: %v", k, err)
		} else if r.Backend == "" {
			t.Errorf("node-%d: UDP: empty backend", k)
		}
		if len(web.Spec.ClusterIPs) == 2 {
			v6 := net.JoinHostPort(web.Spec.ClusterIPs[1], strconv.Itoa(box.ServicePort))
			if _, err := tp.DialTCP(ns, v6, time.Second); err != nil {
				t.Errorf("node-%d: IPv6: %v", k, err)
			}
		}
	}
	counts, err := tp.Spread(tp.ClientNS(), box.ClusterAddr(web), 30, time.Second)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if len(counts) < 2 {
		t.Errorf("client: 30 dials reached only %v", counts)
	}
}

// latencyChanges is how many endpoint changes the latency scenario makes.
const latencyChanges = 10

// testEndpointChangeLatency moves a Service's one endpoint from pod to
// pod through the API server and measures, on every node, the time from
// the change's trigger time (endpoints.kubernetes.io/last-change-trigger-time,
// stamped just before the write) to the first connection that reaches
// the new pod: the whole path, API server to control plane to agent to
// kernel. It reports the figures, and the agents' own
// kubeproxy_network_programming_duration_seconds; it asserts only that
// every change arrives.
func (e *env) testEndpointChangeLatency(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	svc, _, err := b.CreateService(ctx, box.NewService("flip"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitProgrammed(ctx, hasEntry(e, "e2e/flip", 0)); err != nil {
		t.Fatal(err)
	}
	before := map[string][2]float64{}
	for _, a := range b.Agents {
		m, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, s := m.Histogram("kubeproxy_network_programming_duration_seconds")
		before[a.Node.Name()] = [2]float64{float64(n), s}
	}

	var samples []time.Duration
	for i := range latencyChanges {
		// Each change moves the endpoint to a pod on the next node, so
		// every change shows as a new backend everywhere, and every node
		// sees local and remote endpoints in turn.
		node := tp.Node((i + 1) % tp.Nodes())
		target := node.Pods()[(i+1)/tp.Nodes()%len(node.Pods())]
		want := podName(target)
		trigger, err := b.SetEndpoints(ctx, svc, target)
		if err != nil {
			t.Fatal(err)
		}
		took := make([]time.Duration, tp.Nodes())
		errs := make([]error, tp.Nodes())
		var wg sync.WaitGroup
		for k := range tp.Nodes() {
			wg.Go(func() {
				var at time.Time
				at, errs[k] = b.DialUntil(ctx, tp.PodNS(podOn(b, k)), box.ClusterAddr(svc), want)
				took[k] = at.Sub(trigger)
			})
		}
		wg.Wait()
		for k, err := range errs {
			if err != nil {
				t.Fatalf("change %d to %s, node-%d: %v", i, want, k, err)
			}
		}
		samples = append(samples, took...)
	}
	figure(t, "endpoint-change-latency", "%s (trigger time to first connection reaching the new endpoint, per node)", percentiles(samples))
	for _, a := range b.Agents {
		m, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, s := m.Histogram("kubeproxy_network_programming_duration_seconds")
		dn, ds := float64(n)-before[a.Node.Name()][0], s-before[a.Node.Name()][1]
		mean := "n/a"
		if dn > 0 {
			mean = ms(time.Duration(ds / dn * float64(time.Second))).String()
		}
		figure(t, "agent-network-programming-duration", "node=%s observations=%.0f mean=%s (the agent's kubeproxy_network_programming_duration_seconds over the changes)", a.Node.Name(), dn, mean)
	}
}

// webService returns the shared Service, failing t if the first scenario
// did not create it.
func webService(t *testing.T, e *env) *corev1.Service {
	t.Helper()
	if e.web == nil {
		t.Fatal("Service web is missing: ServicesReachEveryNode failed or did not run")
	}
	return e.web
}
