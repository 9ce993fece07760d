package auth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"
)

// MaxTokenBytes bounds a bearer token. Projected ServiceAccount tokens are
// about a kilobyte, OIDC ID tokens a few; a larger value is not a token
// and is refused before it is hashed, decoded or sent anywhere.
const MaxTokenBytes = 16 << 10

// bearerToken returns the token of the call's single authorization
// header. gRPC metadata keys are lower case; the scheme is compared case
// insensitively, as RFC 6750 and the API server do.
func bearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	switch len(vals) {
	case 0:
		return "", fmt.Errorf("%w: no authorization metadata: send \"authorization: Bearer <token>\"", errUnauthenticated)
	case 1:
	default:
		return "", fmt.Errorf("%w: %d authorization values, want one", errUnauthenticated, len(vals))
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", fmt.Errorf("%w: authorization is not \"Bearer <token>\"", errUnauthenticated)
	}
	token = strings.TrimSpace(token)
	switch {
	case token == "":
		return "", fmt.Errorf("%w: empty bearer token", errUnauthenticated)
	case len(token) > MaxTokenBytes:
		return "", fmt.Errorf("%w: bearer token longer than %d bytes", errUnauthenticated, MaxTokenBytes)
	case strings.ContainsAny(token, " \t"):
		return "", fmt.Errorf("%w: malformed bearer token", errUnauthenticated)
	}
	return token, nil
}

// tokenHash keys the caches: the token itself is never kept.
type tokenHash [sha256.Size]byte

func hashToken(token string) tokenHash { return sha256.Sum256([]byte(token)) }

// claims are what a token's JWT payload says, read WITHOUT verifying its
// signature. They only route and shorten: the audience picks which
// TokenReview to ask for (the API server then verifies it), and the
// expiry bounds how long a positive review is cached, or refuses a token
// already expired without asking. Neither can make a token accepted
// that the API server would refuse.
type claims struct {
	// audiences is nil for a token that is not a JWT.
	audiences []string
	// expiry is zero when unknown.
	expiry time.Time
}

// parseClaims decodes a JWT payload; anything else yields empty claims
// (an opaque token the API server may still accept).
func parseClaims(token string) claims {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return claims{}
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return claims{}
	}
	var raw struct {
		Aud json.RawMessage `json:"aud"`
		Exp json.Number     `json:"exp"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return claims{}
	}
	var c claims
	// RFC 7519: aud is a string or an array of strings.
	var one string
	if err := json.Unmarshal(raw.Aud, &one); err == nil {
		c.audiences = []string{one}
	} else {
		_ = json.Unmarshal(raw.Aud, &c.audiences)
	}
	if exp, err := raw.Exp.Int64(); err == nil && exp > 0 {
		c.expiry = time.Unix(exp, 0)
	} else if f, err := raw.Exp.Float64(); err == nil && f > 0 {
		c.expiry = time.Unix(int64(f), 0)
	}
	return c
}
