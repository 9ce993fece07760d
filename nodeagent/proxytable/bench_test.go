package proxytable

import (
	"fmt"
	"net/netip"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// BenchmarkCheck10k is what an agent spends checking a snapshot of
// 10,000 Services (3 endpoints each, honest hashes) before it saves or
// programs anything: FromSnapshot's validation against the API server's
// rules, and the policy (hashes recomputed, nothing capturing the
// control plane or the node). docs/benchmarks.md records it.
func BenchmarkCheck10k(b *testing.B) {
	const services = 10000
	n := &pb.NodeInfo{Name: "node-1", ServiceCidrs: []string{"10.96.0.0/16"}}
	var err error
	if n.Hash, err = tablehash.Node(n); err != nil {
		b.Fatal(err)
	}
	entries := make([]*pb.ServiceEntry, services)
	sum := n.GetHash()
	for i := range entries {
		name := fmt.Sprintf("svc-%d", i)
		s := &pb.Service{
			Namespace: "default", Name: name, ClusterIps: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)},
			Ports: []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, NodePort: int32(30000 + i%2768), HasEndpoints: true}},
		}
		pe := &pb.PortEndpoints{PortName: "http"}
		for j := range 3 {
			pe.Endpoints = append(pe.Endpoints, &pb.Endpoint{Ip: fmt.Sprintf("10.244.%d.%d", j, i%250+1), Port: 8080, Ready: true, Serving: true})
		}
		s.ClusterEndpoints = []*pb.PortEndpoints{pe}
		e := &pb.ServiceEntry{Key: "default/" + name, Service: s}
		if e.Hash, err = tablehash.Entry(e.Key, s); err != nil {
			b.Fatal(err)
		}
		sum += e.Hash
		entries[i] = e
	}
	snap := &pb.Snapshot{Version: fmt.Sprintf("%016x", sum), Node: n, Entries: entries}
	policy := &Policy{ControlPlanes: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.10:9640")}}
	tb, err := FromSnapshot(snap)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("validate", func(b *testing.B) {
		for b.Loop() {
			if _, err := FromSnapshot(snap); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("policy", func(b *testing.B) {
		for b.Loop() {
			if err := policy.Check(tb, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
