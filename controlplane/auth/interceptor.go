package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// tableServicePrefix selects the calls that need a token. Reflection and
// grpc.health.v1 stay open: they reveal nothing but the schema and
// whether the replica serves.
var tableServicePrefix = "/" + pb.TableService_ServiceDesc.ServiceName + "/"

// UnaryInterceptor authenticates the TableService's unary calls (ListNodes,
// ListEvents) and puts the Identity in their context.
func (a *Authenticator) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, tableServicePrefix) {
			return handler(ctx, req)
		}
		ctx, _, _, err := a.authenticateCall(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authenticates the TableService's streams (Sync,
// WatchTable) when they start, before any message is read, and puts the
// Identity in their context. A Sync stream must carry an agent token of
// the agents' ServiceAccount bound to an agent Pod; which node it may act
// for is Authorize's decision, once the hello names one. The stream is
// then guarded (see guard): it ends, with the refusal's status, once its
// identity no longer holds.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, tableServicePrefix) {
			return handler(srv, ss)
		}
		ctx, cred, id, err := a.authenticateCall(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		g := a.guardStream(ctx, info.FullMethod, cred, id)
		err = handler(srv, &identityStream{ServerStream: ss, ctx: g.ctx})
		if revoked := g.stop(); revoked != nil {
			return revoked
		}
		return err
	}
}

// identityStream is a stream whose context carries an Identity.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// credential is the token a call presented, and what it claims.
type credential struct {
	token  string
	claims claims
}

// authenticateCall reviews the call's token and returns ctx with its
// Identity, or the gRPC status refusing the call.
func (a *Authenticator) authenticateCall(ctx context.Context, method string) (context.Context, credential, *Identity, error) {
	token, err := bearerToken(ctx)
	if err != nil {
		return nil, credential{}, nil, a.refuse(ctx, method, err)
	}
	c := parseClaims(token)
	// Every caller, agent or reader, presents a token for the control
	// plane's own audience, and only such tokens are reviewed: a replica
	// never sees a token it could replay against the API server. The
	// audience claim is read unverified, only to refuse without a review
	// what the review would refuse; the API server verifies it.
	if !slices.Contains(c.audiences, a.cfg.Audience) {
		return nil, credential{}, nil, a.refuse(ctx, method, fmt.Errorf(
			"%w: the token is not for audience %s (as a reader, use `kubectl create token <serviceaccount> --audience %s`)",
			errUnauthenticated, a.cfg.Audience, a.cfg.Audience))
	}
	id, err := a.authenticate(ctx, token, c, false)
	if err != nil {
		return nil, credential{}, nil, a.refuse(ctx, method, err)
	}
	if method == pb.TableService_Sync_FullMethodName {
		if _, err := a.checkAgent(ctx, id, true); err != nil {
			return nil, credential{}, nil, a.refuse(ctx, method, err)
		}
	}
	return WithIdentity(ctx, id), credential{token: token, claims: c}, id, nil
}

// checkAgent returns the node of an agent token's Pod, or refuses a token
// that is not the agents' ServiceAccount's or is not bound to one of its
// agent Pods as it is now (agentPods.check). A token bound to a Node, or
// to nothing, names no Pod: whoever may create tokens for the agents'
// ServiceAccount can mint one naming any node, so it proves nothing about
// where its bearer runs. wait is agentPods.check's.
func (a *Authenticator) checkAgent(ctx context.Context, id *Identity, wait bool) (string, error) {
	switch {
	case !id.Agent:
		return "", fmt.Errorf("%w: %s is not the agents' service account %s", errDenied, id.User, a.cfg.AgentServiceAccount)
	case id.Pod == "" || id.PodUID == "":
		bound := "to nothing"
		if id.Node != "" {
			bound = fmt.Sprintf("to node %q, not to a Pod", id.Node)
		}
		return "", fmt.Errorf("%w: the token of %s is bound %s: only the token projected into an agent Pod of DaemonSet %s proves a node",
			errDenied, id.User, bound, a.cfg.AgentDaemonSet)
	}
	return a.pods.check(ctx, id, wait)
}

// Authorize is server.Options.Authorize: the Sync stream's agent token
// must be bound to an agent Pod on nodeName. It is called after the hello
// and before the stream replaces another for the node, so only an
// authenticated agent of that node can replace its stream.
func (a *Authenticator) Authorize(ctx context.Context, nodeName string) error {
	id, ok := FromContext(ctx)
	if !ok {
		return a.refuse(ctx, pb.TableService_Sync_FullMethodName, fmt.Errorf("%w: %w", errUnauthenticated, errNoIdentity))
	}
	grant := func(ctx context.Context, id *Identity, how checkMode) error {
		node, err := a.checkAgent(ctx, id, how == admitting)
		if err != nil {
			return err
		}
		if node != nodeName {
			return fmt.Errorf("%w: the token is bound to a Pod on node %q, not %q", errDenied, node, nodeName)
		}
		return nil
	}
	if err := grant(ctx, id, admitting); err != nil {
		if errors.Is(err, errDenied) && id.Agent && id.Pod != "" {
			// An agent's own token used for another node is worth a
			// line: a misconfigured agent, or a node trying to take
			// another's table.
			a.log.Warn("refused a Sync stream", "pod", id.Pod, "helloNode", nodeName, "peer", peerAddr(ctx), "err", err)
			return toStatus(err)
		}
		return a.refuse(ctx, pb.TableService_Sync_FullMethodName, err)
	}
	grantStream(ctx, grant)
	return nil
}

// AuthorizeRead is server.Options.AuthorizeRead: an agent token may watch
// its own node's table; a reader token whose user may list EndpointSlices
// cluster-wide may read everything (nodeName "" is ListNodes and
// ListEvents).
func (a *Authenticator) AuthorizeRead(ctx context.Context, nodeName string) error {
	id, ok := FromContext(ctx)
	if !ok {
		return a.refuse(ctx, "read", fmt.Errorf("%w: %w", errUnauthenticated, errNoIdentity))
	}
	grant := func(ctx context.Context, id *Identity, how checkMode) error {
		return a.authorizeRead(ctx, id, nodeName, how)
	}
	if err := grant(ctx, id, admitting); err != nil {
		return a.refuse(ctx, "read", err)
	}
	grantStream(ctx, grant)
	return nil
}

// authorizeRead decides AuthorizeRead.
func (a *Authenticator) authorizeRead(ctx context.Context, id *Identity, nodeName string, how checkMode) error {
	if id.Agent {
		node, err := a.checkAgent(ctx, id, how == admitting)
		if err != nil {
			return err
		}
		if nodeName == "" || nodeName != node {
			return fmt.Errorf("%w: an agent token reads its own node's table (%q) only", errDenied, node)
		}
		return nil
	}
	ok, err := a.mayReadAll(ctx, id, how == rechecking)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s may not list %s.%s in all namespaces, which reading tables requires",
			errDenied, id.User, readAttributes.Resource, readAttributes.Group)
	}
	return nil
}

// refuse logs a refusal at debug level (anyone can cause one, so it must
// not flood the log) and a failure to reach the API server at warn, and
// returns the status.
func (a *Authenticator) refuse(ctx context.Context, method string, err error) error {
	st := toStatus(err)
	if isRefusal(err) {
		a.log.Debug("call refused", "method", method, "peer", peerAddr(ctx), "err", err)
	} else {
		a.log.Warn("could not authenticate a call", "method", method, "peer", peerAddr(ctx), "err", err)
	}
	return st
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
