package scenarios

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// The control plane's defaults these attacks run into (limit and auth
// packages): the calls a replica admits before anyone has proved who it
// is, in all and from one source, and the failed authentications one
// source may cause at once.
const (
	maxUnverified          = 16
	maxUnverifiedPerSource = 4
	failureBurst           = 10
)

// strangerStreams is what flood keeps open; close ends them all.
type strangerStreams struct {
	conns  []io.Closer
	cancel context.CancelFunc
}

func (s *strangerStreams) close() {
	s.cancel()
	for _, c := range s.conns {
		_ = c.Close()
	}
}

// flood opens health watches and reflection streams without a token on
// c, as any pod can, until c refuses one, and returns how many it
// admitted; they stay open until close. It fails t if c never refuses
// within a bound well past maxUnverified, or refuses with another code.
func flood(ctx context.Context, t *testing.T, c *box.ControlPlane, creds box.ClientCredentials) (int, *strangerStreams) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	s := &strangerStreams{cancel: cancel}
	var conn *grpc.ClientConn
	for i := range 8 * maxUnverified {
		// Four streams a connection stay under --max-streams-per-connection,
		// past which a client waits instead of being refused.
		if i%4 == 0 {
			var err error
			if conn, err = c.Dial(creds); err != nil {
				s.close()
				t.Fatal(err)
			}
			s.conns = append(s.conns, conn)
		}
		var err error
		if i%2 == 0 {
			var w grpc.ServerStreamingClient[healthpb.HealthCheckResponse]
			if w, err = healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}); err == nil {
				_, err = w.Recv()
			}
		} else {
			var r grpc.BidiStreamingClient[reflectionpb.ServerReflectionRequest, reflectionpb.ServerReflectionResponse]
			if r, err = reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx); err == nil {
				// A stream the server refused makes Send fail with io.EOF;
				// gRPC gives its status to Recv.
				if err = r.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err == nil || errors.Is(err, io.EOF) {
					_, err = r.Recv()
				}
			}
		}
		switch status.Code(err) {
		case codes.OK:
		case codes.ResourceExhausted:
			return i, s
		default:
			s.close()
			t.Fatalf("stranger's stream %d on %s: %v, want admitted or ResourceExhausted", i, c.Name(), err)
		}
	}
	s.close()
	t.Fatalf("%s admitted %d strangers' streams and refused none", c.Name(), 8*maxUnverified)
	return 0, nil
}

// padded is m carrying n bytes more, as an unknown field: any client can
// send that.
func padded[M proto.Message](m M, n int) M {
	b := protowire.AppendTag(nil, 1000, protowire.BytesType)
	m.ProtoReflect().SetUnknown(protowire.AppendBytes(b, make([]byte, n)))
	return m
}

// randomToken is a JWT-shaped token for the control plane's audience
// that nobody issued, different each time.
func randomToken(t *testing.T, audience string) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		t.Fatal(err)
	}
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"aud":["`+audience+`"],"jti":"`+enc(nonce)+`"}`)) + "." + enc(nonce)
}

// testAttackLimits is issue 21's "refuse before reading", as an attacker
// in a pod would try it against the real binaries and API server: streams
// that need no token, requests of megabytes, random tokens. Each is
// refused with ResourceExhausted (or a bare Unauthenticated), while a
// real agent is admitted and a reader answered.
func (e *env) testAttackLimits(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	base := b.Credentials()
	stranger := withToken(base, "")
	victim := b.Agents[0]

	t.Run("StrangersCannotCrowdOutAgents", func(t *testing.T) {
		// Every replica's unverified budget is full of strangers' streams.
		for _, c := range b.ControlPlanes {
			n, s := flood(ctx, t, c, stranger)
			defer s.close()
			if n > maxUnverifiedPerSource {
				t.Errorf("%s admitted %d strangers' streams from one address, want at most %d", c.Name(), n, maxUnverifiedPerSource)
			}
			figure(t, "attack-strangers", "replica=%s admitted=%d", c.Name(), n)
			// A reader's watch is in the agents' budget, not the strangers'.
			if err := watchTable(ctx, c, base, victim.Node.Name()); err != nil {
				t.Errorf("reader's WatchTable on %s while strangers fill its budget: %v", c.Name(), err)
			}
		}
		// A real agent that reconnects now is admitted all the same.
		if err := victim.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			st, err := victim.State(ctx)
			if err == nil && st.Connected {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not connected a minute after its restart, with strangers' streams open: %+v, %v", victim.Name(), st, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	// The strangers' streams are closed: their slots come back.
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatalf("box not whole after the strangers left: %v", err)
	}

	t.Run("OversizedRequestsRefusedUnread", func(t *testing.T) {
		c := b.ControlPlanes[0]
		conn, err := c.Dial(stranger)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		const size = 7 << 20 // under --max-recv-message-bytes, past every small message's bound
		_, err = pb.NewTableServiceClient(conn).ListNodes(cctx, padded(&pb.ListNodesRequest{}, size))
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("ListNodes of %d bytes without a token: %v, want ResourceExhausted", size, err)
		}
		_, err = healthpb.NewHealthClient(conn).Check(cctx, padded(&healthpb.HealthCheckRequest{}, size))
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("Health.Check of %d bytes: %v, want ResourceExhausted", size, err)
		}
		if err := listNodes(ctx, c, base); err != nil {
			t.Errorf("reader's ListNodes after the oversized calls: %v", err)
		}
	})

	t.Run("RandomTokensLimitedPerSource", func(t *testing.T) {
		// A replica of its own, so that no earlier scenario's refusals
		// count against this source.
		c, err := b.StartExtraControlPlane(ctx, "controlplane-attack-limits", 9700)
		if err != nil {
			t.Fatal(err)
		}
		// The reader and an agent authenticate first: a token the replica
		// has accepted passes however its source fails afterwards. (Agents
		// have addresses of their own; this one shares the attacker's.)
		if err := listNodes(ctx, c, base); err != nil {
			t.Fatalf("reader's ListNodes: %v", err)
		}
		token, err := b.AgentToken(ctx, victim.Pod)
		if err != nil {
			t.Fatal(err)
		}
		agent := withToken(base, token.Status.Token)
		if _, err := syncAttempt(ctx, c, agent, victim.Node.Name()); err != nil {
			t.Fatalf("agent's Sync: %v", err)
		}
		audience := b.Deployment().AgentMounts.TokenAudience
		var unauthenticated, exhausted int
		for i := range 3 * failureBurst {
			err := listNodes(ctx, c, withToken(base, randomToken(t, audience)))
			msg := status.Convert(err).Message()
			switch status.Code(err) {
			case codes.Unauthenticated:
				unauthenticated++
				if msg != "unauthenticated" {
					t.Errorf("random token %d: told %q, want the bare code", i, msg)
				}
			case codes.ResourceExhausted:
				exhausted++
				if !strings.Contains(msg, "failed authentications") {
					t.Errorf("random token %d: ResourceExhausted for %q, want for failed authentications", i, msg)
				}
			default:
				t.Fatalf("random token %d: %v, want Unauthenticated or ResourceExhausted", i, err)
			}
		}
		figure(t, "attack-random-tokens", "unauthenticated=%d exhausted=%d", unauthenticated, exhausted)
		if unauthenticated != failureBurst {
			t.Errorf("%d random tokens reviewed and refused, want %d (the burst), the rest refused unreviewed", unauthenticated, failureBurst)
		}
		if err := listNodes(ctx, c, base); err != nil {
			t.Errorf("reader's ListNodes after the flood from its own address: %v", err)
		}
		if _, err := syncAttempt(ctx, c, agent, victim.Node.Name()); err != nil {
			t.Errorf("agent's Sync after the flood from its address: %v", err)
		}
	})
}
