package app

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/keyutil"

	"github.com/proxyplane/proxyplane/controlplane/auth"
	"github.com/proxyplane/proxyplane/controlplane/certs"
	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// grpcurl finds the grpcurl binary that `make tools` builds into .bin.
func grpcurl(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("grpcurl not found on PATH: run `make tools` (make test does)")
	}
	t.Skip("grpcurl not found on PATH: run `make tools`, or use `make test`")
	return ""
}

// fixedEvents is an EventSource that always reports the same events.
type fixedEvents struct{ r *pb.ListEventsResponse }

func (f fixedEvents) Events() *pb.ListEventsResponse { return f.r }

// TestGRPCurl drives a live server with the commands the README shows.
func TestGRPCurl(t *testing.T) {
	bin := grpcurl(t)
	store := table.NewStore(100)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10",
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}},
		},
	}
	port, name := int32(8080), "http"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.5"}}},
	}
	built, err := compute.Build(svc, []*discoveryv1.EndpointSlice{slice})
	if err != nil {
		t.Fatal(err)
	}
	store.Publish(map[string]*compute.Service{built.Key: built},
		map[string]*compute.Node{"node-1": compute.BuildNode("node-1", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	events := fixedEvents{&pb.ListEventsResponse{Events: []*pb.Event{{
		Kind: compute.KindService, Namespace: "default", Name: "broken", Service: "default/broken",
		Reason: compute.ReasonInvalidService, Message: `clusterIPs: ParseAddr("10.96.0.300"): IPv4 field has value >255`,
		Count: 3, FirstSeen: timestamppb.New(time.Unix(1700000000, 0)), LastSeen: timestamppb.New(time.Unix(1700000300, 0)),
	}}}}
	sec, caFile, token := testSecurity(t)
	gs, _ := NewGRPCServer(store, events, NewOptions(), sec, Readiness{Synced: store.Ready(), Certified: sec.Ready}, slog.New(slog.DiscardHandler))
	go func() { _ = gs.Serve(sec.Limits.Listener(lis)) }()
	t.Cleanup(gs.Stop)
	addr := lis.Addr().String()

	// As an operator would: trusting the published bundle, naming the
	// Service, with a token from `kubectl create token`.
	tlsArgs := []string{"-cacert", caFile, "-servername", certs.ServerName("proxyplane-system")}
	try := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		return string(out), err
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := try(append(append(slices.Clone(tlsArgs), "-H", "authorization: Bearer "+token), args...)...)
		if err != nil && !strings.Contains(out, "DeadlineExceeded") {
			t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
		}
		return out
	}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"list", []string{addr, "list"}, []string{"proxyplane.v1.TableService", "grpc.health.v1.Health"}},
		{
			"describe",
			[]string{addr, "describe", "proxyplane.v1.TableService"},
			[]string{"rpc Sync ( stream .proxyplane.v1.SyncRequest )", "rpc WatchTable", "rpc ListNodes", "rpc ListEvents"},
		},
		{"health", []string{addr, "grpc.health.v1.Health/Check"}, []string{`"status": "SERVING"`}},
		{"list nodes", []string{addr, "proxyplane.v1.TableService/ListNodes"}, []string{`"nodeName": "node-1"`, `"known": true`}},
		{
			"list events",
			[]string{addr, "proxyplane.v1.TableService/ListEvents"},
			[]string{`"kind": "Service"`, `"name": "broken"`, `"reason": "InvalidService"`, `"count": 3`, `"firstSeen": "2023-11-14T22:13:20Z"`},
		},
		{
			"watch a table",
			[]string{"-max-time", "2", "-d", `{"node_name": "node-1"}`, addr, "proxyplane.v1.TableService/WatchTable"},
			[]string{`"key": "default/web"`, `"nodePort": 30080`, `"ip": "10.244.1.5"`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := run(tc.args...)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("grpcurl %s: output lacks %q:\n%s", tc.name, w, out)
				}
			}
		})
	}

	refusals := []struct {
		name string
		args []string
		want string
	}{
		{"plaintext", []string{"-plaintext", addr, "proxyplane.v1.TableService/ListNodes"}, "Failed to dial"},
		{"not trusting the bundle", []string{"-servername", certs.ServerName("proxyplane-system"), addr, "list"}, "certificate"},
		{"no token", append(slices.Clone(tlsArgs), addr, "proxyplane.v1.TableService/ListNodes"), "Code: Unauthenticated"},
		{"an unknown token", append(slices.Clone(tlsArgs), "-H", "authorization: Bearer nope", addr, "proxyplane.v1.TableService/ListEvents"), "Code: Unauthenticated"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			out, err := try(tc.args...)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Errorf("grpcurl %s: %v, output lacks %q:\n%s", tc.name, err, tc.want, out)
			}
		})
	}
	// Reflection and health stay open without a token.
	if out, err := try(append(slices.Clone(tlsArgs), addr, "grpc.health.v1.Health/Check")...); err != nil || !strings.Contains(out, "SERVING") {
		t.Errorf("health check without a token: %v\n%s", err, out)
	}

	// The watched snapshot is valid JSON for the generated types.
	out := run("-max-time", "2", "-d", `{"node_name": "node-1"}`, addr, "proxyplane.v1.TableService/WatchTable")
	first := out[:strings.Index(out, "\n}\n")+2]
	var msg map[string]any
	if err := json.Unmarshal([]byte(first), &msg); err != nil || msg["snapshot"] == nil {
		t.Errorf("first watch message is not a JSON snapshot (%v):\n%s", err, first)
	}
}

// testSecurity returns the control plane's TLS and authentication as
// deployed, over files in a temporary directory and a fake API server
// that accepts one reader token, whose user may list EndpointSlices. It
// returns the CA bundle's file and that token.
func testSecurity(t *testing.T) (sec *Security, caFile, token string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := certs.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, err := ca.Issue(certs.DNSNames("proxyplane-system"), nil, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(crt.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(dir, "ca.crt")
	o := NewOptions()
	// grpcurl opens a connection per command, and the test runs many in
	// a row from one address: more than an operator would.
	o.PeerRate = 0
	o.TLSCertFile, o.TLSKeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for f, b := range map[string][]byte{caFile: ca.CertPEM, o.TLSCertFile: pemOf(t, crt.Certificate[0]), o.TLSKeyFile: keyPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// A reader's token for the control plane's audience, shaped like the
	// JWT `kubectl create token --audience proxyplane` gives (only the
	// fake API server below judges its signature).
	enc := base64.RawURLEncoding.EncodeToString
	token = enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"aud":["`+auth.DefaultAudience+`"]}`)) + ".sig"
	client := fake.NewClientset()
	client.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if tr.Spec.Token == token && slices.Equal(tr.Spec.Audiences, []string{auth.DefaultAudience}) {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences, User: authnv1.UserInfo{Username: "alice"}}
		}
		return true, tr, nil
	})
	client.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		sar.Status.Allowed = sar.Spec.User == "alice" && sar.Spec.ResourceAttributes.Resource == "endpointslices"
		return true, sar, nil
	})
	sec, err = NewSecurity(client, client, o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return sec, caFile, token
}

func pemOf(t *testing.T, der []byte) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
