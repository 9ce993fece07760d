package tablehash

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestEntrySplitsParts checks Entry against the control plane's way of
// hashing: the shared part encoded without local_endpoints, the local part
// holding only them, each hashed; with a field this binary does not know
// (from a newer control plane) kept in the shared part.
func TestEntrySplitsParts(t *testing.T) {
	s := &pb.Service{
		Namespace: "default", Name: "web", ClusterIps: []string{"10.96.0.10"},
		Ports:            []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80}},
		ClusterEndpoints: []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{{Ip: "10.244.1.5", Port: 8080, Ready: true}}}},
		LocalEndpoints:   []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{{Ip: "10.244.1.5", Port: 8080, Ready: true}}}},
	}
	future := protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "from a newer control plane")
	s.ProtoReflect().SetUnknown(future)

	shared := proto.CloneOf(s)
	shared.LocalEndpoints = nil
	sharedBytes, err := deterministic.Marshal(shared)
	if err != nil {
		t.Fatal(err)
	}
	localBytes, err := deterministic.Marshal(&pb.Service{LocalEndpoints: s.LocalEndpoints})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Entry("default/web", s)
	if err != nil {
		t.Fatal(err)
	}
	if want := Combine("default/web", Part(sharedBytes), Part(localBytes)); got != want {
		t.Errorf("Entry = %#x, want %#x", got, want)
	}
	// Any change of content changes the hash.
	s.ClusterEndpoints[0].Endpoints[0].Port = 8081
	if again, _ := Entry("default/web", s); again == got {
		t.Error("a changed endpoint kept its hash")
	}
}

// TestEncodedEntryIsEntry checks that hashing a Service as encoded gives
// Entry's hash whatever the order of its parts: as the control plane lays
// an entry out (every shared field, then local_endpoints), in field order
// (a shared field, udp_serving_endpoints, after local_endpoints), and
// without local endpoints.
func TestEncodedEntryIsEntry(t *testing.T) {
	eps := []*pb.PortEndpoints{{PortName: "http", Endpoints: []*pb.Endpoint{{Ip: "10.244.1.5", Port: 8080, Ready: true}}}}
	s := &pb.Service{
		Namespace: "default", Name: "web", ClusterIps: []string{"10.96.0.10"},
		Ports:            []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80}},
		ClusterEndpoints: eps, LocalEndpoints: eps, UdpServingEndpoints: eps,
	}
	want, err := Entry("default/web", s)
	if err != nil {
		t.Fatal(err)
	}
	inOrder, err := deterministic.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	shared := proto.CloneOf(s)
	shared.LocalEndpoints = nil
	sharedBytes, err := deterministic.Marshal(shared)
	if err != nil {
		t.Fatal(err)
	}
	localBytes, err := deterministic.Marshal(&pb.Service{LocalEndpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"control plane's layout": append(sharedBytes, localBytes...), "field order": inOrder} {
		if got, err := EncodedEntry([]byte("default/web"), b); err != nil || got != want {
			t.Errorf("%s: EncodedEntry = %#x, %v; want %#x", name, got, err, want)
		}
	}
	if got, err := EncodedEntry([]byte("default/web"), sharedBytes); err != nil || got != Combine("default/web", Part(sharedBytes), Part(nil)) {
		t.Errorf("without local endpoints: EncodedEntry = %#x, %v", got, err)
	}
	if _, err := EncodedEntry([]byte("default/web"), []byte{0x0a, 5, 'x'}); err == nil {
		t.Error("EncodedEntry of a truncated service: no error")
	}
}

func TestNodeIgnoresItsHash(t *testing.T) {
	n := &pb.NodeInfo{Name: "node-a", PodCidrs: []string{"10.244.1.0/24"}}
	h, err := Node(n)
	if err != nil {
		t.Fatal(err)
	}
	n.Hash = h
	if again, _ := Node(n); again != h {
		t.Errorf("the hash field changed the hash: %#x, then %#x", h, again)
	}
	if n.Hash != h {
		t.Error("Node modified its argument")
	}
}
