package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

// newTestServer serves store over an in-memory connection and returns a
// client for it, its connection, and a way to dial more connections.
func newTestServer(t testing.TB, store *table.Store, opts Options) (pb.TableServiceClient, *grpc.ClientConn, func(...grpc.DialOption) pb.TableServiceClient) {
	t.Helper()
	client, conn, dial, _ := serve(t, New(store, opts, slog.New(slog.DiscardHandler)))
	return client, conn, dial
}

// serve serves srv over bufconn, returning a client, its connection, a
// dialer for more connections and the gRPC server.
func serve(t testing.TB, srv *Server) (pb.TableServiceClient, *grpc.ClientConn, func(...grpc.DialOption) pb.TableServiceClient, *grpc.Server) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(GRPCOptions()...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	dial := func(extra ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient("passthrough:///bufconn", append([]grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
		}, extra...)...)
		if err != nil {
			t.Fatalf("dialing bufconn: %v", err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	conn := dial()
	return pb.NewTableServiceClient(conn), conn, func(extra ...grpc.DialOption) pb.TableServiceClient {
		return pb.NewTableServiceClient(dial(extra...))
	}, gs
}

// service builds a ClusterIP Service with one TCP port and n ready
// endpoints whose addresses start at 10.<gen>.0.1, so that each gen gives
// different content.
func service(t testing.TB, name string, n, gen int) *compute.Service {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "172.30.0.10",
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for i := range n {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{fmt.Sprintf("10.%d.%d.%d", gen%256, i/250, i%250+1)},
		})
	}
	s, err := compute.Build(svc, []*discoveryv1.EndpointSlice{slice})
	if err != nil {
		t.Fatalf("building %s: %v", name, err)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// manyServices returns n Services, svc-000 on, of endpoints endpoints
// each, Service i of generation gen(i).
func manyServices(t testing.TB, n, endpoints int, gen func(i int) int) map[string]*compute.Service {
	t.Helper()
	svcs := make(map[string]*compute.Service, n)
	for i := range n {
		name := fmt.Sprintf("svc-%03d", i)
		svcs[name] = service(t, name, endpoints, gen(i))
	}
	return svcs
}

// each is gen for manyServices: Service i of generation i.
func each(i int) int { return i }

// first is gen for manyServices: every Service of generation 1.
func first(int) int { return 1 }

// publish publishes services (by name; nil removes) and fails the test if
// nothing changed.
func publish(t testing.TB, store *table.Store, services map[string]*compute.Service) {
	t.Helper()
	byKey := map[string]*compute.Service{}
	for name, s := range services {
		byKey[compute.Key("default", name)] = s
	}
	if n, _ := store.Publish(byKey, nil); n == 0 && store.Current().Revision > 1 {
		t.Fatalf("publish changed nothing")
	}
}

// agent is a test node agent driving one Sync stream.
type agent struct {
	t      testing.TB
	node   string
	stream grpc.BidiStreamingClient[pb.SyncRequest, pb.SyncResponse]
	cancel context.CancelFunc
	// What it holds, as a real agent would.
	version  string
	entries  map[string]uint64
	nodeHash uint64
	rv       uint64 // the highest resource_version it was sent
}

func connect(t testing.TB, client pb.TableServiceClient, hello *pb.Hello) *agent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := client.Sync(ctx)
	if err != nil {
		t.Fatalf("opening Sync: %v", err)
	}
	if hello.Capabilities == nil {
		hello.Capabilities = &pb.Capabilities{Deltas: true, Dataplane: "test"}
	}
	a := &agent{t: t, node: hello.NodeName, stream: stream, cancel: cancel, entries: map[string]uint64{}}
	a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: hello}})
	return a
}

func (a *agent) send(m *pb.SyncRequest) {
	a.t.Helper()
	if err := a.stream.Send(m); err != nil {
		a.t.Fatalf("%s: send: %v", a.node, err)
	}
}

// recv returns the next table response, answering keepalives.
func (a *agent) recv() *pb.SyncResponse {
	a.t.Helper()
	type result struct {
		m   *pb.SyncResponse
		err error
	}
	for {
		ch := make(chan result, 1)
		go func() { m, err := a.stream.Recv(); ch <- result{m, err} }()
		select {
		case r := <-ch:
			if r.err != nil {
				a.t.Fatalf("%s: recv: %v", a.node, r.err)
			}
			if r.m.GetKeepalive() != nil {
				a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}})
				continue
			}
			return r.m
		case <-time.After(waitFor):
			a.t.Fatalf("%s: no response within %s", a.node, waitFor)
		}
	}
}

// recvErr waits for the stream to fail and returns the error.
func (a *agent) recvErr() error {
	a.t.Helper()
	deadline := time.After(waitFor)
	errc := make(chan error, 1)
	go func() {
		for {
			if _, err := a.stream.Recv(); err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-deadline:
		a.t.Fatalf("%s: stream still open after %s", a.node, waitFor)
		return nil
	}
}

// apply applies a table response to what the agent holds, as a real agent
// does, and returns the version it now holds.
func (a *agent) apply(r *pb.SyncResponse) string {
	a.t.Helper()
	switch {
	case r.GetSnapshot() != nil:
		s := r.GetSnapshot()
		a.entries = map[string]uint64{}
		for _, e := range s.GetEntries() {
			a.entries[e.GetKey()] = e.GetHash()
		}
		a.nodeHash, a.version = s.GetNode().GetHash(), s.GetVersion()
	case r.GetDelta() != nil:
		d := r.GetDelta()
		if d.GetBaseVersion() != a.version {
			a.t.Fatalf("%s: delta from %s, but the agent holds %s", a.node, d.GetBaseVersion(), a.version)
		}
		for _, e := range d.GetUpserts() {
			a.entries[e.GetKey()] = e.GetHash()
		}
		for _, k := range d.GetRemovals() {
			delete(a.entries, k)
		}
		if d.GetNode() != nil {
			a.nodeHash = d.GetNode().GetHash()
		}
		a.version = d.GetVersion()
	default:
		a.t.Fatalf("%s: not a table response: %v", a.node, r)
	}
	a.rv = max(a.rv, r.GetSnapshot().GetResourceVersion(), r.GetDelta().GetResourceVersion())
	sum := a.nodeHash
	for _, h := range a.entries {
		sum += h
	}
	if got := compute.FormatVersion(sum); got != a.version {
		a.t.Fatalf("%s: entries add up to %s, response says %s", a.node, got, a.version)
	}
	return a.version
}

func (a *agent) ack(r *pb.SyncResponse) {
	a.t.Helper()
	a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: a.apply(r), Nonce: r.GetNonce()}}})
}

func (a *agent) nack(r *pb.SyncResponse, why string) {
	a.t.Helper()
	v := r.GetSnapshot().GetVersion() + r.GetDelta().GetVersion()
	a.send(&pb.SyncRequest{Kind: &pb.SyncRequest_Nack{Nack: &pb.Nack{
		Version: v, Nonce: r.GetNonce(), Error: why,
		EntryErrors: []*pb.EntryError{{Key: "default/a", Error: why}},
	}}})
}

// hello is what the agent would say when reconnecting.
func (a *agent) hello() *pb.Hello {
	return &pb.Hello{NodeName: a.node, Version: a.version, EntryHashes: a.entries, NodeHash: a.nodeHash, ResourceVersion: a.rv}
}

func (a *agent) close() {
	_ = a.stream.CloseSend()
	a.cancel()
}

// eventually polls cond until it holds or the wait bound passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func nodeStatus(t testing.TB, client pb.TableServiceClient, node string) *pb.NodeStatus {
	t.Helper()
	resp, err := client.ListNodes(context.Background(), &pb.ListNodesRequest{})
	if err != nil {
		t.Fatalf("ListNodes: %v", err)
	}
	for _, n := range resp.GetNodes() {
		if n.GetNodeName() == node {
			return n
		}
	}
	return nil
}

func keys(m *pb.Delta) (upserts, removals []string) {
	for _, e := range m.GetUpserts() {
		upserts = append(upserts, e.GetKey())
	}
	return upserts, m.GetRemovals()
}
