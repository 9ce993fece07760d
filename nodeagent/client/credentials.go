package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Credentials say how the agent checks the control plane (TLS against a
// CA bundle) and proves its node (a bearer token on every RPC).
//
// Both files are read on every connect, never cached: the kubelet
// rewrites a projected token before it expires and updates a mounted
// ConfigMap in place, and either may appear after the agent starts (the
// CA bundle only once a control plane has published it).
type Credentials struct {
	// Insecure dials in plaintext and sends no token: for tests only.
	// Anyone on the path could then read the node's table and, answering
	// on a control plane address, program any rule on the node.
	Insecure bool
	// CAFile holds the PEM bundle the control plane's serving certificate
	// must chain to. Nothing else is trusted: not the system roots.
	CAFile string
	// ServerName is the name the serving certificate must carry. Agents
	// dial node addresses, which the certificate need not name, so the
	// name is set explicitly (it is also the TLS SNI).
	ServerName string
	// TokenFile holds the bearer token sent with every RPC: the agent's
	// projected ServiceAccount token.
	TokenFile string
}

// errCredentials marks a connect that could not start because the CA
// bundle or the token could not be read. Run logs it apart from a stream
// that ended: the fix is on the node (a volume, a ConfigMap not published
// yet), not on the network.
var errCredentials = errors.New("credentials unavailable")

// maxCredentialFile bounds what is read from the CA and token files: a
// token is about a kilobyte and a bundle a few certificates; anything
// much larger is not what the kubelet mounted.
const maxCredentialFile = 1 << 20

// dialOptions reads the CA bundle and the token now and returns the
// transport and per-RPC credentials for one connection.
func (c Credentials) dialOptions() ([]grpc.DialOption, error) {
	if c.Insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	pem, err := readCredentialFile(c.CAFile, "CA bundle")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: CA bundle %s holds no PEM certificate", errCredentials, c.CAFile)
	}
	token, err := readCredentialFile(c.TokenFile, "token")
	if err != nil {
		return nil, err
	}
	tok := strings.TrimSpace(string(token))
	if tok == "" {
		return nil, fmt.Errorf("%w: token file %s is empty", errCredentials, c.TokenFile)
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs:    pool,
			ServerName: c.ServerName,
			// The control plane is Go's TLS stack, which speaks 1.3; 1.2
			// stays allowed for a terminating proxy an operator may put
			// in front of it.
			MinVersion: tls.VersionTLS12,
		})),
		grpc.WithPerRPCCredentials(bearerToken(tok)),
	}, nil
}

// readCredentialFile reads a CA bundle or token file, bounded, and says
// which one is missing in its error.
func readCredentialFile(path, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s %s: %w", errCredentials, what, path, err)
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, maxCredentialFile+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s %s: %w", errCredentials, what, path, err)
	}
	if len(data) > maxCredentialFile {
		return nil, fmt.Errorf("%w: %s %s is larger than %d bytes", errCredentials, what, path, maxCredentialFile)
	}
	return data, nil
}

// bearerToken sends "authorization: Bearer <token>" with every RPC, and
// only over a transport that encrypts and authenticates the server: a
// token sent in plaintext, or to a server nobody checked, is a token
// given away.
type bearerToken string

// GetRequestMetadata returns the authorization header. It refuses a
// connection below privacy and integrity, which grpc also checks when
// dialing because RequireTransportSecurity is true.
func (t bearerToken) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if err := credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity); err != nil {
		return nil, fmt.Errorf("refusing to send the token over this connection: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is true: see bearerToken.
func (bearerToken) RequireTransportSecurity() bool { return true }
