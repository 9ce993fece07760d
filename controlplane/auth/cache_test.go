package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestTokenCache checks what a review costs the API server: cached hits,
// expiry of positive and negative answers, errors never cached, the size
// bound.
func TestTokenCache(t *testing.T) {
	ctx := context.Background()
	type step struct {
		advance time.Duration // before the call
		token   int           // index into tokens
		wantErr bool
	}
	cases := []struct {
		name        string
		cfg         Config
		tokens      func(f *fakeAPI, now time.Time) []string
		fail        bool // the API server fails every review
		steps       []step
		wantReviews int64
		// wantLive, if not -1, is how many entries outlive the steps.
		wantLive int
	}{
		{
			name:        "a second call hits the cache",
			tokens:      func(f *fakeAPI, now time.Time) []string { return []string{agentToken(f, now.Add(time.Hour))} },
			steps:       []step{{}, {advance: time.Minute}},
			wantReviews: 1, wantLive: -1,
		},
		{
			name:        "an accepted token is reviewed again after the positive TTL",
			tokens:      func(f *fakeAPI, now time.Time) []string { return []string{agentToken(f, now.Add(time.Hour))} },
			steps:       []step{{}, {advance: DefaultPositiveTTL + time.Second}},
			wantReviews: 2, wantLive: -1,
		},
		{
			name:   "a token's expiry ends its cache entry and the token",
			tokens: func(f *fakeAPI, now time.Time) []string { return []string{agentToken(f, now.Add(30*time.Second))} },
			steps: []step{
				{},
				{advance: 20 * time.Second},
				{advance: 11 * time.Second, wantErr: true},
			},
			wantReviews: 1, wantLive: 0,
		},
		{
			name: "a refused token is cached for the negative TTL",
			tokens: func(_ *fakeAPI, now time.Time) []string {
				return []string{jwt([]string{DefaultAudience}, now.Add(time.Hour))}
			},
			steps: []step{
				{wantErr: true},
				{advance: DefaultNegativeTTL / 2, wantErr: true},
				{advance: DefaultNegativeTTL, wantErr: true},
			},
			wantReviews: 2, wantLive: -1,
		},
		{
			name:        "failures to review are not cached",
			tokens:      func(f *fakeAPI, now time.Time) []string { return []string{agentToken(f, now.Add(time.Hour))} },
			fail:        true,
			steps:       []step{{wantErr: true}, {wantErr: true}},
			wantReviews: 2, wantLive: 0,
		},
		{
			name: "the cache holds CacheSize entries, least recently used out",
			cfg:  Config{CacheSize: 2},
			tokens: func(f *fakeAPI, now time.Time) []string {
				return []string{agentToken(f, now.Add(time.Hour)), agentToken(f, now.Add(time.Hour)), agentToken(f, now.Add(time.Hour))}
			},
			steps:       []step{{token: 0}, {token: 1}, {token: 0}, {token: 2}, {token: 0}, {token: 1}},
			wantReviews: 4, // 0, 1, 2, then 1 again: 0 stayed recently used
			wantLive:    2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI()
			if tc.fail {
				f.setFail(errAPIDown)
			}
			a, clk := newTestAuthenticator(t, f, tc.cfg)
			tokens := tc.tokens(f, clk.Now())
			for i, s := range tc.steps {
				clk.Step(s.advance)
				tok := tokens[s.token]
				_, err := a.authenticate(ctx, tok, parseClaims(tok), false)
				if (err != nil) != s.wantErr {
					t.Fatalf("step %d: err %v, want error %t", i, err, s.wantErr)
				}
			}
			if got := f.tokenReviews.Load(); got != tc.wantReviews {
				t.Errorf("%d TokenReviews, want %d", got, tc.wantReviews)
			}
			if n := len(a.tokens.Keys()); tc.wantLive >= 0 && n != tc.wantLive {
				t.Errorf("%d live cache entries, want %d", n, tc.wantLive)
			}
			size := tc.cfg.withDefaults().CacheSize
			if n := len(a.tokens.Keys()); n > size {
				t.Errorf("%d cache entries, want at most %d", n, size)
			}
			for _, k := range a.tokens.Keys() {
				for _, tok := range tokens {
					if strings.Contains(fmt.Sprintf("%v %s", k, k), tok) {
						t.Errorf("a cache key holds the token itself")
					}
				}
			}
		})
	}
}

func agentToken(f *fakeAPI, exp time.Time) string {
	return f.token(agentUser, []string{DefaultAudience}, "node-1", exp)
}

// TestAccessCache: a reader's SubjectAccessReview is cached per user,
// whichever token it presents, and a denial for the negative TTL.
func TestAccessCache(t *testing.T) {
	ctx := context.Background()
	f := newFakeAPI()
	a, clk := newTestAuthenticator(t, f, Config{})
	f.readers["alice"] = true
	alice := &Identity{User: "alice", Groups: []string{"system:authenticated"}}
	bob := &Identity{User: "bob"}
	for range 3 {
		if ok, err := a.mayReadAll(ctx, alice, false); !ok || err != nil {
			t.Fatalf("alice: %t, %v", ok, err)
		}
		if ok, err := a.mayReadAll(ctx, bob, false); ok || err != nil {
			t.Fatalf("bob: %t, %v", ok, err)
		}
	}
	if got := f.accessReviews.Load(); got != 2 {
		t.Errorf("%d SubjectAccessReviews, want 2", got)
	}
	clk.Step(DefaultNegativeTTL + time.Second)
	f.readers["bob"] = true
	if ok, _ := a.mayReadAll(ctx, bob, false); !ok {
		t.Errorf("bob's denial outlived the negative TTL")
	}
	if got := f.accessReviews.Load(); got != 3 {
		t.Errorf("%d SubjectAccessReviews, want 3", got)
	}
}

// TestConcurrencyBound: however many calls arrive at once, no more than
// MaxConcurrentReviews reviews run, and callers of the same token share
// one review.
func TestConcurrencyBound(t *testing.T) {
	cases := []struct {
		name        string
		callers     int
		sameToken   bool
		max         int
		wantReviews int64
		wantPeak    int64
	}{
		{"distinct tokens wait for a slot", 12, false, 3, 12, 3},
		{"one token, one review", 8, true, 3, 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			br := &blockingReviews{release: make(chan struct{})}
			a, err := newAuthenticator(br, newFakeAPI().AuthorizationV1().SubjectAccessReviews(),
				Config{MaxConcurrentReviews: tc.max}, discard(), clocktesting.NewFakeClock(time.Now()))
			if err != nil {
				t.Fatal(err)
			}
			shared := jwt([]string{DefaultAudience}, time.Time{})
			var wg sync.WaitGroup
			errs := make(chan error, tc.callers)
			for range tc.callers {
				tok := shared
				if !tc.sameToken {
					tok = jwt([]string{DefaultAudience}, time.Time{})
				}
				wg.Go(func() {
					_, err := a.authenticate(context.Background(), tok, claims{}, false)
					errs <- err
				})
			}
			waitFor(t, "the first reviews to start", func() bool { return br.inFlight.Load() == tc.wantPeak })
			close(br.release)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			if got := br.maxSeen.Load(); got != tc.wantPeak {
				t.Errorf("%d reviews ran at once, want %d", got, tc.wantPeak)
			}
			if got := br.calls.Load(); got != tc.wantReviews {
				t.Errorf("%d reviews, want %d", got, tc.wantReviews)
			}
		})
	}
}

// TestReviewTimeout: a review that cannot get a slot in time fails as
// unavailable, not as a refusal, and a caller giving up does not cancel
// the review others wait for.
func TestReviewTimeout(t *testing.T) {
	br := &blockingReviews{release: make(chan struct{})}
	a, err := newAuthenticator(br, newFakeAPI().AuthorizationV1().SubjectAccessReviews(),
		Config{MaxConcurrentReviews: 1, ReviewTimeout: 50 * time.Millisecond}, discard(), clocktesting.NewFakeClock(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.authenticate(context.Background(), jwt([]string{DefaultAudience}, time.Time{}), claims{}, false)
	if err == nil || isRefusal(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("stuck review: %v, want a deadline error that is no refusal", err)
	}
	close(br.release)
}
