package auth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// holdServer is a TableService whose streams, once the hooks admit them,
// send one message and stay open until their context ends, as
// server.Server's do: Sync returns its context's cause, WatchTable nil.
type holdServer struct {
	pb.UnimplementedTableServiceServer
	a *Authenticator
}

func (s holdServer) Sync(stream grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := s.a.Authorize(stream.Context(), m.GetHello().GetNodeName()); err != nil {
		return err
	}
	if err := stream.Send(&pb.SyncResponse{Kind: &pb.SyncResponse_Keepalive{Keepalive: &pb.Keepalive{}}}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return context.Cause(stream.Context())
}

func (s holdServer) WatchTable(req *pb.WatchTableRequest, stream grpc.ServerStreamingServer[pb.WatchTableResponse]) error {
	if err := s.a.AuthorizeRead(stream.Context(), req.GetNodeName()); err != nil {
		return err
	}
	if err := stream.Send(&pb.WatchTableResponse{Kind: &pb.WatchTableResponse_Snapshot{Snapshot: &pb.Snapshot{}}}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// openStream is a stream admitted by the server; ended receives the
// error that ended it.
type openStream struct {
	name  string
	ended chan error
}

// open opens rpc ("Sync" or "WatchTable") for node with token and waits
// until the server admitted it (its first message).
func open(t *testing.T, cc *grpc.ClientConn, rpc, token, node string) *openStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	c := pb.NewTableServiceClient(cc)
	var recv func() error
	switch rpc {
	case "Sync":
		s, err := c.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A refused stream fails Send with io.EOF; its status comes
		// from Recv.
		if err := s.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: node}}}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		recv = func() error { _, err := s.Recv(); return err }
	case "WatchTable":
		s, err := c.WatchTable(ctx, &pb.WatchTableRequest{NodeName: node})
		if err != nil {
			t.Fatal(err)
		}
		recv = func() error { _, err := s.Recv(); return err }
	default:
		t.Fatalf("unknown rpc %s", rpc)
	}
	if err := recv(); err != nil {
		t.Fatalf("%s as %s: %v, want it admitted", rpc, node, err)
	}
	o := &openStream{name: rpc + " " + node, ended: make(chan error, 1)}
	go func() {
		for {
			if err := recv(); err != nil {
				o.ended <- err
				return
			}
		}
	}()
	return o
}

// wantEnd waits for the stream to end with code.
func (o *openStream) wantEnd(t *testing.T, code codes.Code) {
	t.Helper()
	select {
	case err := <-o.ended:
		if status.Code(err) != code {
			t.Errorf("%s ended with %v, want %s", o.name, err, code)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("%s still open, want it ended with %s", o.name, code)
	}
}

// wantOpen checks that the stream has not ended. Called once the streams
// that had to end have ended, and nothing else can end it, it is no
// timed assertion: the guard that would end it has already run.
func (o *openStream) wantOpen(t *testing.T) {
	t.Helper()
	select {
	case err := <-o.ended:
		t.Errorf("%s ended with %v, want it open", o.name, err)
	default:
	}
}

// serveHold runs a over bufconn with holdServer.
func serveHold(t *testing.T, a *Authenticator) *grpc.ClientConn {
	t.Helper()
	return serveWith(t, a, holdServer{a: a})
}

// waitWaiters waits until the fake clock holds n timers: the streams'
// re-checks are armed.
func waitWaiters(t *testing.T, clk *clocktesting.FakeClock, n int) {
	t.Helper()
	waitFor(t, "the re-checks to be armed", func() bool { return clk.Waiters() == n })
}

// TestStreamEndsWhenPodGoes: an agent's streams end as soon as this
// replica sees its Pod deleted, replaced, or no longer controlled by the
// DaemonSet, with PermissionDenied; the streams of other agents stay.
// Reconnecting with the same token, whose review is cached, is refused.
func TestStreamEndsWhenPodGoes(t *testing.T) {
	hour := time.Now().Add(time.Hour)
	ours := []string{DefaultAudience}
	cases := []struct {
		name   string
		change func(t *testing.T, a *Authenticator, pod *corev1.Pod)
	}{
		{"deleted", func(t *testing.T, a *Authenticator, pod *corev1.Pod) {
			t.Helper()
			deletePod(t, a, pod)
		}},
		{"replaced under its name", func(t *testing.T, a *Authenticator, pod *corev1.Pod) {
			t.Helper()
			p := pod.DeepCopy()
			p.UID = "uid-of-the-new-pod"
			setPod(t, a, p)
		}},
		{"orphaned", func(t *testing.T, a *Authenticator, pod *corev1.Pod) {
			t.Helper()
			p := pod.DeepCopy()
			p.OwnerReferences = nil
			setPod(t, a, p)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI()
			a, _ := newTestAuthenticator(t, f, Config{})
			cc := serveHold(t, a)
			victim, other := agentPod("node-1"), agentPod("node-2")
			setPod(t, a, victim)
			setPod(t, a, other)
			token := f.podToken(victim, ours, hour)
			sync := open(t, cc, "Sync", token, "node-1")
			watch := open(t, cc, "WatchTable", token, "node-1")
			otherSync := open(t, cc, "Sync", f.podToken(other, ours, hour), "node-2")

			tc.change(t, a, victim)
			sync.wantEnd(t, codes.PermissionDenied)
			watch.wantEnd(t, codes.PermissionDenied)
			otherSync.wantOpen(t)
			if got := call(t, cc, "Sync", "Bearer "+token, "node-1"); got != codes.PermissionDenied {
				t.Errorf("reconnecting with the token: %s, want PermissionDenied", got)
			}
		})
	}
}

// TestStreamEndsAtTokenExpiry: a stream ends with Unauthenticated when its
// token expires, without asking the API server; a stream with a token
// still valid stays.
func TestStreamEndsAtTokenExpiry(t *testing.T) {
	f := newFakeAPI()
	a, clk := newTestAuthenticator(t, f, Config{})
	cc := serveHold(t, a)
	pod1, pod2 := agentPod("node-1"), agentPod("node-2")
	setPod(t, a, pod1)
	setPod(t, a, pod2)
	f.setReader("alice", true)
	soon := clk.Now().Add(30 * time.Second)
	ours := []string{DefaultAudience}
	agent := open(t, cc, "Sync", f.podToken(pod1, ours, soon), "node-1")
	reader := open(t, cc, "WatchTable", f.token("alice", ours, "", soon), "node-2")
	lasting := open(t, cc, "Sync", f.podToken(pod2, ours, clk.Now().Add(time.Hour)), "node-2")
	waitWaiters(t, clk, 3)
	reviews := f.tokenReviews.Load()

	clk.Step(31 * time.Second)
	agent.wantEnd(t, codes.Unauthenticated)
	reader.wantEnd(t, codes.Unauthenticated)
	lasting.wantOpen(t)
	if n := f.tokenReviews.Load() - reviews; n != 0 {
		t.Errorf("%d TokenReviews to end expired streams, want none", n)
	}
}

// TestStreamRecheck: every RecheckInterval a stream's token is reviewed
// afresh and its grant applied again: a reader whose right to list
// EndpointSlices is gone loses its stream (PermissionDenied), a token the
// API server no longer accepts (its ServiceAccount deleted) too
// (Unauthenticated); a re-check the API server cannot answer leaves the
// stream open, and the others stay.
func TestStreamRecheck(t *testing.T) {
	const interval = time.Minute
	f := newFakeAPI()
	a, clk := newTestAuthenticator(t, f, Config{RecheckInterval: interval})
	cc := serveHold(t, a)
	pod1 := agentPod("node-1")
	setPod(t, a, pod1)
	f.setReader("alice", true)
	f.setReader("bob", true)
	f.setReader("carol", true)
	hour := clk.Now().Add(time.Hour)
	ours := []string{DefaultAudience}
	agent := open(t, cc, "Sync", f.podToken(pod1, ours, hour), "node-1")
	alice := open(t, cc, "WatchTable", f.token("alice", ours, "", hour), "node-1")
	bobToken := f.token("bob", ours, "", hour)
	bob := open(t, cc, "WatchTable", bobToken, "node-1")
	carol := open(t, cc, "WatchTable", f.token("carol", ours, "", hour), "node-1")
	waitWaiters(t, clk, 4)

	// The API server down: every re-check fails, nothing ends, and each
	// stream's next re-check is armed.
	f.setFail(errAPIDown)
	reviews := f.tokenReviews.Load()
	clk.Step(interval)
	waitFor(t, "the re-checks", func() bool { return f.tokenReviews.Load() == reviews+4 })
	waitWaiters(t, clk, 4)
	for _, s := range []*openStream{agent, alice, bob, carol} {
		s.wantOpen(t)
	}

	f.setFail(nil)
	f.setReader("alice", false)
	f.forget(bobToken)
	clk.Step(interval)
	alice.wantEnd(t, codes.PermissionDenied)
	bob.wantEnd(t, codes.Unauthenticated)
	waitWaiters(t, clk, 2)
	agent.wantOpen(t)
	carol.wantOpen(t)
}

// TestStreamOutlivesItsPodsUpdates: the Pod events a live agent's Pod
// sees all the time (a new resourceVersion, a phase, labels) re-check its
// streams and leave them open.
func TestStreamOutlivesItsPodsUpdates(t *testing.T) {
	f := newFakeAPI()
	a, _ := newTestAuthenticator(t, f, Config{})
	cc := serveHold(t, a)
	pod := agentPod("node-1")
	setPod(t, a, pod)
	token := f.podToken(pod, []string{DefaultAudience}, time.Now().Add(time.Hour))
	sync := open(t, cc, "Sync", token, "node-1")
	watch := open(t, cc, "WatchTable", token, "node-1")
	for i, edit := range []func(*corev1.Pod){
		func(p *corev1.Pod) { p.ResourceVersion = "2" },
		func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning },
		func(p *corev1.Pod) { p.Labels = map[string]string{"pod-template-generation": "3"} },
	} {
		p := pod.DeepCopy()
		edit(p)
		p.ResourceVersion = fmt.Sprint(10 + i)
		setPod(t, a, p)
	}
	sync.wantOpen(t)
	watch.wantOpen(t)
}
