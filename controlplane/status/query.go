package status

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// maxResponseBytes bounds a ListNodes answer: a few hundred bytes per
// node, so 64 MiB is room for far more than 5,000 nodes, where gRPC's
// default of 4 MiB is not.
const maxResponseBytes = 64 << 20

// Reply is one replica's answer to ListNodes, or why there is none.
type Reply struct {
	// Replica is the address asked.
	Replica string
	// Nodes is its answer, sorted by node name.
	Nodes []*pb.NodeStatus
	// Err is set when the replica did not answer.
	Err error
}

// Query asks every replica in o.Servers for ListNodes at once and returns
// their replies in the order given. Credentials that cannot be read fail
// the whole query; a replica that does not answer fails only its reply.
func Query(ctx context.Context, o *Options) ([]Reply, error) {
	dial, err := dialOptions(o)
	if err != nil {
		return nil, err
	}
	replies := make([]Reply, len(o.Servers))
	var wg sync.WaitGroup
	for i, addr := range o.Servers {
		wg.Go(func() {
			nodes, err := listNodes(ctx, addr, o, dial)
			replies[i] = Reply{Replica: addr, Nodes: nodes, Err: err}
		})
	}
	wg.Wait()
	return replies, nil
}

func listNodes(ctx context.Context, addr string, o *Options, dial []grpc.DialOption) ([]*pb.NodeStatus, error) {
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	resp, err := pb.NewTableServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListNodes on %s: %w", addr, err)
	}
	return resp.GetNodes(), nil
}

// dialOptions reads the CA bundle and the token once, for every replica.
func dialOptions(o *Options) ([]grpc.DialOption, error) {
	opts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponseBytes))}
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
		grpc.WithPerRPCCredentials(bearer(token)),
	), nil
}

// bearer sends a token with every call, over TLS only.
type bearer string

// GetRequestMetadata returns the authorization header.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is true: a token is never sent in plaintext.
func (bearer) RequireTransportSecurity() bool { return true }

// errNoReplica is returned when no replica answered.
var errNoReplica = errors.New("no replica answered")
