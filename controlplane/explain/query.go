package explain

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Reply is one replica's answer to Explain, or why there is none.
type Reply struct {
	// Replica is the address asked.
	Replica string
	// Resp is its answer.
	Resp *pb.ExplainResponse
	// Err is set when it did not answer.
	Err error
}

// Query asks every replica in o.Servers for the explanation at once and
// returns their replies in the order given. Credentials that cannot be
// read fail the whole query; a replica that does not answer fails only
// its reply.
func Query(ctx context.Context, o *Options) ([]Reply, error) {
	dial, err := o.DialOptions()
	if err != nil {
		return nil, err
	}
	req := o.Request()
	replies := make([]Reply, len(o.Servers))
	var wg sync.WaitGroup
	for i, addr := range o.Servers {
		wg.Go(func() {
			resp, err := ask(ctx, addr, o, req, dial)
			replies[i] = Reply{Replica: addr, Resp: resp, Err: err}
		})
	}
	wg.Wait()
	return replies, nil
}

func ask(ctx context.Context, addr string, o *Options, req *pb.ExplainRequest, dial []grpc.DialOption) (*pb.ExplainResponse, error) {
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	resp, err := pb.NewTableServiceClient(conn).Explain(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("calling Explain on %s: %w", addr, err)
	}
	return resp, nil
}

// Pick returns the reply to show: the answer of the replica the node's
// agent is connected to, which alone knows what it acknowledged; else
// the first answer. With no answer it returns the reply whose error says
// the most: a refusal or NotFound from a replica, which every replica
// would give, before a replica that could not be reached.
func Pick(replies []Reply) Reply {
	var answered, refused, failed *Reply
	for i := range replies {
		r := &replies[i]
		switch {
		case r.Err == nil && r.Resp.GetConnected():
			return *r
		case r.Err == nil:
			answered = cmpFirst(answered, r)
		case decisive(r.Err):
			refused = cmpFirst(refused, r)
		default:
			failed = cmpFirst(failed, r)
		}
	}
	for _, r := range []*Reply{answered, refused, failed} {
		if r != nil {
			return *r
		}
	}
	return Reply{Err: errNoReplica}
}

func cmpFirst(have, r *Reply) *Reply {
	if have != nil {
		return have
	}
	return r
}

// decisive reports whether err is a replica's answer about the request
// (the caller's rights, the names in it) rather than a failure to reach
// it.
func decisive(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument:
		return true
	}
	return false
}
