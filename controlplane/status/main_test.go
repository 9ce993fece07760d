package status

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
	"github.com/proxyplane/proxyplane/controlplane/certs"
	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/server"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

const testToken = "reader-token"

// TestMainAgainstReplicas runs the command against two replicas served
// over TCP with TLS, which admit ListNodes with testToken only: node-0's
// agent is connected to the first and current, node-1's to the second
// with its first table unacknowledged, and node-2 is connected nowhere.
func TestMainAgainstReplicas(t *testing.T) {
	caFile, crt := testCA(t)
	store := testStore(t, "node-0", "node-1", "node-2")
	first, second := serveTLS(t, store, caFile, crt), serveTLS(t, store, caFile, crt)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	connectAgent(t, first.agentConn, "node-0", true)
	connectAgent(t, second.agentConn, "node-1", false)
	args := []string{"--server", first.addr + "," + second.addr, "--ca-file", caFile, "--token-file", tokenFile}

	var rep Report
	stdout := runMain(t, 0, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("-o json printed no report (%v):\n%s", err, stdout)
	}
	version := func(node string) string {
		w := store.Current()
		return compute.FormatVersion(w.Version(w.Node(node)))
	}
	byNode := map[string]Row{}
	for _, r := range rep.Nodes {
		byNode[r.Node] = r
	}
	if r := byNode["node-0"]; !r.Connected || r.Replica != first.addr || r.AckedVersion != version("node-0") || r.Lag == nil || *r.Lag != 0 {
		t.Errorf("node-0: %+v; want connected to %s, acked %s, no lag", r, first.addr, version("node-0"))
	}
	if r := byNode["node-1"]; !r.Connected || r.Replica != second.addr || r.AckedVersion != "" || r.CurrentVersion != version("node-1") || r.Lag == nil || *r.Lag <= 0 {
		t.Errorf("node-1: %+v; want connected to %s, nothing acked, behind %s with a lag", r, second.addr, version("node-1"))
	}
	if r, ok := byNode["node-2"]; !ok || r.Connected || !r.Known || r.Lag != nil {
		t.Errorf("node-2: %+v (listed %v); want known, not connected, no lag", r, ok)
	}

	table := runMain(t, 0, args...)
	for _, want := range []string{"node-0  " + first.addr, "node-1  " + second.addr, "node-2  not connected"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}

	// One replica down: the other's nodes still show, and it is named.
	second.stop()
	table = runMain(t, 0, args...)
	if !strings.Contains(table, "node-0  "+first.addr) || !strings.Contains(table, "node-1  not connected") {
		t.Errorf("with %s down:\n%s", second.addr, table)
	}
}

// TestMainNoReplicaAnswers checks the exit status when every replica
// refuses: the token is not the one they admit.
func TestMainNoReplicaAnswers(t *testing.T) {
	caFile, crt := testCA(t)
	r := serveTLS(t, testStore(t, "node-0"), caFile, crt)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("someone-else"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), []string{"--server", r.addr, "--ca-file", caFile, "--token-file", tokenFile}, "test", &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "PermissionDenied") || !strings.Contains(stderr.String(), "no replica answered") {
		t.Errorf("exit %d, stderr %q; want 1, the refusal and \"no replica answered\"", code, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("printed a report with no replica answering:\n%s", stdout.String())
	}
}

func runMain(t *testing.T, wantCode int, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if code := Main(ctx, args, "test", &stdout, &stderr); code != wantCode {
		t.Fatalf("status %q: exit %d, want %d; stderr:\n%s", args, code, wantCode, stderr.String())
	}
	return stdout.String()
}

// replica is a control plane's gRPC server on a TCP port.
type replica struct {
	addr      string
	agentConn *grpc.ClientConn // for agents' Sync streams
	stop      func()
}

// serveTLS serves store with crt, admitting ListNodes with testToken, as
// the control plane's AuthorizeRead admits a reader allowed to list
// EndpointSlices.
func serveTLS(t *testing.T, store *table.Store, caFile string, crt *tls.Certificate) *replica {
	t.Helper()
	srv := server.New(store, server.Options{AuthorizeRead: func(ctx context.Context, node string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		if got := md.Get("authorization"); node != "" || len(got) != 1 || got[0] != "Bearer "+testToken {
			return status.Error(codes.PermissionDenied, "not the reader's token")
		}
		return nil
	}}, slog.New(slog.DiscardHandler))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*crt}, MinVersion: tls.VersionTLS12})
	gs := grpc.NewServer(append(server.GRPCOptions(), grpc.Creds(creds))...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	stop := func() { srv.Shutdown(); gs.Stop() }
	t.Cleanup(stop)

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(agentCreds(t, caFile)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &replica{addr: lis.Addr().String(), agentConn: conn, stop: stop}
}

// connectAgent opens node's Sync stream, takes its first table and, when
// ack is set, acknowledges it; it waits until the replica lists the node
// connected in that state.
func connectAgent(t *testing.T, conn *grpc.ClientConn, node string, ack bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := pb.NewTableServiceClient(conn).Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hello := &pb.Hello{NodeName: node, Capabilities: &pb.Capabilities{Deltas: true, Dataplane: "test"}}
	if err := stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil || resp.GetSnapshot() == nil {
		t.Fatalf("%s: first response %v, %v; want a snapshot", node, resp, err)
	}
	if ack {
		v := resp.GetSnapshot().GetVersion()
		if err := stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: v, Nonce: resp.GetNonce()}}}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(waitFor)
	for {
		list, err := pb.NewTableServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{}, grpc.PerRPCCredentials(adminclient.Bearer(testToken)))
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range list.GetNodes() {
			if st.GetNodeName() == node && st.GetConnected() && (st.GetAckedVersion() != "") == ack {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not listed connected (acked: %v) within %s: %v", node, ack, waitFor, list.GetNodes())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testCA writes a CA bundle and returns its file and a serving
// certificate for the name the command checks by default.
func testCA(t *testing.T) (string, *tls.Certificate) {
	t.Helper()
	ca, err := certs.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, err := ca.Issue(certs.DNSNames("proxyplane-system"), nil, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(f, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return f, crt
}

// agentCreds trust caFile, as an agent's --ca-file does.
func agentCreds(t *testing.T, caFile string) credentials.TransportCredentials {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the CA bundle")
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: certs.ServerName("proxyplane-system"), MinVersion: tls.VersionTLS12})
}

// testStore publishes a world with one Service and the named nodes.
func testStore(t *testing.T, nodes ...string) *table.Store {
	t.Helper()
	port := int32(8080)
	tcp := corev1.ProtocolTCP
	svc, err := compute.Build(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "172.30.0.10",
			Ports: []corev1.ServicePort{{Protocol: tcp, Port: 80}},
		},
	}, []*discoveryv1.EndpointSlice{{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Protocol: &tcp, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*compute.Node{}
	for _, n := range nodes {
		byName[n] = compute.BuildNode(n, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	store := table.NewStore(100)
	store.Publish(map[string]*compute.Service{compute.Key("default", "web"): svc}, byName)
	return store
}
