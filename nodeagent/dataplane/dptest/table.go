package dptest

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Protocols, short for the table's enum.
const (
	TCP  = pb.Protocol_PROTOCOL_TCP
	UDP  = pb.Protocol_PROTOCOL_UDP
	SCTP = pb.Protocol_PROTOCOL_SCTP
)

// Svc is a ClusterIP Service with defaults; mutate the result.
func Svc(ns, name string, clusterIPs ...string) *pb.Service {
	return &pb.Service{
		Namespace: ns, Name: name, Type: pb.ServiceType_SERVICE_TYPE_CLUSTER_IP, ClusterIps: clusterIPs,
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
	}
}

// Port is a ServicePort; has says whether endpoints exist anywhere.
func Port(name string, proto pb.Protocol, p, nodePort int32, has bool) *pb.ServicePort {
	return &pb.ServicePort{Name: name, Protocol: proto, Port: p, NodePort: nodePort, HasEndpoints: has}
}

// Eps lists endpoints "ip:port" (or "[ip6]:port") of a port, ready and
// serving.
func Eps(portName string, addrs ...string) *pb.PortEndpoints {
	pe := &pb.PortEndpoints{PortName: portName}
	for _, a := range addrs {
		host, p, err := net.SplitHostPort(a)
		if err != nil {
			panic(err)
		}
		n, _ := strconv.Atoi(p)
		pe.Endpoints = append(pe.Endpoints, &pb.Endpoint{Ip: host, Port: int32(n), Ready: true, Serving: true})
	}
	return pe
}

// Entry wraps s with its key and a content hash, as the control plane
// sends it.
func Entry(s *pb.Service) *pb.ServiceEntry {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	if err != nil {
		panic(err)
	}
	return &pb.ServiceEntry{Key: s.Namespace + "/" + s.Name, Hash: xxhash.Sum64(b), Service: s}
}

// Table validates services into a Table the way the agent would receive
// it: entry hashes are computed from content and the version is their
// sum with the node's hash.
func Table(tb testing.TB, node *pb.NodeInfo, services ...*pb.Service) *proxytable.Table {
	tb.Helper()
	entries := make([]*pb.ServiceEntry, 0, len(services))
	for _, s := range services {
		entries = append(entries, Entry(s))
	}
	return fromEntries(tb, node, entries)
}

// Replace returns t with s added, or replacing the Service of its key.
func Replace(tb testing.TB, t *proxytable.Table, s *pb.Service) *proxytable.Table {
	tb.Helper()
	return fromEntries(tb, t.Node, append(others(t, s.Namespace+"/"+s.Name), Entry(s)))
}

// Remove returns t without the Service of key.
func Remove(tb testing.TB, t *proxytable.Table, key string) *proxytable.Table {
	tb.Helper()
	return fromEntries(tb, t.Node, others(t, key))
}

func others(t *proxytable.Table, key string) []*pb.ServiceEntry {
	entries := make([]*pb.ServiceEntry, 0, len(t.Entries)+1)
	for k, e := range t.Entries {
		if k != key {
			entries = append(entries, e)
		}
	}
	return entries
}

func fromEntries(tb testing.TB, node *pb.NodeInfo, entries []*pb.ServiceEntry) *proxytable.Table {
	tb.Helper()
	sum := node.GetHash()
	for _, e := range entries {
		sum += e.GetHash()
	}
	t, err := proxytable.FromEntries(fmt.Sprintf("%016x", sum), node, entries)
	if err != nil {
		tb.Fatalf("building table: %v", err)
	}
	return t
}

// ChangedKeys returns the keys upserted or removed from prev to next,
// sorted: what proxytable.Apply reports to a partial sync.
func ChangedKeys(prev, next *proxytable.Table) []string {
	var changed []string
	for k, e := range next.Entries {
		if old, ok := prev.Entries[k]; !ok || old.GetHash() != e.GetHash() {
			changed = append(changed, k)
		}
	}
	for k := range prev.Entries {
		if _, ok := next.Entries[k]; !ok {
			changed = append(changed, k)
		}
	}
	slices.Sort(changed)
	return changed
}

// Sorted returns the Services of m in key order, leaving out those of the
// keys in except.
func Sorted(m map[string]*pb.Service, except ...string) []*pb.Service {
	var out []*pb.Service
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(except, k) {
			out = append(out, m[k])
		}
	}
	return out
}

// AddrAt returns base + off as an IPv4 address.
func AddrAt(base string, off int) string {
	b := netip.MustParseAddr(base).As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// ScaleServices returns n ClusterIP+NodePort Services "ns/svc-i" with
// perSvc endpoints each, for size tests and benchmarks. Service i has
// cluster IP 10.96.0.0+i+1 and NodePort 30000+i%2000 (a reused NodePort
// is claimed by the first Service, as a conflict would be; rule loading
// does not mind); endpoints are in 10.128.0.0/9.
func ScaleServices(n, perSvc int) []*pb.Service {
	out := make([]*pb.Service, 0, n)
	for i := range n {
		s := Svc("ns", "svc-"+strconv.Itoa(i), AddrAt("10.96.0.0", i+1))
		s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
		s.Ports = []*pb.ServicePort{Port("http", TCP, 80, int32(30000+i%2000), true)}
		addrs := make([]string, perSvc)
		for j := range perSvc {
			addrs[j] = AddrAt("10.128.0.0", i*perSvc+j+1) + ":8080"
		}
		s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", addrs...)}
		out = append(out, s)
	}
	return out
}

// EndpointChange returns a copy of s (one of ScaleServices) whose
// endpoints are the i-th of two alternating sets: the change a
// benchmark's partial sync applies.
func EndpointChange(s *pb.Service, i int) *pb.Service {
	s = proto.CloneOf(s)
	s.ClusterEndpoints = []*pb.PortEndpoints{Eps("http", AddrAt("10.64.0.0", 1+i%2)+":8080", AddrAt("10.64.0.0", 3)+":8080")}
	return s
}

// Toggle returns t with s added for even i and removed for odd i: the
// change a benchmark's partial sync of a whole Service applies.
func Toggle(tb testing.TB, t *proxytable.Table, s *pb.Service, i int) *proxytable.Table {
	tb.Helper()
	if i%2 == 0 {
		return Replace(tb, t, s)
	}
	return Remove(tb, t, s.Namespace+"/"+s.Name)
}
