package app

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
)

// metricsAuthorizer guards /metrics as the kube components guard theirs
// (kube-controller-manager, kube-scheduler, the kubelet): the caller's
// bearer token is checked with a TokenReview for the API server's own
// audiences, and its user must be allowed to get the non-resource URL
// /metrics, asked with a SubjectAccessReview. Prometheus's usual RBAC for
// scraping kube components (nonResourceURLs: ["/metrics"], verbs:
// ["get"]) therefore works unchanged.
//
// It is a small filter rather than k8s.io/apiserver's
// DelegatingAuthenticationOptions and DelegatingAuthorizationOptions:
// those come with the generic API server's dependency tree (etcd's
// client, CEL, OpenTelemetry, some fifty modules) and its flag set, for
// the two requests and two caches this needs. It keeps their semantics:
// TokenReview without audiences, SubjectAccessReview of verb get on the
// path, answers cached ten seconds (their default), 401 without a valid
// token, 403 without the right. It shares nothing with the agents'
// authentication: its own client and QPS (metricsReviewClient), its own
// cache and reviews in flight, so tokens thrown at /metrics cannot slow
// an agent's admission. As the agents' review gate (controlplane/auth),
// it keeps strangers from starving known callers: an address whose token
// was allowed lately is known, and its reviews may take any slot, while
// the others' hold at most metricsStrangerReviews, so that random tokens
// thrown at the port never keep a scraper whose token rotated from being
// reviewed.
type metricsAuthorizer struct {
	// path is the non-resource URL a caller must be allowed to get:
	// metricsPath, or profilingPath for --profiling's handlers.
	path          string
	tokenReviews  tokenReviewer
	accessReviews accessReviewer
	log           *slog.Logger
	// decisions maps a token's SHA-256 (never the token) to its HTTP
	// status: 200, 401 or 403.
	decisions *cache.LRUExpireCache
	// slots holds one token per review in flight, strangers one per
	// review in flight for an address not known.
	slots, strangers chan struct{}
	// known holds the addresses (netip.Addr) whose token was allowed
	// within metricsKnownTTL.
	known *cache.LRUExpireCache
}

type tokenReviewer interface {
	Create(context.Context, *authnv1.TokenReview, metav1.CreateOptions) (*authnv1.TokenReview, error)
}

type accessReviewer interface {
	Create(context.Context, *authzv1.SubjectAccessReview, metav1.CreateOptions) (*authzv1.SubjectAccessReview, error)
}

const (
	// metricsDecisionTTL is how long an answer is cached, allowed or
	// denied: k8s.io/apiserver's default for both reviews.
	metricsDecisionTTL = 10 * time.Second
	// metricsCacheSize: a few scrapers and people; strangers' random
	// tokens only push each other out.
	metricsCacheSize = 256
	// metricsReviewsInFlight bounds the reviews /metrics has in flight;
	// a request finding none free within metricsReviewWait is answered
	// 503, so a flood of tokens costs the API server at most this many
	// concurrent requests (and the client's QPS).
	metricsReviewsInFlight = 2
	metricsReviewWait      = 5 * time.Second
	// metricsStrangerReviews is how many of those the reviews for
	// addresses not known may hold: the other is always free for a
	// known scraper. metricsKnownTTL is how long an address stays known
	// after its token was allowed: far longer than a scrape interval.
	metricsStrangerReviews = 1
	metricsKnownTTL        = time.Hour
	// metricsMaxTokenBytes refuses what cannot be a token before it is
	// hashed or sent anywhere, as auth.MaxTokenBytes.
	metricsMaxTokenBytes = 16 << 10
)

// metricsPath is the non-resource URL a scraper must be allowed to get.
const metricsPath = "/metrics"

// profilingPath is the non-resource URL a caller of --profiling's
// handlers must be allowed to get, as the kube components ask for their
// /debug/pprof/ handlers: a scraper's right to /metrics is not enough.
const profilingPath = "/debug/pprof/"

// newMetricsAuthorizer returns an authorizer of the right to get path.
func newMetricsAuthorizer(client kubernetes.Interface, path string, log *slog.Logger) *metricsAuthorizer {
	return &metricsAuthorizer{
		path:          path,
		tokenReviews:  client.AuthenticationV1().TokenReviews(),
		accessReviews: client.AuthorizationV1().SubjectAccessReviews(),
		log:           log,
		decisions:     cache.NewLRUExpireCache(metricsCacheSize),
		slots:         make(chan struct{}, metricsReviewsInFlight),
		strangers:     make(chan struct{}, metricsStrangerReviews),
		known:         cache.NewLRUExpireCache(metricsCacheSize),
	}
}

// wrap returns next behind the authorizer. Refusals carry the status
// text only: nothing of the API server's answer reaches the caller.
func (m *metricsAuthorizer) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="proxyplane"`)
			http.Error(w, http.StatusText(http.StatusUnauthorized), http.StatusUnauthorized)
			return
		}
		var remote netip.Addr
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			remote = ap.Addr().Unmap()
		}
		code, err := m.decide(r.Context(), token, remote)
		if err != nil {
			m.log.Warn("cannot authorize a request", "path", m.path, "err", err, "remote", r.RemoteAddr)
			w.Header().Set("Retry-After", "5")
			http.Error(w, http.StatusText(http.StatusServiceUnavailable), http.StatusServiceUnavailable)
			return
		}
		if code != http.StatusOK {
			http.Error(w, http.StatusText(code), code)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearer returns the request's single bearer token.
func bearer(r *http.Request) (string, bool) {
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return "", false
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" || len(token) > metricsMaxTokenBytes || strings.ContainsAny(token, " \t") {
		return "", false
	}
	return token, true
}

// decide returns the status token, sent from remote, earns: 200, 401 or
// 403, from the cache or from the API server. An error means the API
// server could not be asked; it is not cached.
func (m *metricsAuthorizer) decide(ctx context.Context, token string, remote netip.Addr) (int, error) {
	key := sha256.Sum256([]byte(token))
	if v, ok := m.decisions.Get(key); ok {
		return v.(int), nil
	}
	ctx, cancel := context.WithTimeout(ctx, metricsReviewWait)
	defer cancel()
	if _, known := m.known.Get(remote); !known {
		if err := take(ctx, m.strangers); err != nil {
			return 0, err
		}
		defer func() { <-m.strangers }()
	}
	if err := take(ctx, m.slots); err != nil {
		return 0, err
	}
	defer func() { <-m.slots }()
	// Scrapes that came together with one token waited for the same
	// slot: the first one's answer serves the rest.
	if v, ok := m.decisions.Get(key); ok {
		return v.(int), nil
	}
	code, err := m.review(ctx, token)
	if err != nil {
		return 0, err
	}
	m.decisions.Add(key, code, metricsDecisionTTL)
	if code == http.StatusOK {
		m.known.Add(remote, struct{}{}, metricsKnownTTL)
	}
	return code, nil
}

// take takes a slot of slots, waiting until ctx ends.
func take(ctx context.Context, slots chan struct{}) error {
	select {
	case slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for a review slot: %w", ctx.Err())
	}
}

func (m *metricsAuthorizer) review(ctx context.Context, token string) (int, error) {
	tr, err := m.tokenReviews.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("reviewing a token: %w", err)
	}
	if !tr.Status.Authenticated {
		return http.StatusUnauthorized, nil
	}
	u := tr.Status.User
	if u.Username == "" {
		return 0, errors.New("reviewing a token: authenticated without a user name")
	}
	spec := authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: m.path, Verb: "get"},
	}
	if len(u.Extra) > 0 {
		spec.Extra = make(map[string]authzv1.ExtraValue, len(u.Extra))
		for k, v := range u.Extra {
			spec.Extra[k] = authzv1.ExtraValue(v)
		}
	}
	sar, err := m.accessReviews.Create(ctx, &authzv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("reviewing access to %s: %w", m.path, err)
	}
	if sar.Status.Allowed && !sar.Status.Denied {
		return http.StatusOK, nil
	}
	return http.StatusForbidden, nil
}
