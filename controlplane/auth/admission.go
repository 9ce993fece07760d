package auth

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"

	"github.com/proxyplane/proxyplane/controlplane/limit"
)

// Defaults of the review gate's Config fields, each with its reason.
const (
	// DefaultFailureRate and DefaultFailureBurst: failed authentications
	// one address may cause, each costing a TokenReview. An agent whose Pod was just created may be refused a
	// few times while the API server catches up, and an operator mistypes;
	// ten at once and one every two seconds after that serve both, while
	// an address sending random tokens costs the API server one review
	// every two seconds.
	DefaultFailureRate  = 0.5
	DefaultFailureBurst = 10
	// DefaultProvenTTL is how long an address that authenticated stays
	// known: longer than the agents' re-checks and reconnects, so that an
	// agent's node is always known to the replica serving it.
	DefaultProvenTTL = time.Hour
	// failureNetworkShare is how many addresses' failures an IPv6 /64 may
	// cause in all (see limit.NetworkOf): rotating through a /64 gains
	// 16 addresses' worth, at most 8 reviews a second, while the nodes
	// of a subnet sharing a /64 each keep their own.
	failureNetworkShare = 16
)

// reviewGate keeps callers who have proved nothing from costing the
// agents their reviews, as the API server's own authentication keeps
// anonymous requests apart: an address that authenticated lately is
// known, and its reviews use any of the review slots; the others' reviews
// hold at most MaxStrangerReviews of them, so known callers always find
// slots free; and each address may fail only so many authentications
// (FailureRate), and each IPv6 /64 only failureNetworkShare times as
// many, so random tokens cannot make the API server review more than
// that, however many addresses of a /64 they come from.
// A token whose acceptance is cached costs no review and passes whatever
// its address did before. Its methods are safe for concurrent use.
type reviewGate struct {
	clock     clock.Clock
	strangers chan struct{}         // one per stranger's review in flight
	failures  *limit.SourceBuckets  // per address and per IPv6 /64
	proven    *cache.LRUExpireCache // netip.Prefix -> struct{}
	provenTTL time.Duration
}

func newReviewGate(cfg Config, clk clock.Clock) *reviewGate {
	return &reviewGate{
		clock:     clk,
		strangers: make(chan struct{}, cfg.MaxStrangerReviews),
		failures:  limit.NewSourceBuckets(cfg.FailureRate, cfg.FailureBurst, failureNetworkShare, limit.DefaultMaxPeers),
		proven:    cache.NewLRUExpireCacheWithClock(cfg.CacheSize, clk),
		provenTTL: DefaultProvenTTL,
	}
}

type strangerKey struct{}

// enter admits the authentication of the token with hash key by the
// caller in ctx: at once when a review accepting it is cached, or when
// the call is a stream's re-check (fresh), which this replica starts, not
// the caller; otherwise only if the caller's address, and its /64, may
// fail once more. The returned ctx marks a caller whose address is not
// known, for strangerSlot; settle must be called with the outcome.
func (g *reviewGate) enter(ctx context.Context, tokens *cache.LRUExpireCache, key tokenHash, fresh bool) (_ context.Context, settle func(*Identity, error), err error) {
	src := limit.Source(ctx)
	// A caller without an IP address (an in-process listener, which only
	// tests use) has nothing to count against.
	if r, ok := tokens.Get(key); fresh || !src.IsValid() || ok && r.(*reviewResult).id != nil {
		return ctx, func(*Identity, error) {}, nil
	}
	refund, limited, ok := g.failures.Take(src, g.clock.Now())
	if !ok {
		return nil, nil, fmt.Errorf("%w: from %s", errTooManyFailures, limited)
	}
	if _, known := g.proven.Get(src); !known {
		ctx = context.WithValue(ctx, strangerKey{}, true)
	}
	return ctx, func(id *Identity, err error) {
		switch {
		case id != nil:
			refund()
			g.proven.Add(src, struct{}{}, g.provenTTL)
		case !isRefusal(err):
			refund() // the API server's failure, not the caller's
		}
	}, nil
}

// strangerSlot takes one of the slots strangers' reviews may hold, if the
// review is for a stranger (ctx came from enter), and returns its release.
func (g *reviewGate) strangerSlot(ctx context.Context) (release func(), err error) {
	if ctx.Value(strangerKey{}) == nil {
		return func() {}, nil
	}
	select {
	case g.strangers <- struct{}{}:
		return func() { <-g.strangers }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a review slot: %w", ctx.Err())
	}
}
