package agentsim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// credentialSet is what the agents present: one TLS configuration
// trusting the control plane's CA bundle, as nodeagent/client builds it,
// and each agent's token. nodeagent/client reads both from files at every
// connect; here they are read once, since neither changes during a run
// and 5,000 agents reading a CA bundle and a token file at each
// reconnect would measure the agents' process, not the control plane.
type credentialSet struct {
	// tls is nil for plaintext (no CA bundle given).
	tls credentials.TransportCredentials
	// tokens[i] is agent i's token: substrings of one string holding the
	// whole file, so 5,000 tokens of about a kilobyte cost 5 MB once.
	tokens []string
}

// loadCredentials reads o.CAFile and o.TokenFile; without a CA bundle the
// agents dial in plaintext and send no token.
func loadCredentials(o *Options) (*credentialSet, error) {
	if o.CAFile == "" {
		return &credentialSet{}, nil
	}
	ca, err := os.ReadFile(o.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", o.CAFile)
	}
	data, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("reading the tokens: %w", err)
	}
	// One line per agent, in agent order.
	tokens := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(tokens) != o.Nodes {
		return nil, fmt.Errorf("token file %s holds %d tokens for %d agents", o.TokenFile, len(tokens), o.Nodes)
	}
	for i, t := range tokens {
		if t == "" {
			return nil, fmt.Errorf("token file %s: line %d is empty", o.TokenFile, i+1)
		}
	}
	return &credentialSet{
		// One configuration for every agent: without a session cache, Go's
		// client resumes no session, so every connect is a full handshake,
		// as a real agent's (which builds its configuration per connect).
		tls: credentials.NewTLS(&tls.Config{
			RootCAs:    pool,
			ServerName: o.ServerName,
			// nodeagent/client's: 1.2 for a terminating proxy, 1.3 with
			// the control plane.
			MinVersion: tls.VersionTLS12,
		}),
		tokens: tokens,
	}, nil
}

// dialOptions are agent i's transport and per-RPC credentials.
func (c *credentialSet) dialOptions(i int) []grpc.DialOption {
	if c.tls == nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(c.tls), grpc.WithPerRPCCredentials(bearerToken(c.tokens[i]))}
}

// bearerToken sends "authorization: Bearer <token>" with every RPC, over
// an encrypted and authenticated connection only, as nodeagent/client's
// bearerToken does.
type bearerToken string

// GetRequestMetadata returns the authorization header; it refuses a
// connection below privacy and integrity.
func (t bearerToken) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if err := credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity); err != nil {
		return nil, fmt.Errorf("refusing to send the token over this connection: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is true: a token is never sent in plaintext.
func (bearerToken) RequireTransportSecurity() bool { return true }
