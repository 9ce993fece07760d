package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

const (
	agentUser = "system:serviceaccount:proxyplane-system:proxyplane-nodeagent"
	// apiAudience stands for the API server's default audiences.
	apiAudience = "https://kubernetes.default.svc"
)

var tokenSeq atomic.Int64

// jwt returns a distinct token shaped like a JWT with these claims; its
// signature is garbage, as only the fake API server judges it.
func jwt(aud []string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims := map[string]any{"aud": aud, "jti": tokenSeq.Add(1)}
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	payload, _ := json.Marshal(claims)
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(payload) + ".sig"
}

// tokenInfo is what the fake API server knows about a token.
type tokenInfo struct {
	user      string
	audiences []string
	node      string
}

// fakeAPI is an API server answering TokenReviews and
// SubjectAccessReviews from its maps, counting them.
type fakeAPI struct {
	*fake.Clientset
	mu      sync.Mutex
	tokens  map[string]tokenInfo
	readers map[string]bool // users allowed to list EndpointSlices
	fail    error           // every review fails with it when set

	tokenReviews, accessReviews atomic.Int64
}

func newFakeAPI() *fakeAPI {
	f := &fakeAPI{Clientset: fake.NewClientset(), tokens: map[string]tokenInfo{}, readers: map[string]bool{}}
	f.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.tokenReviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.fail != nil {
			return true, nil, f.fail
		}
		info, ok := f.tokens[tr.Spec.Token]
		want := tr.Spec.Audiences
		if len(want) == 0 {
			want = []string{apiAudience}
		}
		var got []string
		for _, w := range want {
			if slices.Contains(info.audiences, w) {
				got = append(got, w)
			}
		}
		if !ok || len(got) == 0 {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
			return true, tr, nil
		}
		tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: got, User: authnv1.UserInfo{
			Username: info.user, UID: "uid-" + info.user, Groups: []string{"system:authenticated"},
		}}
		if info.node != "" {
			tr.Status.User.Extra = map[string]authnv1.ExtraValue{NodeNameExtra: {info.node}}
		}
		return true, tr, nil
	})
	f.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.accessReviews.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.fail != nil {
			return true, nil, f.fail
		}
		ra := sar.Spec.ResourceAttributes
		sar.Status.Allowed = f.readers[sar.Spec.User] && ra != nil && ra.Verb == "list" &&
			ra.Group == "discovery.k8s.io" && ra.Resource == "endpointslices" && ra.Namespace == ""
		return true, sar, nil
	})
	return f
}

// token registers a new token of user, valid for audiences, bound to node.
func (f *fakeAPI) token(user string, audiences []string, node string, exp time.Time) string {
	t := jwt(audiences, exp)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[t] = tokenInfo{user: user, audiences: audiences, node: node}
	return t
}

func (f *fakeAPI) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

var errAPIDown = errors.New("connection refused")

// newTestAuthenticator returns an Authenticator against f on a fake
// clock.
func newTestAuthenticator(t *testing.T, f *fakeAPI, cfg Config) (*Authenticator, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := newAuthenticator(f.AuthenticationV1().TokenReviews(), f.AuthorizationV1().SubjectAccessReviews(), cfg,
		slog.New(slog.DiscardHandler), clk)
	if err != nil {
		t.Fatal(err)
	}
	return a, clk
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// blockingReviews is a TokenReview client whose reviews wait for release,
// recording how many run at once. Unlike the fake clientset, which holds
// a lock around every reaction, it lets reviews overlap.
type blockingReviews struct {
	release  chan struct{}
	inFlight atomic.Int64
	maxSeen  atomic.Int64
	calls    atomic.Int64
}

func (b *blockingReviews) Create(ctx context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	b.calls.Add(1)
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	for {
		m := b.maxSeen.Load()
		if n <= m || b.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, fmt.Errorf("review: %w", ctx.Err())
	}
	out := tr.DeepCopy()
	out.Status = authnv1.TokenReviewStatus{
		Authenticated: true, Audiences: tr.Spec.Audiences,
		User: authnv1.UserInfo{Username: agentUser, Extra: map[string]authnv1.ExtraValue{NodeNameExtra: {"node-1"}}},
	}
	return out, nil
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
