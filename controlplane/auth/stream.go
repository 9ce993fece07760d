package auth

import (
	"context"
	"math/rand/v2"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// A stream is authenticated when it opens, and may last for days. As the
// API server ends a watch after a while and authenticates the next, a
// guard checks a stream's identity again while it lasts: when its token
// expires, every RecheckInterval (asking the API server afresh, so a
// reader whose binding was removed, or a token whose ServiceAccount was
// deleted, loses its stream), and whenever the agent Pod its token is
// bound to changes or goes. When the identity no longer holds, the guard
// ends the stream with the refusal's status (Unauthenticated or
// PermissionDenied); an agent then reconnects with its current token, as
// it does after any stream ends. A re-check the API server cannot answer
// leaves the stream be: cutting every agent because the API server
// blinked would trade a bounded delay in revocation for an outage. Expiry
// needs no answer from anyone, so it always ends the stream.
//
// The guard lives in the auth layer, around the handler: the server's
// streams end when their context does, with no knowledge of tokens.
type guard struct {
	a      *Authenticator
	ctx    context.Context // the handler's: carries the guard, ends when it is revoked
	cancel context.CancelCauseFunc
	method string
	cred   credential
	id     *Identity // as the stream opened; re-checks review the same token
	podUID types.UID // registered with the agent Pods; "" when not

	// mu guards the fields below.
	mu sync.Mutex
	// grant re-applies the decision of the hook that admitted the stream
	// to what it asked (Authorize's node, AuthorizeRead's table); nil
	// until a hook admitted it.
	grant func(ctx context.Context, id *Identity, how checkMode) error
	// timer fires the next re-check.
	timer clock.Timer
	// revoked is the status that ended the stream; nil while it holds.
	revoked error
	// stopped is set once the handler returned.
	stopped bool
}

type guardKey struct{}

// checkMode says why an identity is checked, which decides what the
// check may do.
type checkMode int

const (
	// admitting: a hook admits a call. Reviews may come from the caches,
	// and a Pod not seen yet is waited for.
	admitting checkMode = iota
	// rechecking: a guard's periodic re-check. Reviews are asked afresh;
	// the Pod is as last seen (the stream's Pod was seen when admitted).
	rechecking
	// podEvent: a watch event for the stream's Pod. Nothing is asked of
	// the API server, and nothing waits: the informer's handler runs it.
	podEvent
)

// guardStream starts guarding a stream opened in ctx with cred, whose
// identity is id, and returns its guard: its ctx is the one to give the
// handler, and stop must be called when the handler returns.
func (a *Authenticator) guardStream(ctx context.Context, method string, cred credential, id *Identity) *guard {
	g := &guard{a: a, method: method, cred: cred, id: id}
	ctx, g.cancel = context.WithCancelCause(ctx)
	g.ctx = context.WithValue(ctx, guardKey{}, g)
	if id.Agent && id.PodUID != "" {
		g.podUID = types.UID(id.PodUID)
		a.pods.register(g.podUID, g)
	}
	g.schedule()
	return g
}

// grantStream records, on the guard of ctx's stream if it has one, the
// decision that admitted it, to be re-applied at every re-check.
func grantStream(ctx context.Context, grant func(ctx context.Context, id *Identity, how checkMode) error) {
	if g, ok := ctx.Value(guardKey{}).(*guard); ok {
		g.mu.Lock()
		g.grant = grant
		g.mu.Unlock()
	}
}

// schedule arms the next re-check: at the token's expiry or after about
// RecheckInterval, whichever comes first. The interval is shortened by up
// to a fifth at random, so that the streams of agents that connected
// together (a replica's start) are not all re-checked at once.
func (g *guard) schedule() {
	d := g.a.cfg.RecheckInterval
	if spread := d / 5; spread > 0 {
		d -= rand.N(spread)
	}
	if exp := g.cred.claims.expiry; !exp.IsZero() {
		d = min(d, exp.Sub(g.a.now()))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped || g.revoked != nil {
		return
	}
	// The fake clock in tests runs the function with its lock held; a
	// re-check asks the clock the time, and may ask the API server.
	g.timer = g.a.clock.AfterFunc(max(d, 0), func() { go g.recheck() })
}

// recheck reviews the token afresh and re-applies the stream's grant.
func (g *guard) recheck() {
	err := g.verify(g.ctx, rechecking)
	if g.ctx.Err() != nil {
		return
	}
	switch {
	case err == nil:
	case isRefusal(err):
		g.revoke(err)
		return
	default:
		g.a.log.Warn("could not re-check a stream's identity; the stream goes on until the next re-check",
			"method", g.method, "user", g.id.User, "peer", peerAddr(g.ctx), "err", err)
	}
	g.schedule()
}

// podChanged re-checks an agent stream when its Pod changed or went,
// without asking the API server: nothing but the Pod changed.
func (g *guard) podChanged() {
	if err := g.verify(g.ctx, podEvent); isRefusal(err) {
		g.revoke(err)
	}
}

// verify checks the stream's identity again: its token reviewed afresh
// (when rechecking), its agent Pod as this replica last saw it, and the
// grant it was admitted with.
func (g *guard) verify(ctx context.Context, how checkMode) error {
	id := g.id
	if how == rechecking {
		var err error
		if id, err = g.a.authenticate(ctx, g.cred.token, g.cred.claims, true); err != nil {
			return err
		}
	}
	g.mu.Lock()
	grant := g.grant
	g.mu.Unlock()
	if grant != nil {
		// Both grants (Authorize's, AuthorizeRead's) check an agent's
		// Pod themselves.
		return grant(ctx, id, how)
	}
	if id.Agent {
		if _, err := g.a.checkAgent(ctx, id, false); err != nil {
			return err
		}
	}
	return nil
}

// revoke ends the stream with err's status, once.
func (g *guard) revoke(err error) {
	st := toStatus(err)
	g.mu.Lock()
	if g.stopped || g.revoked != nil {
		g.mu.Unlock()
		return
	}
	g.revoked = st
	if g.timer != nil {
		g.timer.Stop()
	}
	g.mu.Unlock()
	g.a.log.Info("ending a stream: its identity no longer holds", "method", g.method, "user", g.id.User,
		"node", g.id.Node, "pod", g.id.Pod, "peer", peerAddr(g.ctx), "err", err)
	g.cancel(st)
}

// stop ends the guard when the handler has returned, and returns the
// status that ended the stream, nil if the guard did not.
func (g *guard) stop() error {
	g.mu.Lock()
	g.stopped = true
	if g.timer != nil {
		g.timer.Stop()
	}
	revoked := g.revoked
	g.mu.Unlock()
	if g.podUID != "" {
		g.a.pods.unregister(g.podUID, g)
	}
	g.cancel(nil)
	return revoked
}
