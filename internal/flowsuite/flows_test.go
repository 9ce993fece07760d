package flowsuite

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

const (
	dialTimeout = 3 * time.Second // IPv6 TCP refusals arrive ~1 s late (nstest)
	// dropTimeout is how long a dial waits before concluding "dropped".
	dropTimeout = time.Second
	// spreadDials is enough for every one of four equally likely backends
	// to answer at least once but for a chance of 4*(3/4)^40, about 4e-5.
	spreadDials = 40
	// spareIndex offsets the case index for addresses of a second,
	// never-programmed Service of a case.
	spareIndex = 100
)

// family picks one IP family's addresses.
type family struct {
	name string
	v6   bool
}

var families = []family{{"IPv4", false}, {"IPv6", true}}

func (f family) pick(v4, v6 netip.Addr) netip.Addr {
	if f.v6 {
		return v6
	}
	return v4
}

func (f family) clusterIP(idx int) netip.Addr {
	ips := clusterIPs(idx)
	return f.pick(netip.MustParseAddr(ips[0]), netip.MustParseAddr(ips[1]))
}

func (f family) node(n *nstest.Node) netip.Addr   { return f.pick(n.IP(), n.IPv6()) }
func (f family) bridge(n *nstest.Node) netip.Addr { return f.pick(n.BridgeIP(), n.BridgeIPv6()) }

func (f family) client(tp *nstest.Topology) netip.Addr { return f.pick(tp.ClientIP(), tp.ClientIPv6()) }

func (f family) external(n *nstest.Node, j int) netip.Addr {
	return f.pick(n.ExternalIP(j), n.ExternalIPv6(j))
}

// flowCase is one behaviour of the suite. objects returns the Services it
// needs (all cases' objects are applied at once, before any check runs);
// check sends the traffic, for each IP family. A case that is about a
// change also has update, the changed objects, applied after check ran for
// every family, and after, which checks the result.
type flowCase struct {
	name    string
	objects func(c *cluster, idx int) []serviceObjects
	check   func(r *run)
	update  func(c *cluster, idx int) []serviceObjects
	after   func(r *run)
}

// plain returns the objects of one Service with the given endpoints.
func plain(name string, eps []ep, opts ...func(idx int) svcOption) func(c *cluster, idx int) []serviceObjects {
	return func(c *cluster, idx int) []serviceObjects {
		var o []svcOption
		for _, f := range opts {
			o = append(o, f(idx))
		}
		return []serviceObjects{{newService(idx, name, o...), endpointSlices(c.tp, name, eps...)}}
	}
}

// fixed adapts an option that does not depend on the case index.
func fixed(o svcOption) func(int) svcOption { return func(int) svcOption { return o } }

var allPods = []ep{ready(0), ready(1), ready(2), ready(3)}

// flowCases is the suite. Pods 0 and 1 run on node-0 (zone-a), pods 2 and
// 3 on node-1 (zone-b); the client is outside the cluster and reaches
// ClusterIPs and pods through node-0.
var flowCases = []flowCase{
	{
		name:    "ClusterIP spreads over all endpoints, from a pod and from a node",
		objects: plain("spread", allPods),
		check: func(r *run) {
			addr := r.service()
			r.expectSpread(r.pod(0), addr, "pod-0", "pod-1", "pod-2", "pod-3")
			r.expectSpread(r.node(1), addr, "pod-0", "pod-1", "pod-2", "pod-3")
		},
	},
	{
		name:    "UDP ClusterIP spreads over all endpoints",
		objects: plain("udp", allPods),
		check: func(r *run) {
			r.expectSpreadUDP(r.pod(3), r.service(), "pod-0", "pod-1", "pod-2", "pod-3")
		},
	},
	{
		name:    "a Service without endpoints rejects",
		objects: plain("empty", nil),
		check: func(r *run) {
			addr := r.service()
			r.expectRefused(r.pod(1), addr)
			r.expectRefused(r.client(), addr)
		},
	},
	{
		name:    "a ClusterIP on a port the Service lacks",
		objects: plain("wrongport", allPods),
		check: func(r *run) {
			addr := nstest.HostPort(r.f.clusterIP(r.idx), servicePort+1)
			// A refusal is an ICMP port unreachable, as upstream's, which
			// IPv6 reports about a second late (see nstest).
			timeout := dropTimeout
			if r.kind.rejectsUnknownPorts {
				timeout = dialTimeout
			}
			_, err := r.tp.DialTCP(r.pod(0), addr, timeout)
			switch {
			case r.kind.rejectsUnknownPorts && !nstest.IsRefused(err):
				r.Errorf("dial %s: got %v, want refused", addr, err)
			case !r.kind.rejectsUnknownPorts && (err == nil || nstest.IsRefused(err)):
				r.Errorf("dial %s: got %v, want no answer (upstream's iptables mode leaves it to routing)", addr, err)
			}
		},
	},
	{
		name:    "NodePort answers on both nodes from outside",
		objects: plain("nodeport", []ep{ready(1), ready(3)}, nodePorts),
		check: func(r *run) {
			for k := range r.tp.Nodes() {
				addr := r.nodePortOn(k)
				r.expectSpread(r.client(), addr, "pod-1", "pod-3")
				r.expectSpreadUDP(r.client(), r.udpNodePortOn(k), "pod-1", "pod-3")
			}
		},
	},
	{
		name: "externalTrafficPolicy Local keeps the client address, drops on a node without local endpoints",
		objects: func(c *cluster, idx int) []serviceObjects {
			n0 := c.tp.Node(0)
			svc := newService(idx, "etplocal", loadBalancer(idx, n0.ExternalIP(idx), n0.ExternalIPv6(idx)), externalLocal(idx))
			return []serviceObjects{{svc, endpointSlices(c.tp, "etplocal", ready(0))}}
		},
		check: func(r *run) {
			client := r.f.client(r.tp)
			r.expectFrom(r.client(), r.nodePortOn(0), "pod-0", client)
			r.expectFrom(r.client(), r.externalOn(0), "pod-0", client)
			r.expectDropped(r.client(), r.nodePortOn(1))
			// The load balancer's health checks tell the two nodes apart.
			r.expectHealthCheck(0, http.StatusOK, 1)
			r.expectHealthCheck(1, http.StatusServiceUnavailable, 0)
			// Inside the cluster the ClusterIP still reaches it from anywhere.
			r.expectSpread(r.pod(3), r.service(), "pod-0")
		},
	},
	{
		name:    "internalTrafficPolicy Local uses only the node's own endpoints",
		objects: plain("itplocal", []ep{ready(0), ready(2)}, fixed(internalLocal)),
		check: func(r *run) {
			addr := r.service()
			r.expectSpread(r.pod(1), addr, "pod-0")
			r.expectSpread(r.pod(3), addr, "pod-2")
			r.expectSpread(r.node(1), addr, "pod-2")
		},
	},
	{
		name:    "internalTrafficPolicy Local drops on a node without local endpoints",
		objects: plain("itplocal-none", []ep{ready(0)}, fixed(internalLocal)),
		check: func(r *run) {
			addr := r.service()
			r.expectSpread(r.pod(1), addr, "pod-0")
			r.expectDropped(r.pod(3), addr)
		},
	},
	{
		name:    "ClientIP affinity keeps a client on one endpoint",
		objects: plain("affinity", allPods, fixed(affinity(60))),
		check: func(r *run) {
			addr := r.service()
			for _, from := range []string{r.pod(1), r.pod(2)} {
				got := r.spread(from, addr, 10, r.tp.DialTCP)
				if len(got) != 1 {
					r.Errorf("from %s: backends %v, want one", from, got)
				}
			}
		},
	},
	{
		name:    "serving terminating endpoints are used only when none is ready",
		objects: plain("terminating", []ep{terminating(0, false), terminating(1, true), terminating(2, true)}),
		check: func(r *run) {
			r.expectSpread(r.pod(3), r.service(), "pod-1", "pod-2")
		},
		update: plain("terminating", []ep{terminating(0, false), terminating(1, true), terminating(2, true), ready(3)}),
		after: func(r *run) {
			r.expectSpread(r.pod(0), r.service(), "pod-3")
		},
	},
	{
		name: "topology hints keep traffic in the zone",
		objects: plain("hints", []ep{ready(0).zone("zone-a"), ready(1).zone("zone-a"), ready(2).zone("zone-b"), ready(3).zone("zone-b")},
			fixed(trafficDistribution("PreferClose"))),
		check: func(r *run) {
			addr := r.service()
			r.expectSpread(r.pod(1), addr, "pod-0", "pod-1")
			r.expectSpread(r.node(1), addr, "pod-2", "pod-3")
		},
	},
	{
		name:    "topology hints missing on one endpoint are ignored",
		objects: plain("hints-partial", []ep{ready(0).zone("zone-a"), ready(1).zone("zone-a"), ready(2).zone("zone-b"), ready(3)}),
		check: func(r *run) {
			r.expectSpread(r.pod(1), r.service(), "pod-0", "pod-1", "pod-2", "pod-3")
		},
	},
	{
		name: "PreferSameNode uses the node's hinted endpoints",
		objects: plain("samenode", []ep{
			ready(0).zone("zone-a").node("node-0"), ready(1).zone("zone-a").node("node-0"),
			ready(3).zone("zone-b").node("node-1"),
		}, fixed(trafficDistribution("PreferSameNode"))),
		check: func(r *run) {
			addr := r.service()
			r.expectSpread(r.pod(2), addr, "pod-3")
			r.expectSpread(r.pod(0), addr, "pod-0", "pod-1")
		},
	},
	{
		name: "LoadBalancer IP and externalIPs answer from outside",
		objects: func(c *cluster, idx int) []serviceObjects {
			n0, n1 := c.tp.Node(0), c.tp.Node(1)
			svc := newService(idx, "lb", loadBalancer(idx, n1.ExternalIP(idx), n1.ExternalIPv6(idx)),
				externalIPs(n0.ExternalIP(idx), n0.ExternalIPv6(idx)))
			return []serviceObjects{{svc, endpointSlices(c.tp, "lb", ready(0), ready(2))}}
		},
		check: func(r *run) {
			r.expectSpread(r.client(), r.externalOn(1), "pod-0", "pod-2")
			r.expectSpread(r.client(), r.externalOn(0), "pod-0", "pod-2")
			r.expectSpreadUDP(r.client(), r.externalOn(1), "pod-0", "pod-2")
		},
	},
	{
		name: "loadBalancerSourceRanges let listed sources in and drop the rest",
		objects: func(c *cluster, idx int) []serviceObjects {
			n0 := c.tp.Node(0)
			allowed := newService(idx, "ranges", loadBalancer(idx, n0.ExternalIP(idx), n0.ExternalIPv6(idx)),
				sourceRanges(c.tp.ClientIP().String()+"/32", c.tp.ClientIPv6().String()+"/128"))
			return []serviceObjects{{allowed, endpointSlices(c.tp, "ranges", ready(2))}}
		},
		check: func(r *run) {
			r.expectSpread(r.client(), r.externalOn(0), "pod-2")
		},
		update: func(c *cluster, idx int) []serviceObjects {
			n0 := c.tp.Node(0)
			denied := newService(idx, "ranges", loadBalancer(idx, n0.ExternalIP(idx), n0.ExternalIPv6(idx)),
				sourceRanges("203.0.113.0/24", "2001:db8:ffff::/48"))
			return []serviceObjects{{denied, endpointSlices(c.tp, "ranges", ready(2))}}
		},
		after: func(r *run) {
			r.expectDropped(r.client(), r.externalOn(0))
			// NodePorts ignore source ranges, as upstream.
			r.expectSpread(r.client(), r.nodePortOn(0), "pod-2")
		},
	},
	{
		name:    "a UDP flow moves to a live endpoint when its endpoint goes away",
		objects: plain("stale-udp", []ep{ready(1)}),
		check: func(r *run) {
			r.expectUDPFrom(r.client(), r.staleSourcePort(), r.service(), "pod-1")
			r.expectUDPFrom(r.pod(2), r.staleSourcePort(), r.service(), "pod-1")
		},
		update: plain("stale-udp", []ep{ready(3)}),
		after: func(r *run) {
			// The same source ports: without the cleanup, conntrack would
			// keep sending these flows to pod-1.
			r.expectUDPFrom(r.client(), r.staleSourcePort(), r.service(), "pod-3")
			r.expectUDPFrom(r.pod(2), r.staleSourcePort(), r.service(), "pod-3")
		},
	},
	{
		// Upstream keeps a UDP flow to any serving endpoint: topology
		// decides where new flows go, not where old ones end.
		name:    "a UDP flow keeps its serving endpoint when topology hints take it out of the node's set",
		objects: plain("udp-topology", []ep{ready(3)}),
		check: func(r *run) {
			r.expectUDPFrom(r.client(), r.staleSourcePort(), r.service(), "pod-3")
			r.expectUDPFrom(r.pod(1), r.staleSourcePort(), r.service(), "pod-3")
		},
		update: plain("udp-topology", []ep{ready(0).zone("zone-a"), ready(3).zone("zone-b")},
			fixed(trafficDistribution("PreferClose"))),
		after: func(r *run) {
			r.expectUDPFrom(r.client(), r.staleSourcePort(), r.service(), "pod-3")
			r.expectUDPFrom(r.pod(1), r.staleSourcePort(), r.service(), "pod-3")
			// New flows from zone-a's node follow the hints.
			r.expectSpreadUDP(r.pod(1), r.service(), "pod-0")
		},
	},
	{
		name:    "a UDP flow keeps its endpoint while it terminates and still serves",
		objects: plain("udp-terminating", []ep{ready(1)}),
		check: func(r *run) {
			r.expectUDPFrom(r.client(), r.staleSourcePort(), r.service(), "pod-1")
			r.expectUDPFrom(r.pod(2), r.staleSourcePort(), r.service(), "pod-1")
		},
		update: plain("udp-terminating", []ep{terminating(1, true), ready(3)}),
		after: func(r *run) {
			r.expectUDPFrom(r.client(), r.staleSourcePort(), r.service(), "pod-1")
			r.expectUDPFrom(r.pod(2), r.staleSourcePort(), r.service(), "pod-1")
			r.expectSpreadUDP(r.pod(2), r.service(), "pod-3")
		},
	},
	{
		// Upstream v1.36 skips a Service without endpoints, so these flows
		// would stay on pod-1 for as long as their senders keep them
		// alive; kubernetes #139629 (a regression fix, June 2026) cleans
		// them, and so does proxyplane (see nodeagent/conntrack).
		name:    "a UDP flow is refused, not kept on its endpoint, when its Service scales to zero",
		objects: plain("udp-to-zero", []ep{ready(1)}),
		check: func(r *run) {
			r.expectUDPFrom(r.client(), r.staleSourcePort(), r.service(), "pod-1")
			r.expectUDPFrom(r.pod(2), r.staleSourcePort(), r.service(), "pod-1")
		},
		update: plain("udp-to-zero", nil),
		after: func(r *run) {
			r.expectUDPRefusedFrom(r.client(), r.staleSourcePort(), r.service())
			r.expectUDPRefusedFrom(r.pod(2), r.staleSourcePort(), r.service())
		},
	},
	{
		name:    "masquerade: off-cluster clients and other nodes' NodePorts, never pod to pod",
		objects: plain("masquerade", []ep{ready(2)}, nodePorts),
		check: func(r *run) {
			n0, n1 := r.tp.Node(0), r.tp.Node(1)
			// A pod keeps its address across nodes.
			r.expectFrom(r.pod(0), r.service(), "pod-2", r.f.pick(r.tp.PodIP(0), r.tp.PodIPv6(0)))
			// The client is outside the cluster CIDR: node-0 masquerades it
			// as it sends it on to node-1.
			r.expectFrom(r.client(), r.service(), "pod-2", r.f.node(n0))
			// A NodePort on the node without the endpoint forwards it
			// masqueraded; on the node with it, only the bridge is crossed.
			r.expectFrom(r.client(), r.nodePortOn(0), "pod-2", r.f.node(n0))
			r.expectFrom(r.client(), r.nodePortOn(1), "pod-2", r.f.bridge(n1))
		},
	},
	{
		name:    "hairpin: a pod reaches itself through its Service, masqueraded",
		objects: plain("hairpin", []ep{ready(0)}),
		check: func(r *run) {
			r.expectFrom(r.pod(0), r.service(), "pod-0", r.f.bridge(r.tp.Node(0)))
		},
	},
	{
		name: "skipped Services get no rules, and the rest of the table is unaffected",
		objects: func(c *cluster, idx int) []serviceObjects {
			eps := endpointSlices(c.tp, "skipped", ready(0))
			labelledSvc := newService(idx, "skipped", labelled(compute.LabelServiceProxyName, "other-proxy"))
			headless := newService(idx, "headless", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} })
			external := newService(idx, "external", func(s *corev1.Service) {
				s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.ExternalName = "ExternalName", "", nil, "example.com"
			})
			// Duplicate port names: invalid, so skipped. It takes the next
			// case index's addresses, which no case uses.
			invalid := newService(idx+spareIndex, "invalid", func(s *corev1.Service) { s.Spec.Ports[1].Name = "tcp" })
			return []serviceObjects{
				{labelledSvc, eps},
				{headless, endpointSlices(c.tp, "headless", ready(0))},
				{external, nil},
				{invalid, endpointSlices(c.tp, "invalid", ready(0))},
			}
		},
		check: func(r *run) {
			for _, ip := range []netip.Addr{r.f.clusterIP(r.idx), r.f.clusterIP(r.idx + spareIndex)} {
				addr := nstest.HostPort(ip, servicePort)
				if got, err := r.tp.DialTCP(r.pod(1), addr, dropTimeout); err == nil {
					r.Errorf("dial %s reached %s; the Service should have no rules", addr, got.Backend)
				}
			}
			for _, n := range r.nodes {
				for _, key := range []string{"skipped", "headless", "external", "invalid"} {
					if _, ok := n.agent.Held().Entries[namespace+"/"+key]; ok {
						r.Errorf("%s holds skipped Service %s", n, key)
					}
				}
			}
		},
	},
}

// run is one case's check for one IP family: the test, the cluster, the
// case's index (which picks its addresses) and the family.
type run struct {
	*testing.T
	*cluster
	idx int
	f   family
}

// service is the case's ClusterIP and TCP/UDP port.
func (r *run) service() string { return nstest.HostPort(r.f.clusterIP(r.idx), servicePort) }

// nodePortOn is node k's address and the case's TCP node port.
func (r *run) nodePortOn(k int) string {
	return nstest.HostPort(r.f.node(r.tp.Node(k)), firstNodePort+2*r.idx)
}

// udpNodePortOn is node k's address and the case's UDP node port.
func (r *run) udpNodePortOn(k int) string {
	return nstest.HostPort(r.f.node(r.tp.Node(k)), firstNodePort+2*r.idx+1)
}

// externalOn is the case's address in node k's external range, port 80.
func (r *run) externalOn(k int) string {
	return nstest.HostPort(r.f.external(r.tp.Node(k), r.idx), servicePort)
}

func (r *run) pod(i int) string  { return r.tp.PodNS(i) }
func (r *run) node(k int) string { return r.tp.Node(k).NS() }
func (r *run) client() string    { return r.tp.ClientNS() }

// expectSpread dials addr over TCP from ns and checks that exactly the
// backends want answered.
func (r *run) expectSpread(ns, addr string, want ...string) {
	r.Helper()
	r.checkSpread(ns, addr, r.tp.DialTCP, want)
}

// expectSpreadUDP is expectSpread over UDP.
func (r *run) expectSpreadUDP(ns, addr string, want ...string) {
	r.Helper()
	r.checkSpread(ns, addr, r.tp.DialUDP, want)
}

type dialFunc func(ns, addr string, timeout time.Duration) (nstest.Reply, error)

func (r *run) checkSpread(ns, addr string, dial dialFunc, want []string) {
	r.Helper()
	n := spreadDials
	if len(want) == 1 {
		n = 5
	}
	got := r.spread(ns, addr, n, dial)
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		r.Errorf("from %s to %s: backends %v, want each of %v", label(ns), addr, got, want)
	}
}

// spread dials n times and counts the answering backends; a failed dial
// fails the test.
func (r *run) spread(ns, addr string, n int, dial dialFunc) map[string]int {
	r.Helper()
	got := map[string]int{}
	for range n {
		reply, err := dial(ns, addr, dialTimeout)
		if err != nil {
			r.Errorf("from %s to %s: %v", label(ns), addr, err)
			return got
		}
		got[reply.Backend]++
	}
	return got
}

// expectFrom checks that one TCP dial reaches backend and that it saw the
// connection come from seen.
func (r *run) expectFrom(ns, addr, backend string, seen netip.Addr) {
	r.Helper()
	reply, err := r.tp.DialTCP(ns, addr, dialTimeout)
	if err != nil {
		r.Errorf("from %s to %s: %v", label(ns), addr, err)
		return
	}
	if reply.Backend != backend || reply.SeenFrom != seen {
		r.Errorf("from %s to %s: reached %s from %v, want %s from %v", label(ns), addr, reply.Backend, reply.SeenFrom, backend, seen)
	}
}

// expectRefused checks that TCP and UDP to addr are refused.
func (r *run) expectRefused(ns, addr string) {
	r.Helper()
	for _, d := range []dialFunc{r.tp.DialTCP, r.tp.DialUDP} {
		if _, err := d(ns, addr, dialTimeout); !nstest.IsRefused(err) {
			r.Errorf("from %s to %s: got %v, want refused", label(ns), addr, err)
		}
	}
}

// expectDropped checks that a TCP dial to addr times out: a rule dropped
// it (unrouted traffic fails at once at the LAN router, see nstest).
func (r *run) expectDropped(ns, addr string) {
	r.Helper()
	if reply, err := r.tp.DialTCP(ns, addr, dropTimeout); !nstest.IsTimeout(err) {
		r.Errorf("from %s to %s: got %+v, %v, want dropped (timeout)", label(ns), addr, reply, err)
	}
}

// staleSourcePort is the case's fixed UDP source port, outside the range
// nstest's dials take theirs from.
func (r *run) staleSourcePort() int { return 31000 + r.idx }

// expectUDPFrom sends one datagram from ns and source port srcPort and
// checks that backend answered.
func (r *run) expectUDPFrom(ns string, srcPort int, addr, backend string) {
	r.Helper()
	reply, err := r.tp.DialUDPFrom(ns, srcPort, addr, dialTimeout)
	if err != nil {
		r.Errorf("from %s port %d to %s: %v", label(ns), srcPort, addr, err)
		return
	}
	if reply.Backend != backend {
		r.Errorf("from %s port %d to %s: reached %s, want %s", label(ns), srcPort, addr, reply.Backend, backend)
	}
}

// expectUDPRefusedFrom sends one datagram from ns and source port srcPort
// and checks that it was refused.
func (r *run) expectUDPRefusedFrom(ns string, srcPort int, addr string) {
	r.Helper()
	if reply, err := r.tp.DialUDPFrom(ns, srcPort, addr, dialTimeout); !nstest.IsRefused(err) {
		r.Errorf("from %s port %d to %s: got %+v, %v, want refused", label(ns), srcPort, addr, reply, err)
	}
}

// expectHealthCheck asks node k's healthCheckNodePort for the case's
// Service, over HTTP from the client, as a load balancer would, and checks
// the status and the local endpoint count.
func (r *run) expectHealthCheck(k, status, localEndpoints int) {
	r.Helper()
	client := &http.Client{
		Timeout: dialTimeout,
		Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := r.tp.Do(r.client(), func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}},
	}
	defer client.CloseIdleConnections()
	url := "http://" + nstest.HostPort(r.f.node(r.tp.Node(k)), firstHCPort+r.idx) + "/"
	resp, err := client.Get(url)
	if err != nil {
		r.Errorf("GET %s: %v", url, err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	var body struct {
		Service struct {
			Namespace, Name string
		}
		LocalEndpoints int
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		r.Errorf("GET %s: decoding body: %v", url, err)
		return
	}
	if resp.StatusCode != status || body.LocalEndpoints != localEndpoints || body.Service.Namespace != namespace {
		r.Errorf("GET %s: %d %+v, want %d with %d local endpoints", url, resp.StatusCode, body, status, localEndpoints)
	}
}

// label shortens a namespace name to its role for messages.
func label(ns string) string {
	if i := strings.LastIndex(ns, "-pod-"); i >= 0 {
		return ns[i+1:]
	}
	if i := strings.LastIndex(ns, "-node-"); i >= 0 {
		return ns[i+1:]
	}
	return ns[strings.LastIndex(ns, "-")+1:]
}
