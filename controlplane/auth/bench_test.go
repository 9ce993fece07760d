package auth

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAuthenticate measures the control plane's side of a review
// against the fake clientset (the API server's side is the e2e suite's):
// uncached, a TokenReview per call; cached, a hash and a lookup.
func BenchmarkAuthenticate(b *testing.B) {
	for _, bc := range []struct {
		name   string
		cached bool
	}{{"uncached", false}, {"cached", true}} {
		b.Run(bc.name, func(b *testing.B) {
			f := newFakeAPI()
			a, err := New(f, Config{CacheSize: b.N + 1}, discard())
			if err != nil {
				b.Fatal(err)
			}
			exp := time.Now().Add(time.Hour)
			tokens := make([]string, b.N)
			shared := agentToken(f, exp)
			for i := range tokens {
				if bc.cached {
					tokens[i] = shared
				} else {
					tokens[i] = agentToken(f, exp)
				}
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				if _, err := a.authenticate(ctx, tokens[i], parseClaims(tokens[i]), false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
