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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
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
	// node, pod and podUID are what the token is bound to: a Pod (all
	// three), a Node (node only) or nothing.
	node, pod, podUID string
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
		extra := map[string]authnv1.ExtraValue{}
		if info.node != "" {
			extra[NodeNameExtra] = authnv1.ExtraValue{info.node}
		}
		if info.pod != "" {
			extra[PodNameExtra] = authnv1.ExtraValue{info.pod}
			extra[PodUIDExtra] = authnv1.ExtraValue{info.podUID}
		}
		if len(extra) > 0 {
			tr.Status.User.Extra = extra
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

// token registers a new token of user, valid for audiences, bound to
// node (a Node-bound token) or to nothing.
func (f *fakeAPI) token(user string, audiences []string, node string, exp time.Time) string {
	return f.register(tokenInfo{user: user, audiences: audiences, node: node}, exp)
}

// podToken registers a new token of the agents' ServiceAccount for
// audiences, bound to pod, as the kubelet projects it.
func (f *fakeAPI) podToken(pod *corev1.Pod, audiences []string, exp time.Time) string {
	return f.register(tokenInfo{user: agentUser, audiences: audiences, node: pod.Spec.NodeName, pod: pod.Name, podUID: string(pod.UID)}, exp)
}

func (f *fakeAPI) register(info tokenInfo, exp time.Time) string {
	t := jwt(info.audiences, exp)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[t] = info
	return t
}

// forget makes the API server refuse token from now on, as it refuses a
// token whose Pod or ServiceAccount was deleted.
func (f *fakeAPI) forget(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.tokens, token)
}

func (f *fakeAPI) setReader(user string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readers[user] = ok
}

var podSeq atomic.Int64

// agentPod returns a Pod of the agents' DaemonSet on node, as the
// DaemonSet controller makes them.
func agentPod(node string) *corev1.Pod {
	n := podSeq.Add(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("proxyplane-nodeagent-%d", n), Namespace: "proxyplane-system", UID: types.UID(fmt.Sprintf("uid-%d", n)),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: DefaultAgentDaemonSet, UID: "ds-uid", Controller: ptr.To(true),
			}},
		},
		Spec:   corev1.PodSpec{NodeName: node, ServiceAccountName: "proxyplane-nodeagent"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// setPod adds or replaces pod in a's view of the agent Pods, as a watch
// event does.
func setPod(t *testing.T, a *Authenticator, pod *corev1.Pod) {
	t.Helper()
	old, existed, err := a.pods.indexer.Get(pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.pods.indexer.Update(pod); err != nil {
		t.Fatal(err)
	}
	a.pods.notify()
	if existed {
		a.pods.changedPod(old)
	}
}

// deletePod removes pod from a's view of the agent Pods, as a watch event
// does.
func deletePod(t *testing.T, a *Authenticator, pod *corev1.Pod) {
	t.Helper()
	if err := a.pods.indexer.Delete(pod); err != nil {
		t.Fatal(err)
	}
	a.pods.changedPod(pod)
}

func (f *fakeAPI) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

var errAPIDown = errors.New("connection refused")

// newTestAuthenticator returns an Authenticator against f on a fake
// clock, its agent Pods listed (none yet: see setPod).
func newTestAuthenticator(t *testing.T, f *fakeAPI, cfg Config) (*Authenticator, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	a, err := newAuthenticator(f.AuthenticationV1().TokenReviews(), f.AuthorizationV1().SubjectAccessReviews(), cfg,
		slog.New(slog.DiscardHandler), clk)
	if err != nil {
		t.Fatal(err)
	}
	close(a.pods.synced)
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
		User: authnv1.UserInfo{Username: agentUser, Extra: map[string]authnv1.ExtraValue{
			NodeNameExtra: {"node-1"}, PodNameExtra: {"proxyplane-nodeagent-x"}, PodUIDExtra: {"uid-x"},
		}},
	}
	return out, nil
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
