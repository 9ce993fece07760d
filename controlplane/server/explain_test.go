package server

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// hintedCluster is a store with nodes node-1 (zone-a) and node-2
// (zone-b), and Service default/hinted whose two endpoints are hinted one
// for each zone, with internalTrafficPolicy Local on a second port.
func hintedCluster(t testing.TB) *table.Store {
	t.Helper()
	store := table.NewStore(100)
	nodes := map[string]*compute.Node{}
	for name, zone := range map[string]string{"node-1": "zone-a", "node-2": "zone-b"} {
		nodes[name] = compute.BuildNode(name, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone},
		}})
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hinted"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "172.30.0.20",
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053},
			},
			LoadBalancerSourceRanges: []string{"203.0.113.0/24"},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "hinted-1"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))},
			{Name: ptr("dns"), Protocol: ptr(corev1.ProtocolUDP), Port: ptr(int32(5353))},
		},
	}
	for i, zone := range []string{"zone-a", "zone-b"} {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{[]string{"10.1.0.1", "10.2.0.1"}[i]},
			NodeName:  ptr([]string{"node-1", "node-2"}[i]),
			Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		})
	}
	s, err := compute.Build(svc, []*discoveryv1.EndpointSlice{slice})
	if err != nil {
		t.Fatal(err)
	}
	store.Publish(map[string]*compute.Service{"default/hinted": s}, nodes)
	return store
}

func explain(t testing.TB, client pb.TableServiceClient, req *pb.ExplainRequest) *pb.ExplainResponse {
	t.Helper()
	resp, err := client.Explain(context.Background(), req)
	if err != nil {
		t.Fatalf("Explain(%v): %v", req, err)
	}
	return resp
}

// TestExplainMatchesWatchTable holds Explain's endpoint sets, for every
// node and port, against the entry WatchTable sends for that node, and
// its version against the snapshot's.
func TestExplainMatchesWatchTable(t *testing.T) {
	store := hintedCluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	for _, node := range []string{"node-1", "node-2"} {
		ctx, cancel := context.WithCancel(context.Background())
		w, err := client.WatchTable(ctx, &pb.WatchTableRequest{NodeName: node})
		if err != nil {
			t.Fatal(err)
		}
		first, err := w.Recv()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		snap := first.GetSnapshot()
		resp := explain(t, client, &pb.ExplainRequest{NodeName: node, Namespace: "default", Name: "hinted"})
		if resp.GetVersion() != snap.GetVersion() {
			t.Errorf("%s: Explain's version %s, WatchTable's %s", node, resp.GetVersion(), snap.GetVersion())
		}
		entry := snap.GetEntries()[0]
		if resp.GetEntryHash() != compute.FormatVersion(entry.GetHash()) {
			t.Errorf("%s: entry hash %s, table's %016x", node, resp.GetEntryHash(), entry.GetHash())
		}
		if len(resp.GetService().GetPorts()) != 2 {
			t.Fatalf("%s: %d ports explained, want 2", node, len(resp.GetService().GetPorts()))
		}
		for _, pe := range resp.GetService().GetPorts() {
			cluster, local := compute.ExplainedEndpoints(pe)
			for _, c := range []struct {
				what      string
				got, want []*pb.PortEndpoints
			}{
				{"cluster", cluster, portOnly(entry.GetService().GetClusterEndpoints(), pe.GetName())},
				{"local", local, portOnly(entry.GetService().GetLocalEndpoints(), pe.GetName())},
			} {
				if len(c.got) != len(c.want) || (len(c.got) == 1 && !proto.Equal(c.got[0], c.want[0])) {
					t.Errorf("%s port %s: %s endpoints explained %v, table has %v", node, pe.GetName(), c.what, c.got, c.want)
				}
			}
		}
		// The zone hints keep each node on its zone's endpoint.
		got := resp.GetService().GetPorts()[0].GetFamilies()[0].GetCluster()
		if len(got.GetEndpoints()) != 1 || got.GetTopology() != "zone" {
			t.Errorf("%s: cluster set %v topology %q, want one endpoint by zone", node, got.GetEndpoints(), got.GetTopology())
		}
	}
}

func portOnly(lists []*pb.PortEndpoints, name string) []*pb.PortEndpoints {
	for _, pe := range lists {
		if pe.GetPortName() == name {
			return []*pb.PortEndpoints{pe}
		}
	}
	return nil
}

// TestExplainAcknowledged follows one node through its agent's stream:
// not connected, connected before its ACK, acknowledged, then behind
// after a change until it ACKs again.
func TestExplainAcknowledged(t *testing.T) {
	store := hintedCluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	req := &pb.ExplainRequest{NodeName: "node-1", Namespace: "default", Name: "hinted"}
	check := func(what string, connected, acked bool) *pb.ExplainResponse {
		t.Helper()
		var resp *pb.ExplainResponse
		eventually(t, what, func() bool {
			resp = explain(t, client, req)
			return resp.GetConnected() == connected && resp.GetAcknowledged() == acked
		})
		if acked && (resp.GetAckedVersion() != resp.GetVersion() || resp.GetAckedAt() == nil) {
			t.Errorf("%s: acked %s at %v, version %s", what, resp.GetAckedVersion(), resp.GetAckedAt(), resp.GetVersion())
		}
		return resp
	}
	if resp := check("not connected", false, false); resp.GetAckedVersion() != "" || !resp.GetRegistered() || resp.GetZone() != "zone-a" {
		t.Errorf("before any agent: %v", resp)
	}
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	r := a.recv()
	check("connected, not acknowledged", true, false)
	a.ack(r)
	before := check("acknowledged", true, true)

	// A change to another Service moves node-1's table: the entry
	// explained is the same, but the version holding it is not yet
	// acknowledged.
	publish(t, store, map[string]*compute.Service{"other": service(t, "other", 1, 9)})
	after := check("behind after a change", true, false)
	if after.GetVersion() == before.GetVersion() || after.GetAckedVersion() != before.GetVersion() {
		t.Errorf("after the change: version %s acked %s; before: version %s", after.GetVersion(), after.GetAckedVersion(), before.GetVersion())
	}
	a.ack(a.recv())
	check("acknowledged again", true, true)
	a.close()
	// Disconnected, the last acknowledgement still counts for the version
	// it names.
	check("disconnected", false, true)
}

func TestExplainNotFound(t *testing.T) {
	store := hintedCluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	for _, tc := range []struct {
		name string
		req  *pb.ExplainRequest
		code codes.Code
		want string
	}{
		{"unknown node", &pb.ExplainRequest{NodeName: "node-9", Namespace: "default", Name: "hinted"}, codes.NotFound, `node "node-9": no Node object`},
		{"unknown Service", &pb.ExplainRequest{NodeName: "node-1", Namespace: "default", Name: "nope"}, codes.NotFound, "Service default/nope is in no table"},
		{"unknown port name", &pb.ExplainRequest{NodeName: "node-1", Namespace: "default", Name: "hinted", Port: "grpc"}, codes.NotFound, `no port named or numbered "grpc" (ports: http 80/TCP, dns 53/UDP)`},
		{"unknown port number", &pb.ExplainRequest{NodeName: "node-1", Namespace: "default", Name: "hinted", Port: "81"}, codes.NotFound, `"81"`},
		{"no node", &pb.ExplainRequest{Namespace: "default", Name: "hinted"}, codes.InvalidArgument, "node name is empty"},
		{"no name", &pb.ExplainRequest{NodeName: "node-1", Namespace: "default"}, codes.InvalidArgument, "namespace and name"},
		{"bad namespace", &pb.ExplainRequest{NodeName: "node-1", Namespace: "Default/x", Name: "hinted"}, codes.InvalidArgument, "namespace"},
		{"bad from", &pb.ExplainRequest{NodeName: "node-1", Namespace: "default", Name: "hinted", From: "10.0.0.0/8"}, codes.InvalidArgument, "not an IP address"},
		{"long port", &pb.ExplainRequest{NodeName: "node-1", Namespace: "default", Name: "hinted", Port: strings.Repeat("p", 64)}, codes.InvalidArgument, "port is 64 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.Explain(context.Background(), tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Errorf("Explain: %v; want %s with %q", err, tc.code, tc.want)
			}
		})
	}

	// A port by name, by number and by node port selects that port only;
	// from is checked against the source ranges.
	for _, p := range []string{"dns", "53", "30053"} {
		resp := explain(t, client, &pb.ExplainRequest{NodeName: "node-2", Namespace: "default", Name: "hinted", Port: p, From: "198.51.100.1"})
		if ports := resp.GetService().GetPorts(); len(ports) != 1 || ports[0].GetName() != "dns" {
			t.Errorf("port %q: explained %d ports", p, len(ports))
		}
		if src := resp.GetService().GetSource(); src.GetAllowed() || src.GetFrom() != "198.51.100.1" {
			t.Errorf("from 198.51.100.1, ranges 203.0.113.0/24: %v", src)
		}
	}
	if src := explain(t, client, &pb.ExplainRequest{NodeName: "node-2", Namespace: "default", Name: "hinted", From: "203.0.113.7"}).GetService().GetSource(); !src.GetAllowed() {
		t.Errorf("from 203.0.113.7, ranges 203.0.113.0/24: %v", src)
	}

	// An agent connected under a name no Node carries has a table: it is
	// explained, as unregistered.
	a := connect(t, client, &pb.Hello{NodeName: "node-9"})
	a.ack(a.recv())
	var resp *pb.ExplainResponse
	eventually(t, "node-9 explained", func() bool {
		var err error
		resp, err = client.Explain(context.Background(), &pb.ExplainRequest{NodeName: "node-9", Namespace: "default", Name: "hinted"})
		return err == nil && resp.GetAcknowledged()
	})
	if resp.GetRegistered() || !resp.GetConnected() {
		t.Errorf("node-9: registered %v connected %v, want unregistered and connected", resp.GetRegistered(), resp.GetConnected())
	}
}

// TestExplainAuthorizedAsWatchTable: Explain asks AuthorizeRead about the
// node explained, as WatchTable does, before looking anything up: a
// caller without rights gets PermissionDenied whether or not the node or
// Service exists, and one with rights is answered.
func TestExplainAuthorizedAsWatchTable(t *testing.T) {
	store := hintedCluster(t)
	var mu sync.Mutex
	var asked []string
	client, _, _ := newTestServer(t, store, Options{AuthorizeRead: func(_ context.Context, node string) error {
		mu.Lock()
		asked = append(asked, node)
		mu.Unlock()
		if node == "node-1" {
			return nil
		}
		return errors.New("an agent token reads its own node's table only")
	}})
	explain(t, client, &pb.ExplainRequest{NodeName: "node-1", Namespace: "default", Name: "hinted"})
	for _, req := range []*pb.ExplainRequest{
		{NodeName: "node-2", Namespace: "default", Name: "hinted"},
		{NodeName: "node-2", Namespace: "default", Name: "nope"},
		{NodeName: "node-9", Namespace: "default", Name: "hinted"},
	} {
		_, err := client.Explain(context.Background(), req)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "own node") {
			t.Errorf("Explain(%v) without rights: %v, want PermissionDenied with the reason", req, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"node-1", "node-2", "node-2", "node-9"}; strings.Join(asked, ",") != strings.Join(want, ",") {
		t.Errorf("AuthorizeRead asked about %v, want %v", asked, want)
	}
}

// TestPortListUnknownProtocol checks that a protocol this replica does not
// know (a newer replica's table) is shown by number, not a panic.
func TestPortListUnknownProtocol(t *testing.T) {
	svc := &pb.Service{Ports: []*pb.ServicePort{
		{Name: "http", Port: 80, Protocol: pb.Protocol_PROTOCOL_TCP},
		{Port: 53, Protocol: pb.Protocol(99)},
	}}
	if got, want := portList(svc), "http 80/TCP, 53/99"; got != want {
		t.Errorf("portList = %q, want %q", got, want)
	}
}
