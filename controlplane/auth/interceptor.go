package auth

import (
	"context"
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
		ctx, err := a.authenticateCall(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authenticates the TableService's streams (Sync,
// WatchTable) when they start, before any message is read, and puts the
// Identity in their context. A Sync stream must carry an agent token of
// the agents' ServiceAccount bound to a node; which node it may act for
// is Authorize's decision, once the hello names one.
func (a *Authenticator) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, tableServicePrefix) {
			return handler(srv, ss)
		}
		ctx, err := a.authenticateCall(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &identityStream{ServerStream: ss, ctx: ctx})
	}
}

// identityStream is a stream whose context carries an Identity.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

// authenticateCall reviews the call's token and returns ctx with its
// Identity, or the gRPC status refusing the call.
func (a *Authenticator) authenticateCall(ctx context.Context, method string) (context.Context, error) {
	token, err := bearerToken(ctx)
	if err != nil {
		return nil, a.refuse(ctx, method, err)
	}
	c := parseClaims(token)
	// Sync takes agent tokens only. Reads take either kind; the token's
	// own (unverified) audience claim picks the one review to ask for,
	// and the API server then verifies that audience. A token that is no
	// JWT can only be a reader's.
	agent := method == pb.TableService_Sync_FullMethodName || slices.Contains(c.audiences, a.cfg.Audience)
	if agent && c.audiences == nil {
		// Projected ServiceAccount tokens are JWTs with an audience;
		// anything else is refused without troubling the API server.
		return nil, a.refuse(ctx, method, fmt.Errorf("%w: not a ServiceAccount token", errUnauthenticated))
	}
	id, err := a.authenticate(ctx, token, c, agent)
	if err != nil {
		return nil, a.refuse(ctx, method, err)
	}
	if method == pb.TableService_Sync_FullMethodName {
		if err := a.checkAgent(id); err != nil {
			return nil, a.refuse(ctx, method, err)
		}
	}
	return WithIdentity(ctx, id), nil
}

// checkAgent refuses an agent-audience token that is not the agents'
// ServiceAccount's, or names no node: only a token the kubelet minted for
// an agent Pod says which node its bearer runs on.
func (a *Authenticator) checkAgent(id *Identity) error {
	switch {
	case !id.Agent:
		return fmt.Errorf("%w: %s presented a token for the API server, not for audience %s", errDenied, id.User, a.cfg.Audience)
	case id.User != a.agentUser:
		return fmt.Errorf("%w: %s is not the agents' service account %s", errDenied, id.User, a.cfg.AgentServiceAccount)
	case id.Node == "":
		return fmt.Errorf("%w: the token of %s is not bound to a Pod on a node (%s)", errDenied, id.User, NodeNameExtra)
	}
	return nil
}

// Authorize is server.Options.Authorize: the Sync stream's agent token
// must be bound to nodeName. It is called after the hello and before the
// stream replaces another for the node, so only an authenticated agent of
// that node can replace its stream.
func (a *Authenticator) Authorize(ctx context.Context, nodeName string) error {
	id, ok := FromContext(ctx)
	if !ok {
		return a.refuse(ctx, pb.TableService_Sync_FullMethodName, fmt.Errorf("%w: %w", errUnauthenticated, errNoIdentity))
	}
	if err := a.checkAgent(id); err != nil {
		return a.refuse(ctx, pb.TableService_Sync_FullMethodName, err)
	}
	if id.Node != nodeName {
		err := fmt.Errorf("%w: the token is bound to node %q, not %q", errDenied, id.Node, nodeName)
		// An agent's own token used for another node is worth a line:
		// a misconfigured agent, or a node trying to read another's table.
		a.log.Warn("refused a Sync stream for another node", "tokenNode", id.Node, "helloNode", nodeName, "peer", peerAddr(ctx))
		return toStatus(err)
	}
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
	if id.Agent {
		if err := a.checkAgent(id); err != nil {
			return a.refuse(ctx, "read", err)
		}
		if nodeName == "" || nodeName != id.Node {
			return a.refuse(ctx, "read", fmt.Errorf("%w: an agent token reads its own node's table (%q) only", errDenied, id.Node))
		}
		return nil
	}
	ok, err := a.mayReadAll(ctx, id)
	if err != nil {
		return a.refuse(ctx, "read", err)
	}
	if !ok {
		return a.refuse(ctx, "read", fmt.Errorf("%w: %s may not list %s.%s in all namespaces, which reading tables requires",
			errDenied, id.User, readAttributes.Resource, readAttributes.Group))
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
