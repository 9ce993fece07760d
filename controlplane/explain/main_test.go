package explain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/server"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// waitFor bounds every wait in these tests.
const waitFor = 10 * time.Second

// TestMainAgainstReplicas runs the command against two plaintext
// replicas of one world: node-1's agent is connected to the second and
// has acknowledged its table, so the second's answer is the one shown,
// whichever order the replicas are given in.
func TestMainAgainstReplicas(t *testing.T) {
	store := testStore(t)
	first, second := serve(t, store, nil), serve(t, store, nil)
	connectAgent(t, second, "node-1")
	version := func(node string) string {
		w := store.Current()
		return compute.FormatVersion(w.Version(w.Node(node)))
	}
	for _, servers := range []string{first + "," + second, second + "," + first} {
		args := []string{"--insecure", "--server", servers, "--node", "node-1", "--service", "default/web"}
		var out struct {
			Replica     string `json:"replica"`
			Explanation struct {
				Version      string `json:"version"`
				Acknowledged bool   `json:"acknowledged"`
				Service      struct {
					Ports []struct {
						Name string `json:"name"`
					} `json:"ports"`
				} `json:"service"`
			} `json:"explanation"`
		}
		stdout, _ := runMain(t, 0, append(args, "-o", "json")...)
		if err := json.Unmarshal([]byte(stdout), &out); err != nil {
			t.Fatalf("-o json: %v:\n%s", err, stdout)
		}
		if out.Replica != second || !out.Explanation.Acknowledged || out.Explanation.Version != version("node-1") || len(out.Explanation.Service.Ports) != 2 {
			t.Errorf("--server %s: %+v; want %s's answer, acknowledged %s, 2 ports", servers, out, second, version("node-1"))
		}
	}

	text, _ := runMain(t, 0, "--insecure", "--server", first+","+second, "--node", "node-1", "--service", "default/web", "--port", "http", "--from", "203.0.113.9")
	for _, want := range []string{
		"Service default/web on node node-1 (zone zone-a), as replica " + second,
		"version       " + version("node-1"),
		"acknowledged  yes, at ",
		"; the agent is connected to this replica",
		"type          LoadBalancer",
		"policies      externalTrafficPolicy Cluster, internalTrafficPolicy Cluster",
		"affinity      ClientIP, 60s",
		"sourceRanges  203.0.113.0/24",
		"from 203.0.113.9  allowed: in loadBalancerSourceRanges entry 203.0.113.0/24",
		"port http TCP 80, nodePort 30080",
		"  IPv4  clusterIP 172.30.0.10  load balancer 192.0.2.10  external -",
		"    cluster endpoints: 10.1.0.1:8080",
		"      why: the 1 ready endpoint(s) hinted for zone zone-a, of 2 ready",
		"      topology zone: every ready endpoint has zone hints and some name zone zone-a",
		"      + 10.1.0.1:8080  node-1  ready, hinted for zone zone-a",
		"      - 10.2.0.1:8080  node-2  ready, but hinted for zone zone-b, not zone-a",
		"    local endpoints: not used",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "port dns") {
		t.Errorf("--port http printed another port:\n%s", text)
	}

	// node-2 is connected nowhere: the first answer is shown, and says so.
	text, stderr := runMain(t, 0, "--insecure", "--server", first+","+second, "--node", "node-2", "--service", "default/web")
	if !strings.Contains(text, "no: nothing acknowledged; the agent is not connected to this replica") || !strings.Contains(stderr, "connected to none of the replicas") {
		t.Errorf("node-2: stdout:\n%s\nstderr:\n%s", text, stderr)
	}
}

// TestMainRefusals checks that NotFound and PermissionDenied reach the
// operator with the replica's reason and exit 1, printing nothing on
// stdout.
func TestMainRefusals(t *testing.T) {
	store := testStore(t)
	open := serve(t, store, nil)
	closed := serve(t, store, func(context.Context, string) error {
		return status.Error(codes.PermissionDenied, "system:anonymous may not list endpointslices.discovery.k8s.io")
	})
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown node", []string{"--server", open, "--node", "node-9", "--service", "default/web"}, []string{"NotFound", `node "node-9"`}},
		{"unknown Service", []string{"--server", open, "--node", "node-1", "--service", "default/nope"}, []string{"NotFound", "default/nope is in no table"}},
		{"unknown port", []string{"--server", open, "--node", "node-1", "--service", "default/web", "--port", "8443"}, []string{"NotFound", "ports: http 80/TCP, dns 53/UDP"}},
		{"no rights", []string{"--server", closed, "--node", "node-1", "--service", "default/web"}, []string{"PermissionDenied", "may not list endpointslices"}},
		{"no rights, unknown node", []string{"--server", closed, "--node", "node-9", "--service", "default/web"}, []string{"PermissionDenied"}},
		// Reachable replicas' refusals win over one that is down.
		{"refusal and a replica down", []string{"--server", "127.0.0.1:1," + open, "--node", "node-9", "--service", "default/web", "--timeout", "2s"}, []string{"NotFound"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr := runMain(t, 1, append([]string{"--insecure"}, tc.args...)...)
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			if stdout != "" {
				t.Errorf("printed an answer:\n%s", stdout)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--insecure", "--server", "x:1", "--service", "a/b"}, "--node is required"},
		{[]string{"--insecure", "--server", "x:1", "--node", "n", "--service", "web"}, `--service: "web" is not namespace/name`},
		{[]string{"--insecure", "--server", "x:1", "--node", "n", "--service", "a/b/c"}, "is not namespace/name"},
		{[]string{"--insecure", "--server", "x:1", "--node", "n", "--service", "a/b", "--from", "10.0.0.0/8"}, `--from: "10.0.0.0/8" is not an IP address`},
		{[]string{"--node", "n", "--service", "a/b"}, "--server: at least one replica address is required"},
		{[]string{"--insecure", "--server", "x:1", "--node", "n", "--service", "a/b", "-o", "yaml"}, "--output"},
	} {
		_, stderr := runMain(t, 2, tc.args...)
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: stderr lacks %q:\n%s", tc.args, tc.want, stderr)
		}
	}
}

func TestPick(t *testing.T) {
	ok := &pb.ExplainResponse{Version: "a"}
	connected := &pb.ExplainResponse{Version: "b", Connected: true}
	down := errors.New("dialing: connection refused")
	notFound := status.Error(codes.NotFound, "no such Service")
	for _, tc := range []struct {
		name    string
		replies []Reply
		want    string // replica picked
	}{
		{"connected wins", []Reply{{"r1", ok, nil}, {"r2", connected, nil}}, "r2"},
		{"first answer", []Reply{{"r1", nil, down}, {"r2", ok, nil}, {"r3", ok, nil}}, "r2"},
		{"refusal over failure", []Reply{{"r1", nil, down}, {"r2", nil, notFound}}, "r2"},
		{"failure alone", []Reply{{"r1", nil, down}}, "r1"},
	} {
		if got := Pick(tc.replies); got.Replica != tc.want {
			t.Errorf("%s: picked %q, want %q", tc.name, got.Replica, tc.want)
		}
	}
	if got := Pick(nil); !errors.Is(got.Err, errNoReplica) {
		t.Errorf("no replies: %v", got.Err)
	}
}

func runMain(t *testing.T, wantCode int, args ...string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if code := Main(ctx, args, "test", &out, &errOut); code != wantCode {
		t.Fatalf("explain %q: exit %d, want %d; stderr:\n%s", args, code, wantCode, errOut.String())
	}
	return out.String(), errOut.String()
}

// serve serves store in plaintext on a TCP port, with authorizeRead as
// the server's AuthorizeRead, and returns its address.
func serve(t *testing.T, store *table.Store, authorizeRead func(context.Context, string) error) string {
	t.Helper()
	srv := server.New(store, server.Options{AuthorizeRead: authorizeRead}, slog.New(slog.DiscardHandler))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(server.GRPCOptions()...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() { srv.Shutdown(); gs.Stop() })
	return lis.Addr().String()
}

// connectAgent opens node's Sync stream on addr, acknowledges its first
// table, and waits until the replica's Explain says so.
func connectAgent(t *testing.T, addr, node string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := pb.NewTableServiceClient(conn)
	stream, err := client.Sync(ctx)
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
	ack := &pb.Ack{Version: resp.GetSnapshot().GetVersion(), Nonce: resp.GetNonce()}
	if err := stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: ack}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		x, err := client.Explain(ctx, &pb.ExplainRequest{NodeName: node, Namespace: "default", Name: "web"})
		if err != nil {
			t.Fatal(err)
		}
		if x.GetAcknowledged() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not acknowledged within %s", node, waitFor)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testStore publishes nodes node-1 (zone-a) and node-2 (zone-b) and
// LoadBalancer Service default/web: ports http (TCP) and dns (UDP), one
// endpoint per zone hinted for it, ClientIP affinity and a source range.
func testStore(t *testing.T) *table.Store {
	t.Helper()
	timeout := int32(60)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "172.30.0.10",
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053},
			},
			SessionAffinity:          corev1.ServiceAffinityClientIP,
			SessionAffinityConfig:    &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}},
			LoadBalancerSourceRanges: []string{"203.0.113.0/24"},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}}},
	}
	http, dns := "http", "dns"
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p8080, p5353 := int32(8080), int32(5353)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &http, Protocol: &tcp, Port: &p8080}, {Name: &dns, Protocol: &udp, Port: &p5353}},
	}
	nodes := map[string]*compute.Node{}
	for i, n := range []string{"node-1", "node-2"} {
		zone := []string{"zone-a", "zone-b"}[i]
		nodes[n] = compute.BuildNode(n, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelTopologyZone: zone}}})
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{[]string{"10.1.0.1", "10.2.0.1"}[i]},
			NodeName:  &n,
			Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		})
	}
	s, err := compute.Build(svc, []*discoveryv1.EndpointSlice{slice})
	if err != nil {
		t.Fatal(err)
	}
	store := table.NewStore(100)
	store.Publish(map[string]*compute.Service{"default/web": s}, nodes)
	return store
}
