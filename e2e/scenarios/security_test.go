package scenarios

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// tokenSeconds is the shortest lifetime the TokenRequest API grants.
const tokenSeconds = 600

// callTimeout bounds one refused or accepted call: a local round trip and
// at most one TokenReview.
const callTimeout = 10 * time.Second

// syncAttempt opens a Sync stream to c with creds, says hello as node
// holding nothing, and returns the first response, or the error that
// ended the stream (its status carries the code).
func syncAttempt(ctx context.Context, c *box.ControlPlane, creds box.ClientCredentials, node string) (*pb.SyncResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	conn, err := c.Dial(creds)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	stream, err := pb.NewTableServiceClient(conn).Sync(ctx)
	if err != nil {
		return nil, err
	}
	hello := &pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: &pb.Hello{NodeName: node, Capabilities: &pb.Capabilities{Deltas: true}}}}
	// A refused stream may already be closed: the send then reports EOF
	// and the receive the status.
	if err := stream.Send(hello); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return stream.Recv()
}

// listNodes calls ListNodes on c with creds.
func listNodes(ctx context.Context, c *box.ControlPlane, creds box.ClientCredentials) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	conn, err := c.Dial(creds)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	_, err = pb.NewTableServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{})
	return err
}

// watchTable opens WatchTable for node on c with creds and returns the
// error of its first message, nil for a snapshot.
func watchTable(ctx context.Context, c *box.ControlPlane, creds box.ClientCredentials, node string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	conn, err := c.Dial(creds)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	s, err := pb.NewTableServiceClient(conn).WatchTable(ctx, &pb.WatchTableRequest{NodeName: node})
	if err != nil {
		return err
	}
	m, err := s.Recv()
	if err == nil && m.GetSnapshot() == nil {
		return fmt.Errorf("WatchTable opened with %T, not a snapshot", m.GetKind())
	}
	return err
}

// selfSignedCA returns the PEM of a CA nobody issued anything with: a
// client trusting only it trusts no control plane.
func selfSignedCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "not-the-proxyplane-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// deletedPodToken returns an agent token bound to a Pod on node that has
// since been deleted. A TokenRequest cannot be made to expire within a
// test (600 s is the API server's minimum lifetime), but a bound token is
// invalid once its object is gone, which the API server checks on every
// review: the same refusal an expired token gets. It waits until the API
// server itself rejects the token, so the control plane's answer does not
// depend on the API server's pod cache catching up.
func deletedPodToken(ctx context.Context, t *testing.T, b *box.Box, node string) string {
	t.Helper()
	pod, err := b.CreateAgentPod(ctx, "proxyplane-nodeagent-e2e-deleted", node)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := b.AgentToken(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	audience := b.Deployment().AgentMounts.TokenAudience
	err = box.Eventually(ctx, func() error {
		r, err := b.Admin().AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{audience}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if r.Status.Authenticated {
			return errors.New("the API server still accepts the token of the deleted pod")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// testAuthentication attacks the replica serving node-1's agent with
// every kind of wrong credential, each sending node-1's hello as a
// hijacker would: no token, the token of a deleted pod (standing for an
// expired one), a token for the API server's audience, another
// ServiceAccount's token, node-0's own agent token, a plaintext client,
// and a client that does not trust the published bundle. Each fails with
// its code, node-1's real stream stays up (the same connected_at), and
// node-1 still receives the next change. The debug RPCs refuse what the
// SubjectAccessReview rule refuses, and reflection and health stay open.
func (e *env) testAuthentication(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	stream := victimStream(ctx, t, b)
	victim, replica, other := stream.agent, stream.replica, b.Agents[0]

	base := b.Credentials()
	with := func(token string) box.ClientCredentials { c := base; c.Token = token; return c }
	audience := []string{b.Deployment().AgentMounts.TokenAudience}
	otherToken, err := b.AgentToken(ctx, other.Pod)
	if err != nil {
		t.Fatal(err)
	}
	cpToken, err := b.Token(ctx, b.Deployment().ServiceAccount, audience, nil, tokenSeconds)
	if err != nil {
		t.Fatal(err)
	}
	apiAudience, err := b.Token(ctx, b.AgentServiceAccount(), nil, victim.Pod, tokenSeconds)
	if err != nil {
		t.Fatal(err)
	}
	untrusted := base
	untrusted.CAPEM = selfSignedCA(t)
	plaintext := box.ClientCredentials{Insecure: true}

	cases := []struct {
		name  string
		creds box.ClientCredentials
		want  codes.Code
		// says is a part of the error, for transport failures whose code
		// (Unavailable) does not say why.
		says string
	}{
		{"no token", with(""), codes.Unauthenticated, ""},
		{"token of a deleted pod", with(deletedPodToken(ctx, t, b, victim.Node.Name())), codes.Unauthenticated, ""},
		{"agent token for the API server's audience", with(apiAudience.Status.Token), codes.Unauthenticated, ""},
		{"another ServiceAccount's token", with(cpToken.Status.Token), codes.PermissionDenied, ""},
		{"another node's agent token", with(otherToken.Status.Token), codes.PermissionDenied, ""},
		{"plaintext", plaintext, codes.Unavailable, ""},
		{"untrusted bundle", withToken(untrusted, otherToken.Status.Token), codes.Unavailable, "certificate signed by unknown authority"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			resp, err := syncAttempt(ctx, replica, tc.creds, victim.Node.Name())
			if err == nil {
				t.Fatalf("Sync as %s accepted, first response %T", victim.Node.Name(), resp.GetKind())
			}
			if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Sync as %s: %v, want %s %q", victim.Node.Name(), err, tc.want, tc.says)
			}
			figure(t, "auth-refused", "case=%q code=%s took=%s", tc.name, status.Code(err), ms(time.Since(start)))
		})
	}

	t.Run("DebugRPCs", func(t *testing.T) {
		noRBAC, err := b.Token(ctx, b.AgentServiceAccount(), audience, nil, tokenSeconds)
		if err != nil {
			t.Fatal(err)
		}
		checks := []struct {
			name string
			err  error
			want codes.Code
		}{
			{"ListNodes, debug identity", listNodes(ctx, replica, base), codes.OK},
			{"ListNodes, no token", listNodes(ctx, replica, with("")), codes.Unauthenticated},
			{"ListNodes, identity without RBAC", listNodes(ctx, replica, with(noRBAC.Status.Token)), codes.PermissionDenied},
			{"ListNodes, agent token", listNodes(ctx, replica, with(otherToken.Status.Token)), codes.PermissionDenied},
			{"WatchTable of its own node, agent token", watchTable(ctx, replica, with(otherToken.Status.Token), other.Node.Name()), codes.OK},
			{"WatchTable of another node, agent token", watchTable(ctx, replica, with(otherToken.Status.Token), victim.Node.Name()), codes.PermissionDenied},
			{"WatchTable, no token", watchTable(ctx, replica, with(""), victim.Node.Name()), codes.Unauthenticated},
		}
		for _, c := range checks {
			if status.Code(c.err) != c.want {
				t.Errorf("%s: %v, want %s", c.name, c.err, c.want)
			}
		}
		conn, err := replica.Dial(with(""))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health without a token: %v, want it open", err)
		}
	})

	// None of that touched node-1's stream, and node-1 still gets
	// changes: a new Service reaches every node.
	if _, _, err := b.CreateService(ctx, box.NewService("after-attacks"), podOn(b, 0), podOn(b, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitProgrammed(ctx, hasEntry(e, "e2e/after-attacks", podOn(b, 0), podOn(b, 2))); err != nil {
		t.Fatal(err)
	}
	stream.checkStayed(ctx, t)
}

// attackedStream is the stream an attack scenario must leave alone: the
// victim agent's (node-1's), on the replica serving it, opened at since.
type attackedStream struct {
	agent   *box.Agent
	replica *box.ControlPlane
	since   time.Time
}

// victimStream finds node-1's agent, the attack scenarios' victim, and
// the replica serving it: the one the attacks target, where its stream
// must stay.
func victimStream(ctx context.Context, t *testing.T, b *box.Box) attackedStream {
	t.Helper()
	victim := b.Agents[1]
	on, statuses, err := b.Connections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	replica := on[victim.Node.Name()]
	if replica == nil {
		t.Fatalf("%s is connected to no replica", victim.Node.Name())
	}
	return attackedStream{agent: victim, replica: replica, since: statuses[victim.Node.Name()].GetConnectedAt().AsTime()}
}

// checkStayed fails t unless the victim's stream is still the one
// victimStream found: connected to the same replica since the same time.
func (s attackedStream) checkStayed(ctx context.Context, t *testing.T) {
	t.Helper()
	node := s.agent.Node.Name()
	st, err := s.replica.NodeStatus(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if !st.GetConnected() || !st.GetConnectedAt().AsTime().Equal(s.since) {
		t.Errorf("%s's stream on %s: connected %t since %s, want the stream of %s to have stayed", node, s.replica.Name(),
			st.GetConnected(), st.GetConnectedAt().AsTime(), s.since)
	}
}

// withToken returns c carrying token.
func withToken(c box.ClientCredentials, token string) box.ClientCredentials {
	c.Token = token
	return c
}

// testCertificateRotation restarts each replica in turn, as a rollout
// does, while a probe sends new connections to web from the client. Each
// replica comes back with a new serving certificate from the same CA;
// its agents move to the other replica and back without a failed
// connection or a byte of table.
func (e *env) testCertificateRotation(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	web := webService(t, e)
	versions, _ := snapshotState(ctx, t, b)
	probe := b.StartProbe(b.Topology().ClientNS(), box.ClusterAddr(web), probeInterval, probeTimeout, probeMaxDials)
	defer probe.Stop()
	if err := probe.WaitDials(ctx, 5); err != nil {
		t.Fatal(err)
	}
	// The replica serving the most agents goes first, so that both
	// restarts move agents: first away from it, then back to it, onto
	// its new certificate.
	on, _, err := b.Connections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	order := slices.Clone(b.ControlPlanes)
	served := func(c *box.ControlPlane) int {
		n := 0
		for _, r := range on {
			if r == c {
				n++
			}
		}
		return n
	}
	slices.SortStableFunc(order, func(x, y *box.ControlPlane) int { return served(y) - served(x) })
	for _, c := range order {
		before, err := c.ServingCertificate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := c.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		after, err := c.ServingCertificate(ctx)
		if err != nil {
			t.Fatalf("%s after its restart: %v (the CA bundle no longer verifies it?)", c.Name(), err)
		}
		if before.SerialNumber.Cmp(after.SerialNumber) == 0 {
			t.Errorf("%s serves certificate %s again after its restart, want a new one", c.Name(), after.SerialNumber)
		}
		// Streams opened since the restart (the agents that moved, and
		// those that came back) carried no table: every agent verified
		// the new certificate and was current.
		statuses := waitResynced(ctx, t, b, versions)
		moved := 0
		for node, st := range statuses {
			if st.GetConnectedAt().AsTime().After(start) {
				moved++
				checkNothingSent(t, node, st, versions[node])
			}
		}
		figure(t, "serving-cert-rotation", "replica=%s restart-to-resync=%s agents-reconnected=%d old-serial=%x new-serial=%x issuer=%q",
			c.Name(), ms(time.Since(start)), moved, before.SerialNumber, after.SerialNumber, after.Issuer.CommonName)
	}
	r := probe.Stop()
	figure(t, "serving-cert-rotation-probe", "dials=%d failed=%d over=%s", r.Dials, r.Failures, ms(r.Duration))
	if r.Failures != 0 {
		t.Errorf("probe: %d of %d connections failed while the replicas rotated their certificates; first: %v", r.Failures, r.Dials, r.Errors)
	}
}

// connectSamples is how many connects each way the cost scenario times.
const connectSamples = 20

// testConnectCost measures what authentication adds to an agent's
// connect: a fresh connection, a Sync stream and a hello holding nothing,
// up to the first table, against a replica with TLS and tokens and one
// with --insecure, both extra replicas no agent uses (so the streams, all
// as node-2, displace nobody). With TLS, a fresh token each time costs a
// TokenReview (as every agent's first connect to a replica does); the
// same token again hits the control plane's review cache. The handshake
// alone is timed apart.
func (e *env) testConnectCost(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	node := b.Agents[2].Node.Name()
	secure, err := b.StartExtraControlPlane(ctx, "controlplane-measure-tls", 9670)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := b.StartExtraControlPlane(ctx, "controlplane-measure-insecure", 9680, "--insecure")
	if err != nil {
		t.Fatal(err)
	}
	pod, err := b.CreateAgentPod(ctx, "proxyplane-nodeagent-e2e-measure", node)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.DeletePod(context.WithoutCancel(ctx), pod) }()
	warm, err := b.AgentToken(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	timeConnect := func(c *box.ControlPlane, creds box.ClientCredentials) time.Duration {
		t.Helper()
		start := time.Now()
		resp, err := syncAttempt(ctx, c, creds, node)
		if err != nil || resp.GetSnapshot() == nil {
			t.Fatalf("Sync as %s on %s: %v, %T", node, c.Name(), err, resp.GetKind())
		}
		return time.Since(start)
	}
	var cold, hot, insecure, handshake []time.Duration
	for range connectSamples {
		tr, err := b.Token(ctx, b.AgentServiceAccount(), []string{b.Deployment().AgentMounts.TokenAudience}, pod, tokenSeconds)
		if err != nil {
			t.Fatal(err)
		}
		cold = append(cold, timeConnect(secure, withToken(b.Credentials(), tr.Status.Token)))
		hot = append(hot, timeConnect(secure, withToken(b.Credentials(), warm.Status.Token)))
		insecure = append(insecure, timeConnect(plain, box.ClientCredentials{Insecure: true}))
		start := time.Now()
		if _, err := secure.ServingCertificate(ctx); err != nil {
			t.Fatal(err)
		}
		handshake = append(handshake, time.Since(start))
	}
	figure(t, "connect-cost", "tls+fresh-token %s", percentiles(cold))
	figure(t, "connect-cost", "tls+cached-token %s", percentiles(hot))
	figure(t, "connect-cost", "insecure %s", percentiles(insecure))
	figure(t, "connect-cost", "tls-handshake-only %s", percentiles(handshake))
}

// testCredentialsAppearLate restarts node-2's agent with neither its
// token nor its CA bundle mounted, as on a node whose first control plane
// has not yet published the bundle: the agent logs which file is
// missing, keeps retrying, and forwards from its cache meanwhile; once
// the box's kubelet writes both files, it connects without being
// restarted.
func (e *env) testCredentialsAppearLate(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	a := b.Agents[2]
	web := webService(t, e)
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.UnmountCredentials(a); err != nil {
		t.Fatal(err)
	}
	remounted := false
	defer func() {
		if !remounted {
			_ = b.MountCredentials(context.WithoutCancel(ctx), a)
		}
	}()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	err := box.Eventually(ctx, func() error {
		if tail := a.LogTail(20); !strings.Contains(tail, "cannot connect to the control plane without credentials") || !strings.Contains(tail, a.CAFile) {
			return fmt.Errorf("%s has not said its CA bundle is missing:\n%s", a.Name(), tail)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.WaitTraffic(ctx, b.Topology().PodNS(podOn(b, 2)), box.ClusterAddr(web), ""); err != nil {
		t.Fatalf("node-2 without credentials does not forward from its cache: %v", err)
	}
	if s, err := a.State(ctx); err != nil || s.Connected {
		t.Fatalf("%s without credentials: state %+v, %v; want running, not connected", a.Name(), s, err)
	}
	start := time.Now()
	if err := b.MountCredentials(ctx, a); err != nil {
		t.Fatal(err)
	}
	remounted = true
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}
	figure(t, "credentials-appear-late", "mounted-to-connected=%s (the agent's reconnect backoff decides)", ms(time.Since(start)))
}
