package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// The unit tests model internal/flowsuite's cluster (nstest's addresses):
// two nodes on a LAN, two pods behind each node's bridge, a client outside
// the cluster. Pods 0 and 1 run on node-0, pods 2 and 3 on node-1.
var (
	nodeIPs      = [2][2]string{{"192.168.100.1", "fd00:100::1"}, {"192.168.100.2", "fd00:100::2"}}
	bridgeIPs    = [2][2]string{{"10.244.1.1", "fd00:244:1::1"}, {"10.244.2.1", "fd00:244:2::1"}}
	podIPs       = [4][2]string{{"10.244.1.10", "fd00:244:1::10"}, {"10.244.1.11", "fd00:244:1::11"}, {"10.244.2.10", "fd00:244:2::10"}, {"10.244.2.11", "fd00:244:2::11"}}
	clientIP     = [2]string{"192.168.100.100", "fd00:100::100"}
	clusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
)

// externalIPs returns case idx's address in node k's external range (a
// /27 of 198.51.100.0/24 per node, as nstest's), IPv4 first: routed to
// that node, and distinct per case.
func externalIPs(k, idx int) [2]string {
	return [2]string{fmt.Sprintf("198.51.100.%d", 32*k+idx+1), fmt.Sprintf("2001:db8:100:%x::%x", k, idx+1)}
}

const (
	backendPort   = 8080
	firstNodePort = 30000
	firstHCPort   = 32000
)

// fam indexes the address arrays: 0 for IPv4, 1 for IPv6.
func fam(f dataplane.Family) int {
	if f == dataplane.IPv6 {
		return 1
	}
	return 0
}

func podNode(pod int) int { return pod / 2 }

// podEP is pod's endpoint address and port in family f.
func podEP(pod int, f dataplane.Family) string {
	return netip.AddrPortFrom(netip.MustParseAddr(podIPs[pod][fam(f)]), backendPort).String()
}

// nodeKernel returns a fake kernel with node k's own addresses.
func nodeKernel(k int) *fakeKernel {
	return newFakeKernel(nodeIPs[k][0], nodeIPs[k][1], bridgeIPs[k][0], bridgeIPs[k][1])
}

// testConfig is the unit tests' configuration of family on node k, as the
// flow suite configures the agent.
func testConfig(family dataplane.Family, k int) Config {
	c := DefaultConfig(family)
	c.Backend = xtables.BackendNFT
	c.LocalMode = dataplane.LocalClusterCIDR
	c.ClusterCIDRs = clusterCIDRs
	c.NodeIPs = nodeIPs[k][:]
	return c
}

// testNode is node k's NodeInfo.
func testNode(k int) *pb.NodeInfo {
	return &pb.NodeInfo{
		Name:     fmt.Sprintf("node-%d", k),
		PodCidrs: []string{fmt.Sprintf("10.244.%d.0/24", k+1), fmt.Sprintf("fd00:244:%d::/64", k+1)},
		Hash:     uint64(7 + k),
	}
}

// svcSpec describes a flow-suite Service: dual-stack, a TCP and a UDP port
// (both 80, named "tcp" and "udp") served on backendPort.
type svcSpec struct {
	idx      int
	name     string
	nodePort bool
	lbIPs    []string // of both families
	extIPs   []string
	etpLocal bool
	itpLocal bool
	affinity int32
	ranges   []string
	// pods are the endpoints the control plane picked for the node (after
	// topology, terminating fallback...).
	pods []int
	// noEndpoints says no endpoint exists anywhere (has_endpoints false).
	noEndpoints bool
}

// clusterIPs returns case idx's ClusterIPs, IPv4 first.
func clusterIPs(idx int) [2]string {
	return [2]string{fmt.Sprintf("10.96.0.%d", 10+idx), fmt.Sprintf("fd00:96::%x", 10+idx)}
}

// build returns the Service as node k's table holds it.
func (s svcSpec) build(k int) *pb.Service {
	ips := clusterIPs(s.idx)
	out := &pb.Service{
		Namespace: "flows", Name: s.name, Type: pb.ServiceType_SERVICE_TYPE_CLUSTER_IP, ClusterIps: ips[:],
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		ExternalIps:           s.extIPs,
		LoadBalancerIps:       s.lbIPs,
	}
	has := len(s.pods) > 0 && !s.noEndpoints
	out.Ports = []*pb.ServicePort{
		{Name: "tcp", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, HasEndpoints: has},
		{Name: "udp", Protocol: pb.Protocol_PROTOCOL_UDP, Port: 80, HasEndpoints: has},
	}
	if s.nodePort || len(s.lbIPs) > 0 {
		out.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
		if len(s.lbIPs) > 0 {
			out.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
		}
		out.Ports[0].NodePort = int32(firstNodePort + 2*s.idx)
		out.Ports[1].NodePort = int32(firstNodePort + 2*s.idx + 1)
	}
	if s.etpLocal {
		out.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		out.HealthCheckNodePort = int32(firstHCPort + s.idx)
	}
	if s.itpLocal {
		out.InternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	if s.affinity > 0 {
		out.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: s.affinity}
	}
	out.LoadBalancerSourceRanges = s.ranges
	if s.noEndpoints {
		return out
	}
	eps := func(local bool) []*pb.PortEndpoints {
		var list []*pb.Endpoint
		for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			for _, p := range s.pods {
				if !local || podNode(p) == k {
					list = append(list, &pb.Endpoint{Ip: podIPs[p][fam(f)], Port: backendPort, Ready: true, Serving: true})
				}
			}
		}
		if len(list) == 0 {
			return nil
		}
		return []*pb.PortEndpoints{{PortName: "tcp", Endpoints: list}, {PortName: "udp", Endpoints: list}}
	}
	out.ClusterEndpoints = eps(false)
	external := out.Type != pb.ServiceType_SERVICE_TYPE_CLUSTER_IP || len(s.extIPs) > 0
	if s.itpLocal || (s.etpLocal && external) {
		out.LocalEndpoints = eps(true)
	}
	return out
}

// node is one node of a unit test: a fake kernel and both families'
// Dataplanes on it.
type node struct {
	t    testing.TB
	k    int
	kern *fakeKernel
	dps  map[dataplane.Family]*Dataplane
	prev *proxytable.Table
	// rec has the syncs the Dataplanes' Drivers reported, in order.
	rec dptest.Recorder
}

func newNode(t testing.TB, k int, cfg func(*Config)) *node {
	t.Helper()
	n := &node{t: t, k: k, kern: nodeKernel(k), dps: map[dataplane.Family]*Dataplane{}, prev: proxytable.Empty()}
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		c := testConfig(f, k)
		if cfg != nil {
			cfg(&c)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		n.dps[f] = n.newDataplane(c)
	}
	return n
}

// newDataplane returns a Dataplane of c over n's kernel, reporting its
// syncs to n.rec.
func (n *node) newDataplane(c Config) *Dataplane {
	return newDataplane(c, n.kern.seams(c.Family), n.rec.Observe)
}

// sync programs services into both families, fully or as a delta from the
// previous table (changed keys computed as proxytable.Apply reports them).
func (n *node) sync(full bool, services ...*pb.Service) error {
	n.t.Helper()
	next := dptest.Table(n.t, testNode(n.k), services...)
	changed := dptest.ChangedKeys(n.prev, next)
	var errs []string
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		if err := n.dps[f].Sync(context.Background(), next, changed, full); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	n.prev = next
	return nil
}

func (n *node) mustSync(full bool, services ...*pb.Service) {
	n.t.Helper()
	if err := n.sync(full, services...); err != nil {
		n.t.Fatalf("Sync(full=%v): %v", full, err)
	}
}

// dump is both families' kernel state plus the iptables tables.
func (n *node) dump() string {
	var b strings.Builder
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		fmt.Fprintf(&b, "## %v\n%s", f, n.kern.dump(f))
	}
	return b.String()
}
