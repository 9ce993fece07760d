package status

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Reply is one replica's answer to ListNodes, or why there is none.
type Reply struct {
	// Replica is the address asked.
	Replica string
	// Nodes is its answer, sorted by node name.
	Nodes []*pb.NodeStatus
	// Convergence is its latest changes, newest first.
	Convergence []*pb.Convergence
	// Err is set when the replica did not answer.
	Err error
}

// Query asks every replica in o.Servers for ListNodes at once and returns
// their replies in the order given. Credentials that cannot be read fail
// the whole query; a replica that does not answer fails only its reply.
func Query(ctx context.Context, o *Options) ([]Reply, error) {
	dial, err := o.DialOptions()
	if err != nil {
		return nil, err
	}
	replies := make([]Reply, len(o.Servers))
	var wg sync.WaitGroup
	for i, addr := range o.Servers {
		wg.Go(func() {
			resp, err := listNodes(ctx, addr, o, dial)
			replies[i] = Reply{Replica: addr, Nodes: resp.GetNodes(), Convergence: resp.GetConvergence(), Err: err}
		})
	}
	wg.Wait()
	return replies, nil
}

func listNodes(ctx context.Context, addr string, o *Options, dial []grpc.DialOption) (*pb.ListNodesResponse, error) {
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
	return resp, nil
}

// errNoReplica is returned when no replica answered.
var errNoReplica = errors.New("no replica answered")
