package adminclient

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

// MaxResponseBytes bounds an admin RPC's answer: ListNodes says a few
// hundred bytes per node, so 64 MiB is room for far more than 5,000
// nodes, where gRPC's default of 4 MiB is not.
const MaxResponseBytes = 64 << 20

// DialOptions returns the gRPC dial options for o's credentials: TLS with
// o.CAFile and o.ServerName and o.TokenFile's bearer token, or plaintext
// with --insecure. It reads the files once, for every replica.
func (o *Options) DialOptions() ([]grpc.DialOption, error) {
	opts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxResponseBytes))}
	if o.Insecure {
		return append(opts, grpc.WithTransportCredentials(insecure.NewCredentials())), nil
	}
	ca, err := os.ReadFile(o.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", o.CAFile)
	}
	tok, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("reading the token: %w", err)
	}
	token := strings.TrimSpace(string(tok))
	if token == "" {
		return nil, fmt.Errorf("token file %s is empty", o.TokenFile)
	}
	return append(opts,
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: o.ServerName, MinVersion: tls.VersionTLS12})),
		grpc.WithPerRPCCredentials(Bearer(token)),
	), nil
}

// Bearer sends a token with every call, over TLS only.
type Bearer string

// GetRequestMetadata returns the authorization header.
func (b Bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is true: a token is never sent in plaintext.
func (Bearer) RequireTransportSecurity() bool { return true }
