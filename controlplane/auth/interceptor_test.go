package auth

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// hookServer is a TableService that calls the hooks where server.Server
// does: Sync after the hello, the reads before answering.
type hookServer struct {
	pb.UnimplementedTableServiceServer
	a *Authenticator
}

func (s hookServer) Sync(stream grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	return s.a.Authorize(stream.Context(), m.GetHello().GetNodeName())
}

func (s hookServer) WatchTable(req *pb.WatchTableRequest, stream grpc.ServerStreamingServer[pb.WatchTableResponse]) error {
	return s.a.AuthorizeRead(stream.Context(), req.GetNodeName())
}

func (s hookServer) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	return &pb.ListNodesResponse{}, s.a.AuthorizeRead(ctx, "")
}

func (s hookServer) ListEvents(ctx context.Context, _ *pb.ListEventsRequest) (*pb.ListEventsResponse, error) {
	return &pb.ListEventsResponse{}, s.a.AuthorizeRead(ctx, "")
}

// serve runs a over bufconn, as the control plane installs it, and
// returns a client connection.
func serve(t *testing.T, a *Authenticator) *grpc.ClientConn {
	t.Helper()
	return serveWith(t, a, hookServer{a: a})
}

// serveWith runs a over bufconn in front of srv.
func serveWith(t *testing.T, a *Authenticator, srv pb.TableServiceServer) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor()))
	pb.RegisterTableServiceServer(gs, srv)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// call makes one RPC with authorization (if not "") and returns its code.
func call(t *testing.T, cc *grpc.ClientConn, rpc, authorization, node string) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if authorization != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", authorization)
	}
	c := pb.NewTableServiceClient(cc)
	var err error
	switch rpc {
	case "Sync":
		var s grpc.BidiStreamingClient[pb.SyncRequest, pb.SyncResponse]
		if s, err = c.Sync(ctx); err == nil {
			_ = s.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: node}}})
			_, err = s.Recv()
		}
	case "WatchTable":
		var s grpc.ServerStreamingClient[pb.WatchTableResponse]
		if s, err = c.WatchTable(ctx, &pb.WatchTableRequest{NodeName: node}); err == nil {
			_, err = s.Recv()
		}
	case "ListNodes":
		_, err = c.ListNodes(ctx, &pb.ListNodesRequest{})
	case "ListEvents":
		_, err = c.ListEvents(ctx, &pb.ListEventsRequest{})
	case "Health":
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	default:
		t.Fatalf("unknown rpc %s", rpc)
	}
	if errors.Is(err, io.EOF) {
		return codes.OK
	}
	return status.Code(err)
}

// TestIdentityRules checks every refusal, and every acceptance, of the
// contract: Unauthenticated for no or bad tokens, PermissionDenied for
// valid tokens that may not do what they ask. Agent tokens are bound to
// agent Pods that this replica sees; every other binding is an attack.
func TestIdentityRules(t *testing.T) {
	f := newFakeAPI()
	a, _ := newTestAuthenticator(t, f, Config{})
	cc := serve(t, a)
	hour := time.Now().Add(time.Hour)
	ours := []string{DefaultAudience}

	pod1 := agentPod("node-1")
	setPod(t, a, pod1)
	agent1 := "Bearer " + f.podToken(pod1, ours, hour)
	// A compromised node mints what its credentials allow: tokens bound
	// to a Node (`kubectl create token proxyplane-nodeagent --audience
	// proxyplane --bound-object-kind Node --bound-object-name victim`),
	// or to nothing.
	nodeBound := "Bearer " + f.token(agentUser, ours, "node-1", hour)
	unbound := "Bearer " + f.token(agentUser, ours, "", hour)
	otherSA := "Bearer " + f.token("system:serviceaccount:default:intruder", ours, "node-1", hour)
	agentForAPI := "Bearer " + f.podToken(pod1, []string{apiAudience}, hour)
	expired := "Bearer " + f.podToken(pod1, ours, time.Now().Add(-time.Minute))
	// Pods of the agents' ServiceAccount that are not agent Pods of the
	// DaemonSet, and a Pod replaced since its token was minted.
	bare := agentPod("node-2")
	bare.OwnerReferences = nil
	setPod(t, a, bare)
	foreign := agentPod("node-2")
	foreign.OwnerReferences[0].Kind, foreign.OwnerReferences[0].Name = "ReplicaSet", "intruder"
	setPod(t, a, foreign)
	otherDS := agentPod("node-2")
	otherDS.OwnerReferences[0].Name = "intruder"
	setPod(t, a, otherDS)
	notController := agentPod("node-2")
	notController.OwnerReferences[0].Controller = nil
	setPod(t, a, notController)
	replaced := agentPod("node-2")
	replacedToken := "Bearer " + f.podToken(replaced, ours, hour)
	replaced.UID = "uid-of-the-new-pod"
	setPod(t, a, replaced)
	failed := agentPod("node-2")
	failed.Status.Phase = corev1.PodFailed
	setPod(t, a, failed)
	unseen := agentPod("node-2")
	// A token naming another node than its Pod's, which an API server
	// never issues: the Pod, as this replica sees it, decides.
	elsewhere := "Bearer " + f.register(tokenInfo{user: agentUser, audiences: ours, node: "node-2", pod: pod1.Name, podUID: string(pod1.UID)}, hour)

	reader := "Bearer " + f.token("alice", ours, "", hour)
	readerForAPI := "Bearer " + f.token("alice", []string{apiAudience}, "", hour)
	nobody := "Bearer " + f.token("mallory", ours, "", hour)
	f.setReader("alice", true)
	podTok := func(p *corev1.Pod) string { return "Bearer " + f.podToken(p, ours, hour) }

	cases := []struct {
		name          string
		rpc           string
		authorization string
		node          string
		want          codes.Code
	}{
		{"agent syncs its node", "Sync", agent1, "node-1", codes.OK},
		{"agent syncs another node", "Sync", agent1, "node-2", codes.PermissionDenied},
		{"sync without a token", "Sync", "", "node-1", codes.Unauthenticated},
		{"sync with a basic header", "Sync", "Basic dXNlcjpwYXNz", "node-1", codes.Unauthenticated},
		{"sync with an empty bearer", "Sync", "Bearer ", "node-1", codes.Unauthenticated},
		{"sync with an unknown token", "Sync", "Bearer " + jwt(ours, hour), "node-1", codes.Unauthenticated},
		{"sync with an opaque garbage token", "Sync", "Bearer garbage", "node-1", codes.Unauthenticated},
		{"sync with an expired token", "Sync", expired, "node-1", codes.Unauthenticated},
		{"sync with the agent's token for the API server", "Sync", agentForAPI, "node-1", codes.Unauthenticated},
		{"sync with a reader's token", "Sync", reader, "node-1", codes.PermissionDenied},
		{"sync with a reader's token for the API server", "Sync", readerForAPI, "node-1", codes.Unauthenticated},
		{"sync with another service account's token", "Sync", otherSA, "node-1", codes.PermissionDenied},
		{"sync with a token bound to no object", "Sync", unbound, "node-1", codes.PermissionDenied},
		{"sync with a token bound to the Node", "Sync", nodeBound, "node-1", codes.PermissionDenied},
		{"sync with the token of a Pod no controller owns", "Sync", podTok(bare), "node-2", codes.PermissionDenied},
		{"sync with the token of a ReplicaSet's Pod", "Sync", podTok(foreign), "node-2", codes.PermissionDenied},
		{"sync with the token of another DaemonSet's Pod", "Sync", podTok(otherDS), "node-2", codes.PermissionDenied},
		{"sync with the token of a Pod the DaemonSet owns but does not control", "Sync", podTok(notController), "node-2", codes.PermissionDenied},
		{"sync with the token of a replaced Pod", "Sync", replacedToken, "node-2", codes.PermissionDenied},
		{"sync with the token of a failed Pod", "Sync", podTok(failed), "node-2", codes.PermissionDenied},
		{"sync with the token of a Pod this replica never saw", "Sync", podTok(unseen), "node-2", codes.PermissionDenied},
		{"sync with a token naming another node than its Pod's", "Sync", elsewhere, "node-2", codes.PermissionDenied},
		{"agent watches its node", "WatchTable", agent1, "node-1", codes.OK},
		{"agent watches another node", "WatchTable", agent1, "node-2", codes.PermissionDenied},
		{"node-bound token watches its node", "WatchTable", nodeBound, "node-1", codes.PermissionDenied},
		{"agent lists nodes", "ListNodes", agent1, "", codes.PermissionDenied},
		{"agent lists events", "ListEvents", agent1, "", codes.PermissionDenied},
		{"another service account watches", "WatchTable", otherSA, "node-1", codes.PermissionDenied},
		{"reader watches any node", "WatchTable", reader, "node-2", codes.OK},
		{"reader lists nodes", "ListNodes", reader, "", codes.OK},
		{"reader lists events", "ListEvents", reader, "", codes.OK},
		{"reader's token for the API server lists nodes", "ListNodes", readerForAPI, "", codes.Unauthenticated},
		{"reader's token for the API server watches", "WatchTable", readerForAPI, "node-2", codes.Unauthenticated},
		{"user without list endpointslices", "ListNodes", nobody, "", codes.PermissionDenied},
		{"user without list endpointslices watches", "WatchTable", nobody, "node-1", codes.PermissionDenied},
		{"list nodes without a token", "ListNodes", "", "", codes.Unauthenticated},
		{"list nodes with an opaque token", "ListNodes", "Bearer garbage", "", codes.Unauthenticated},
		{"watch without a token", "WatchTable", "", "node-1", codes.Unauthenticated},
		{"list events with an unknown token", "ListEvents", "Bearer " + jwt(ours, hour), "", codes.Unauthenticated},
		{"health stays open", "Health", "", "", codes.OK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := call(t, cc, tc.rpc, tc.authorization, tc.node); got != tc.want {
				t.Errorf("%s: got %s, want %s", tc.rpc, got, tc.want)
			}
		})
	}
	t.Run("API server down", func(t *testing.T) {
		f.setFail(errAPIDown)
		defer f.setFail(nil)
		pod3 := agentPod("node-3")
		setPod(t, a, pod3)
		if got := call(t, cc, "Sync", podTok(pod3), "node-3"); got != codes.Unavailable {
			t.Errorf("got %s, want Unavailable", got)
		}
	})
}

// TestAPIServerAudienceNeverReviewed: a token for the API server's own
// audiences (what an operator's kubectl holds) is refused without being
// sent anywhere, so that the control plane never asks callers for one;
// a token for the control plane's audience is reviewed for it alone.
func TestAPIServerAudienceNeverReviewed(t *testing.T) {
	f := newFakeAPI()
	a, _ := newTestAuthenticator(t, f, Config{})
	cc := serve(t, a)
	f.setReader("alice", true)
	hour := time.Now().Add(time.Hour)
	for _, rpc := range []string{"ListNodes", "ListEvents", "WatchTable", "Sync"} {
		if got := call(t, cc, rpc, "Bearer "+f.token("alice", []string{apiAudience}, "", hour), "node-1"); got != codes.Unauthenticated {
			t.Errorf("%s with a token for the API server: %s, want Unauthenticated", rpc, got)
		}
	}
	if n := f.tokenReviews.Load(); n != 0 {
		t.Errorf("%d TokenReviews of tokens for the API server, want none", n)
	}
	var audiences []string
	f.PrependReactor("create", "tokenreviews", func(act k8stesting.Action) (bool, runtime.Object, error) {
		audiences = act.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).Spec.Audiences
		return false, nil, nil
	})
	if got := call(t, cc, "ListNodes", "Bearer "+f.token("alice", []string{DefaultAudience}, "", hour), ""); got != codes.OK {
		t.Errorf("ListNodes with a token for %s: %s, want OK", DefaultAudience, got)
	}
	if !slices.Equal(audiences, []string{DefaultAudience}) {
		t.Errorf("reviewed for audiences %q, want only %q", audiences, DefaultAudience)
	}
}

// TestHooksWithoutInterceptor: a hook reached without an identity (the
// interceptor not installed) refuses rather than admits.
func TestHooksWithoutInterceptor(t *testing.T) {
	a, _ := newTestAuthenticator(t, newFakeAPI(), Config{})
	if err := a.Authorize(context.Background(), "node-1"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Authorize: %v, want Unauthenticated", err)
	}
	if err := a.AuthorizeRead(context.Background(), ""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("AuthorizeRead: %v, want Unauthenticated", err)
	}
}

func TestParseServiceAccount(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"default", DefaultAgentServiceAccount, agentUser},
		{"no slash", "proxyplane-nodeagent", ""},
		{"two slashes", "a/b/c", ""},
		{"bad namespace", "Kube_System/x", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseServiceAccount(tc.in)
			if got != tc.want || (err == nil) != (tc.want != "") {
				t.Errorf("ParseServiceAccount(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}
