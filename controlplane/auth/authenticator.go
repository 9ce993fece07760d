package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/utils/clock"
)

// Defaults of Config, each with its reason.
const (
	// DefaultAudience is what agent tokens are issued for: a token meant
	// for proxyplane is useless against the API server, and the reverse.
	DefaultAudience = "proxyplane"
	// DefaultAgentServiceAccount is the DaemonSet's ServiceAccount in
	// deploy/.
	DefaultAgentServiceAccount = "proxyplane-system/proxyplane-nodeagent"
	// DefaultAgentDaemonSet is deploy/'s DaemonSet, in the agents'
	// ServiceAccount's namespace.
	DefaultAgentDaemonSet = "proxyplane-nodeagent"
	// DefaultRecheckInterval bounds how long a stream outlives the
	// identity it was opened with (a reader's binding removed, its
	// ServiceAccount deleted). The API server ends a watch after 30 to 60
	// minutes and authenticates the next; a stream here is re-checked in
	// place, so it can afford to be checked far more often: 5,000 agents
	// cost the API server about 20 TokenReviews a second (the interval is
	// jittered down by up to a fifth). Token expiry and the deletion of
	// an agent's Pod end a stream at once, whatever this is.
	DefaultRecheckInterval = 5 * time.Minute
	// DefaultMaxConcurrentReviews: a review takes the API server a few
	// milliseconds, so 16 in flight admit thousands of agents a second,
	// while a cold start of 5,000 agents never puts more than 16 requests
	// on the API server at once.
	DefaultMaxConcurrentReviews = 16
	// DefaultCacheSize holds every agent of a 5,000-node cluster and its
	// readers with room to spare, at a few hundred bytes an entry.
	DefaultCacheSize = 8192
	// DefaultPositiveTTL, as the API server's own webhook token cache: an
	// agent reconnecting within it costs nothing, and a token revoked (its
	// Pod deleted) is refused at most this long afterwards. A token
	// expiring sooner is cached until it expires.
	DefaultPositiveTTL = 2 * time.Minute
	// DefaultNegativeTTL: a bad token retried in a loop costs one review
	// per period, and a token refused in a race with the API server's
	// caches (a Pod just created) is accepted soon after.
	DefaultNegativeTTL = 10 * time.Second
	// DefaultReviewTimeout bounds one review, queueing for a slot
	// included: a stuck API server fails calls with Unavailable rather
	// than holding streams open.
	DefaultReviewTimeout = 10 * time.Second
)

// EndpointSlices are what tables are computed from: whoever may list them
// cluster-wide may read every table and status.
var readAttributes = authzv1.ResourceAttributes{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"}

// Config configures an Authenticator. Zero numeric fields take the
// defaults above.
type Config struct {
	// Audience is the audience of agent tokens (--token-audience).
	Audience string
	// AgentServiceAccount is the agents' ServiceAccount, "namespace/name"
	// (--agent-service-account).
	AgentServiceAccount string
	// MaxConcurrentReviews bounds TokenReviews and SubjectAccessReviews in
	// flight.
	MaxConcurrentReviews int
	// CacheSize bounds each cache (token reviews, access reviews).
	CacheSize int
	// PositiveTTL and NegativeTTL bound how long accepted and refused
	// reviews are cached.
	PositiveTTL, NegativeTTL time.Duration
	// ReviewTimeout bounds one review, waiting for a slot included.
	ReviewTimeout time.Duration
	// MaxStrangerReviews bounds the reviews in flight for callers whose
	// address has not authenticated lately; the rest of
	// MaxConcurrentReviews stays free for the others (see reviewGate).
	// Zero is half of MaxConcurrentReviews.
	MaxStrangerReviews int
	// FailureRate and FailureBurst bound the failed authentications an
	// address may cause, per second and at once.
	FailureRate  float64
	FailureBurst int
	// AgentDaemonSet is the agents' DaemonSet, in AgentServiceAccount's
	// namespace (--agent-daemonset): an agent token must be bound to a
	// Pod it controls.
	AgentDaemonSet string
	// RecheckInterval bounds how long a stream goes on before its
	// identity is checked again (--identity-recheck-interval).
	RecheckInterval time.Duration
}

func (c Config) withDefaults() Config {
	if c.Audience == "" {
		c.Audience = DefaultAudience
	}
	if c.AgentServiceAccount == "" {
		c.AgentServiceAccount = DefaultAgentServiceAccount
	}
	if c.MaxConcurrentReviews <= 0 {
		c.MaxConcurrentReviews = DefaultMaxConcurrentReviews
	}
	if c.CacheSize <= 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.PositiveTTL <= 0 {
		c.PositiveTTL = DefaultPositiveTTL
	}
	if c.NegativeTTL <= 0 {
		c.NegativeTTL = DefaultNegativeTTL
	}
	if c.ReviewTimeout <= 0 {
		c.ReviewTimeout = DefaultReviewTimeout
	}
	if c.MaxStrangerReviews <= 0 || c.MaxStrangerReviews > c.MaxConcurrentReviews {
		c.MaxStrangerReviews = max(1, c.MaxConcurrentReviews/2)
	}
	if c.FailureRate <= 0 {
		c.FailureRate = DefaultFailureRate
	}
	if c.FailureBurst <= 0 {
		c.FailureBurst = DefaultFailureBurst
	}
	if c.AgentDaemonSet == "" {
		c.AgentDaemonSet = DefaultAgentDaemonSet
	}
	if c.RecheckInterval <= 0 {
		c.RecheckInterval = DefaultRecheckInterval
	}
	return c
}

// ParseServiceAccount splits "namespace/name" and returns the user name
// the API server gives that ServiceAccount's tokens.
func ParseServiceAccount(s string) (user string, err error) {
	ns, name, err := splitServiceAccount(s)
	if err != nil {
		return "", err
	}
	return serviceAccountUser(ns, name), nil
}

// serviceAccountUser is the user name the API server gives a
// ServiceAccount's tokens.
func serviceAccountUser(ns, name string) string { return "system:serviceaccount:" + ns + ":" + name }

func splitServiceAccount(s string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("service account %q: want namespace/name", s)
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return "", "", fmt.Errorf("service account %q: namespace: %s", s, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("service account %q: name: %s", s, errs[0])
	}
	return ns, name, nil
}

// Authenticator checks tokens with TokenReview, read access with
// SubjectAccessReview, caching both, and agent tokens against the agent
// Pods it watches. Its interceptors authenticate the TableService's
// calls and end streams whose identity no longer holds; Authorize and
// AuthorizeRead are the server's hooks. Run must run for agents to be
// admitted. All methods are safe for concurrent use.
type Authenticator struct {
	tokenReviews  authnv1client.TokenReviewInterface
	accessReviews authzv1client.SubjectAccessReviewInterface
	cfg           Config
	agentUser     string
	log           *slog.Logger
	clock         clock.WithDelayedExecution
	pods          *agentPods

	tokens *cache.LRUExpireCache // tokenHash -> *reviewResult
	access *cache.LRUExpireCache // user hash -> bool (may read everything)
	flight singleflight.Group    // coalesces reviews of one key
	slots  chan struct{}         // one per review in flight
	gate   *reviewGate           // strangers' reviews and failures
}

// reviewResult is a cached TokenReview: an identity, or why there is none.
type reviewResult struct {
	id     *Identity
	reason string
}

// New returns an Authenticator reviewing with client, and watching the
// agent Pods through it once Run runs.
func New(client kubernetes.Interface, cfg Config, log *slog.Logger) (*Authenticator, error) {
	a, err := newAuthenticator(client.AuthenticationV1().TokenReviews(), client.AuthorizationV1().SubjectAccessReviews(), cfg, log, clock.RealClock{})
	if err != nil {
		return nil, err
	}
	a.pods.watch(client)
	return a, nil
}

func newAuthenticator(tr authnv1client.TokenReviewInterface, sar authzv1client.SubjectAccessReviewInterface,
	cfg Config, log *slog.Logger, clk clock.WithDelayedExecution,
) (*Authenticator, error) {
	cfg = cfg.withDefaults()
	ns, sa, err := splitServiceAccount(cfg.AgentServiceAccount)
	if err != nil {
		return nil, err
	}
	user := serviceAccountUser(ns, sa)
	if errs := validation.IsDNS1123Subdomain(cfg.AgentDaemonSet); len(errs) > 0 {
		return nil, fmt.Errorf("agent DaemonSet %q: %s", cfg.AgentDaemonSet, errs[0])
	}
	return &Authenticator{
		tokenReviews:  tr,
		accessReviews: sar,
		cfg:           cfg,
		agentUser:     user,
		log:           log,
		clock:         clk,
		pods:          newAgentPods(ns, sa, cfg.AgentDaemonSet, cfg.ReviewTimeout, log),
		tokens:        cache.NewLRUExpireCacheWithClock(cfg.CacheSize, clk),
		access:        cache.NewLRUExpireCacheWithClock(cfg.CacheSize, clk),
		slots:         make(chan struct{}, cfg.MaxConcurrentReviews),
		gate:          newReviewGate(cfg, clk),
	}, nil
}

// Run watches the agent Pods until ctx ends: an agent token is accepted
// only once this replica has seen its Pod.
func (a *Authenticator) Run(ctx context.Context) error {
	return a.pods.run(ctx)
}

// Listed is closed once Run has listed the agent Pods.
func (a *Authenticator) Listed() <-chan struct{} { return a.pods.synced }

func (a *Authenticator) now() time.Time { return a.clock.Now() }

// authenticate returns the token's identity for the control plane's
// audience. It fails with errUnauthenticated when the API server does not
// accept the token, and with another error when it could not be asked.
// fresh asks the API server even when a review is cached, and caches its
// answer.
func (a *Authenticator) authenticate(ctx context.Context, token string, c claims, fresh bool) (id *Identity, err error) {
	if !c.expiry.IsZero() && !a.now().Before(c.expiry) {
		return nil, fmt.Errorf("%w: token expired at %s", errUnauthenticated, c.expiry.UTC().Format(time.RFC3339))
	}
	key := hashToken(token)
	ctx, settle, err := a.gate.enter(ctx, a.tokens, key, fresh)
	if err != nil {
		return nil, err
	}
	defer func() { settle(id, err) }()
	v, err := a.cached(ctx, a.tokens, key, fmt.Sprintf("t%x", key), fresh, func(ctx context.Context) (any, time.Duration, error) {
		r, err := a.tokenReview(ctx, token)
		if err != nil {
			return nil, 0, err
		}
		if r.id == nil {
			return r, a.cfg.NegativeTTL, nil
		}
		ttl := a.cfg.PositiveTTL
		if !c.expiry.IsZero() {
			ttl = min(ttl, c.expiry.Sub(a.now()))
		}
		return r, ttl, nil
	})
	if err != nil {
		return nil, err
	}
	r := v.(*reviewResult)
	if r.id == nil {
		return nil, fmt.Errorf("%w: %s", errUnauthenticated, r.reason)
	}
	return r.id, nil
}

// tokenReview asks the API server who token belongs to, for the control
// plane's audience only: a token the API server would accept for itself
// is never asked about, so no caller needs to hand a replica a token
// that works against the API server.
func (a *Authenticator) tokenReview(ctx context.Context, token string) (*reviewResult, error) {
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{a.cfg.Audience}}}
	out, err := a.tokenReviews.Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("reviewing a token: %w", err)
	}
	st := out.Status
	if !st.Authenticated {
		reason := "the API server does not accept the token for audience " + a.cfg.Audience
		if st.Error != "" {
			reason += ": " + st.Error
		}
		return &reviewResult{reason: reason}, nil
	}
	// An authenticator unaware of audiences may answer for its own: the
	// API server then returns the audiences it checked, which must
	// include ours (as the API server's webhook authenticator requires).
	if !slices.Contains(st.Audiences, a.cfg.Audience) {
		return &reviewResult{reason: "the token is not valid for audience " + a.cfg.Audience}, nil
	}
	id := &Identity{
		User: st.User.Username, UID: st.User.UID, Groups: st.User.Groups, Agent: st.User.Username == a.agentUser,
	}
	if len(st.User.Extra) > 0 {
		id.Extra = make(map[string][]string, len(st.User.Extra))
		for k, v := range st.User.Extra {
			id.Extra[k] = v
		}
	}
	one := func(key string) string {
		if v := id.Extra[key]; len(v) == 1 {
			return v[0]
		}
		return ""
	}
	id.Node, id.Pod, id.PodUID = one(NodeNameExtra), one(PodNameExtra), one(PodUIDExtra)
	return &reviewResult{id: id}, nil
}

// mayReadAll says whether id may read every table and status: whether its
// user may list EndpointSlices in every namespace. fresh asks the API
// server even when an answer is cached.
func (a *Authenticator) mayReadAll(ctx context.Context, id *Identity, fresh bool) (bool, error) {
	uh := id.userHash()
	v, err := a.cached(ctx, a.access, uh, fmt.Sprintf("a%x", uh), fresh, func(ctx context.Context) (any, time.Duration, error) {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: id.User, UID: id.UID, Groups: id.Groups, ResourceAttributes: &readAttributes,
		}}
		if len(id.Extra) > 0 {
			sar.Spec.Extra = make(map[string]authzv1.ExtraValue, len(id.Extra))
			for k, v := range id.Extra {
				sar.Spec.Extra[k] = v
			}
		}
		out, err := a.accessReviews.Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return nil, 0, fmt.Errorf("reviewing access: %w", err)
		}
		if out.Status.Allowed && !out.Status.Denied {
			return true, a.cfg.PositiveTTL, nil
		}
		return false, a.cfg.NegativeTTL, nil
	})
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// cached returns c's entry for key, or runs review once for every caller
// wanting key at the same time (flight names key among all caches),
// within the concurrency bound and the review timeout, and caches its
// answer for the TTL it returns. Errors (the API server unreachable) are
// not cached: the next call asks again. fresh skips the cached entry (a
// stream's re-check): its review is a flight of its own, so that it never
// joins one that may answer from the cache.
func (a *Authenticator) cached(ctx context.Context, c *cache.LRUExpireCache, key any, flight string, fresh bool,
	review func(context.Context) (any, time.Duration, error),
) (any, error) {
	if v, ok := c.Get(key); ok && !fresh {
		return v, nil
	}
	if fresh {
		flight = "fresh" + flight
	}
	ch := a.flight.DoChan(flight, func() (any, error) {
		// The review outlives a caller who gives up: others may have
		// joined it, and its answer is worth caching. Its own timeout,
		// queueing included, bounds it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ReviewTimeout)
		defer cancel()
		release, err := a.gate.strangerSlot(rctx)
		if err != nil {
			return nil, err
		}
		defer release()
		select {
		case a.slots <- struct{}{}:
		case <-rctx.Done():
			return nil, fmt.Errorf("waiting for a review slot: %w", rctx.Err())
		}
		defer func() { <-a.slots }()
		// Another flight may have filled the cache while this one queued.
		if v, ok := c.Get(key); ok && !fresh {
			return v, nil
		}
		v, ttl, err := review(rctx)
		if err != nil {
			return nil, err
		}
		if ttl > 0 {
			c.Add(key, v, ttl)
		}
		return v, nil
	})
	select {
	case r := <-ch:
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// errNoIdentity: the hooks ran without the interceptors.
var errNoIdentity = errors.New("no authenticated identity in the call's context")
