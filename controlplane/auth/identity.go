package auth

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"maps"
	"slices"
)

// TokenReview user extras the API server sets for a ServiceAccount token
// bound to an object. A token bound to a Pod carries the Pod's name and
// uid, and (Kubernetes 1.30 and later) its node's name; a token bound to
// a Node carries the node's name only; an unbound token none of them.
const (
	// NodeNameExtra names the node of the Pod, or the Node, a token is
	// bound to.
	NodeNameExtra = "authentication.kubernetes.io/node-name"
	// PodNameExtra names the Pod a token is bound to.
	PodNameExtra = "authentication.kubernetes.io/pod-name"
	// PodUIDExtra is the uid of the Pod a token is bound to: a Pod
	// deleted and created again under the same name is another Pod.
	PodUIDExtra = "authentication.kubernetes.io/pod-uid"
)

// Identity is who the API server says a call's token belongs to. It is
// immutable once built: cached identities are shared between calls.
type Identity struct {
	// User, UID, Groups and Extra are the TokenReview's user.
	User   string
	UID    string
	Groups []string
	Extra  map[string][]string
	// Agent says the token is the agents' ServiceAccount's: it may only
	// ever act for the node of the agent Pod it is bound to, and is never
	// used for reader access.
	Agent bool
	// Node, Pod and PodUID are the node and Pod the token is bound to,
	// from Extra; each "" when Extra names none or several.
	Node, Pod, PodUID string
}

type identityKey struct{}

// WithIdentity returns ctx carrying id.
func WithIdentity(ctx context.Context, id *Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// FromContext returns the identity the interceptors put in ctx, if any.
func FromContext(ctx context.Context) (*Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(*Identity)
	return id, ok && id != nil
}

// userHash keys the access cache: the same user (name, UID, groups and
// extra, as a SubjectAccessReview sees them) gets the same answer
// whichever of its tokens it presents. Each string is length-prefixed, so
// no two users share a key by concatenation.
func (id *Identity) userHash() [sha256.Size]byte {
	h := sha256.New()
	write := func(s string) {
		_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
		_, _ = h.Write([]byte(s))
	}
	write(id.User)
	write(id.UID)
	writeList(h, write, id.Groups)
	for _, k := range slices.Sorted(maps.Keys(id.Extra)) {
		write(k)
		writeList(h, write, id.Extra[k])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

func writeList(h hash.Hash, write func(string), l []string) {
	_ = binary.Write(h, binary.BigEndian, uint32(len(l)))
	for _, s := range l {
		write(s)
	}
}
