package auth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// from is ctx as a call from addr.
func from(addr string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 40000}})
}

// TestFailedAuthenticationsLimitedPerSource is issue 21's ninth row: a
// pod sends random tokens, each costing a TokenReview, from one address,
// then rotating its address within its IPv6 /64. Past the address's
// burst of failures, then the /64's, it is refused with
// ResourceExhausted before any review; another /64 is not, and a real
// agent still authenticates.
func TestFailedAuthenticationsLimitedPerSource(t *testing.T) {
	f := newFakeAPI()
	a, _ := newTestAuthenticator(t, f, Config{}) // the fake clock never refills the buckets
	flood := func(attempts int, addr func(i int) string) (unauthenticated, exhausted int) {
		t.Helper()
		for i := range attempts {
			_, err := a.authenticate(from(addr(i)), jwt([]string{DefaultAudience}, time.Time{}), claims{}, false)
			switch c := status.Code(toStatus(err)); c {
			case codes.Unauthenticated:
				unauthenticated++
			case codes.ResourceExhausted:
				exhausted++
			default:
				t.Fatalf("random token %d: %v (%s), want Unauthenticated or ResourceExhausted", i, err, c)
			}
		}
		return unauthenticated, exhausted
	}
	const netBurst = failureNetworkShare * DefaultFailureBurst
	steps := []struct {
		name     string
		attempts int
		addr     func(i int) string
		reviewed int
	}{
		{"one address", 3 * DefaultFailureBurst, func(int) string { return "2001:db8::1" }, DefaultFailureBurst},
		{"addresses of its /64", 2 * netBurst, func(i int) string { return fmt.Sprintf("2001:db8::1:%x", i) }, netBurst - DefaultFailureBurst},
	}
	reviews := int64(0)
	for _, s := range steps {
		u, e := flood(s.attempts, s.addr)
		if u != s.reviewed || e != s.attempts-s.reviewed {
			t.Errorf("%s: %d refused as unauthenticated, %d as too many, want %d and %d", s.name, u, e, s.reviewed, s.attempts-s.reviewed)
		}
		reviews += int64(s.reviewed)
		if n := f.tokenReviews.Load(); n != reviews {
			t.Errorf("%s: %d TokenReviews in all, want %d", s.name, n, reviews)
		}
	}
	if _, err := a.authenticate(from("2001:db8:0:1::1"), jwt([]string{DefaultAudience}, time.Time{}), claims{}, false); status.Code(toStatus(err)) != codes.Unauthenticated {
		t.Errorf("random token from the next /64: %v, want Unauthenticated", err)
	}
	agent := f.token(agentUser, []string{DefaultAudience}, "node-1", time.Time{})
	if id, err := a.authenticate(from("10.0.0.7"), agent, claims{}, false); err != nil || id.User != agentUser {
		t.Errorf("agent during the flood: %v, %v", id, err)
	}
}

// gatedReviews accepts known tokens at once, as the agents' ServiceAccount
// bound to node-1, and holds the others until release, then refuses them.
type gatedReviews struct {
	authnv1client.TokenReviewInterface
	known             sync.Map
	release           chan struct{}
	inFlight, maxSeen atomic.Int64
}

func (g *gatedReviews) Create(ctx context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	out := tr.DeepCopy()
	if _, ok := g.known.Load(tr.Spec.Token); ok {
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences, User: authnv1.UserInfo{
			Username: agentUser, Extra: map[string]authnv1.ExtraValue{NodeNameExtra: {"node-1"}},
		}}
		return out, nil
	}
	n := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	for {
		m := g.maxSeen.Load()
		if n <= m || g.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	out.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
	return out, nil
}

// TestStrangersCannotStarveKnownReviews: random tokens from many sources
// whose reviews hang hold only the strangers' share of the review slots,
// so an agent whose node authenticated before is reviewed at once with a
// new token (its projected token rotated).
func TestStrangersCannotStarveKnownReviews(t *testing.T) {
	g := &gatedReviews{release: make(chan struct{})}
	a, err := newAuthenticator(g, newFakeAPI().AuthorizationV1().SubjectAccessReviews(),
		Config{MaxConcurrentReviews: 4}, discard(), clocktesting.NewFakeClock(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	close(a.pods.synced)
	agentToken := func() string {
		tok := jwt([]string{DefaultAudience}, time.Time{})
		g.known.Store(tok, true)
		return tok
	}
	if _, err := a.authenticate(from("10.0.0.7"), agentToken(), claims{}, false); err != nil {
		t.Fatalf("agent's first authentication: %v", err)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	released := false
	defer func() {
		if !released {
			close(g.release)
		}
	}()
	for i := range 12 {
		wg.Go(func() {
			_, _ = a.authenticate(from(fmt.Sprintf("10.1.0.%d", i+1)), jwt([]string{DefaultAudience}, time.Time{}), claims{}, false)
		})
	}
	waitFor(t, "the strangers' reviews to start", func() bool { return g.inFlight.Load() >= 2 })

	done := make(chan error, 1)
	go func() {
		_, err := a.authenticate(from("10.0.0.7"), agentToken(), claims{}, false)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent with a new token while strangers' reviews hang: %v", err)
		}
	case <-time.After(DefaultReviewTimeout + 5*time.Second):
		t.Fatal("agent's review never finished")
	}
	close(g.release)
	released = true
	wg.Wait()
	if m := g.maxSeen.Load(); m > 2 {
		t.Errorf("%d strangers' reviews at once, want at most 2 (half of 4)", m)
	}
}

// TestRefusalsAreBare: whoever has not authenticated learns the code and
// nothing of the API server's answer or error.
func TestRefusalsAreBare(t *testing.T) {
	f := newFakeAPI()
	a, _ := newTestAuthenticator(t, f, Config{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor()))
	pb.RegisterTableServiceServer(gs, pb.UnimplementedTableServiceServer{})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	c := pb.NewTableServiceClient(cc)
	call := func(token string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		_, err := c.ListNodes(ctx, &pb.ListNodesRequest{})
		return err
	}
	secret := "etcdserver: request timed out talking to 10.0.0.1:2379"
	cases := []struct {
		name string
		fail error
		want codes.Code
	}{
		{"unknown token", nil, codes.Unauthenticated},
		{"API server failing", errors.New(secret), codes.Unavailable},
	}
	for _, tc := range cases {
		f.setFail(tc.fail)
		err := call(jwt([]string{DefaultAudience}, time.Time{}))
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
		}
		msg := status.Convert(err).Message()
		for _, leak := range []string{"invalid bearer token", "etcd", "10.0.0.1", "audience", "reviewing"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s: the caller is told %q", tc.name, msg)
			}
		}
	}
}
