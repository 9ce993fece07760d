package app

import (
	"context"
	"crypto/tls"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/kubernetes"

	"github.com/proxyplane/proxyplane/controlplane/auth"
	"github.com/proxyplane/proxyplane/controlplane/certs"
	"github.com/proxyplane/proxyplane/controlplane/limit"
	"github.com/proxyplane/proxyplane/controlplane/server"
)

// Security is what guards the gRPC port: TLS, authentication and limits.
type Security struct {
	// Creds are the transport credentials; nil serves plaintext.
	Creds credentials.TransportCredentials
	// Auth authenticates and authorizes TableService calls; nil admits
	// everyone.
	Auth *auth.Authenticator
	// Limits bound connections, streams and rates; never nil.
	Limits *limit.Limiter
	// Ready is closed once a serving certificate exists.
	Ready <-chan struct{}
	// GetCertificate returns the serving certificate; nil with
	// --insecure. The metrics port serves it too.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// CertProblem says why there is no serving certificate valid now
	// (Readiness.CertProblem); nil where none is bootstrapped.
	CertProblem func(time.Time) string
	// run keeps a bootstrapped certificate current, if there is one.
	run func(context.Context) error
}

// NewSecurity builds what o asks for: plaintext and no authentication
// with --insecure, otherwise TLS (from files, or bootstrapped from the CA
// in o.Namespace through client) and identities checked by reviews sent
// through reviewClient.
func NewSecurity(client, reviewClient kubernetes.Interface, o *Options, log *slog.Logger) (*Security, error) {
	sec := &Security{Limits: limit.New(limitConfig(o), log.With("component", "limit"))}
	if o.Insecure {
		log.Warn("INSECURE: --insecure serves plaintext without authentication. Anyone who reaches " + o.GRPCAddress +
			" can read every node's table and take over any node's stream. Never use it outside tests.")
		ready := make(chan struct{})
		close(ready)
		sec.Ready = ready
		return sec, nil
	}
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	if o.TLSCertFile != "" {
		src, err := certs.NewFileSource(o.TLSCertFile, o.TLSKeyFile, log.With("component", "certs"))
		if err != nil {
			return nil, err
		}
		getCert = src.GetCertificate
		ready := make(chan struct{})
		close(ready)
		sec.Ready = ready
	} else {
		b := certs.NewBootstrapper(client, certs.BootstrapConfig{Namespace: o.Namespace, ExtraSANs: o.TLSSANs}, log.With("component", "certs"))
		getCert, sec.Ready, sec.run = b.GetCertificate, b.Ready(), b.Run
		sec.CertProblem = b.Problem
	}
	sec.GetCertificate = getCert
	sec.Creds = credentials.NewTLS(&tls.Config{
		GetCertificate: getCert,
		// 1.2 stays allowed for a TLS-terminating proxy an operator may
		// put in front; Go's defaults choose only AEAD suites for it.
		MinVersion: tls.VersionTLS12,
	})

	var err error
	sec.Auth, err = auth.New(reviewClient, auth.Config{
		Audience: o.TokenAudience, AgentServiceAccount: o.AgentServiceAccount,
		AgentDaemonSet: o.AgentDaemonSet, RecheckInterval: o.IdentityRecheckInterval,
	}, log.With("component", "auth"))
	if err != nil {
		return nil, err
	}
	return sec, nil
}

func limitConfig(o *Options) limit.Config {
	rate := o.PeerRate
	if rate == 0 {
		rate = -1 // the flag's "no limit"
	}
	return limit.Config{
		MaxAgents: o.MaxAgents, MaxStreams: o.MaxStreams, MaxConnections: o.MaxConnections,
		PeerRate: rate, PeerBurst: o.PeerBurst,
	}
}

// Run keeps a bootstrapped certificate current until ctx ends.
func (s *Security) Run(ctx context.Context) error {
	if s.run == nil {
		return nil
	}
	return s.run(ctx)
}

// serverOptions are the gRPC options and the hooks that enforce s: the
// limits' tap first, which admits a call before anything of it is read,
// so that a flood is throttled before it costs a review or memory; then
// authentication; then the agent cap, which only authenticated agents
// reach.
func (s *Security) serverOptions() ([]grpc.ServerOption, server.Options) {
	var unary []grpc.UnaryServerInterceptor
	stream := []grpc.StreamServerInterceptor{s.Limits.StreamInterceptor()}
	var hooks server.Options
	if s.Auth != nil {
		unary = append(unary, s.Auth.UnaryInterceptor())
		stream = append(stream, s.Auth.StreamInterceptor())
		hooks.Authorize, hooks.AuthorizeRead = s.Auth.Authorize, s.Auth.AuthorizeRead
	}
	stream = append(stream, s.Limits.AgentInterceptor())
	opts := []grpc.ServerOption{grpc.InTapHandle(s.Limits.Tap), grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...)}
	if s.Creds != nil {
		opts = append(opts, grpc.Creds(s.Creds))
	}
	return opts, hooks
}
