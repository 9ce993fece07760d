package scenarios

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// recheckInterval is the attack replica's --identity-recheck-interval:
// short, so that a revoked reader's stream ends within the scenario.
const recheckInterval = 2 * time.Second

// revocationTimeout bounds the wait for a stream to end once its identity
// no longer holds: a few re-checks, and the RBAC authorizer's informer
// catching up with a deleted binding.
const revocationTimeout = 30 * time.Second

// watchStream is a WatchTable stream admitted by a replica (its first
// snapshot received); ended receives the error that ended it.
type watchStream struct {
	name  string
	ended chan error
}

// openWatch opens WatchTable for node on c with creds and waits for its
// snapshot. The stream lasts until the scenario's context ends.
func openWatch(ctx context.Context, t *testing.T, c *box.ControlPlane, creds box.ClientCredentials, name, node string) *watchStream {
	t.Helper()
	conn, err := c.Dial(creds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	s, err := pb.NewTableServiceClient(conn).WatchTable(ctx, &pb.WatchTableRequest{NodeName: node})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	first, err := s.Recv()
	if err != nil || first.GetSnapshot() == nil {
		t.Fatalf("%s: WatchTable of %s on %s: %v, %T; want a snapshot", name, node, c.Name(), err, first.GetKind())
	}
	w := &watchStream{name: name, ended: make(chan error, 1)}
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				w.ended <- err
				return
			}
		}
	}()
	return w
}

// wantEnd waits for the stream to end with code.
func (w *watchStream) wantEnd(t *testing.T, code codes.Code) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case err := <-w.ended:
		if status.Code(err) != code {
			t.Errorf("%s ended with %v, want %s", w.name, err, code)
		}
	case <-time.After(revocationTimeout):
		t.Errorf("%s still open %s after its identity was revoked, want it ended with %s", w.name, revocationTimeout, code)
	}
	return time.Since(start)
}

// wantOpen checks the stream has not ended.
func (w *watchStream) wantOpen(t *testing.T) {
	t.Helper()
	select {
	case err := <-w.ended:
		t.Errorf("%s ended with %v, want it open", w.name, err)
	default:
	}
}

// testAttackIdentity plays a compromised node, a stolen token and a rogue
// replica against identities (issue 21, rows 5, 6 and 8). Against the
// replica serving node-1's agent, Sync streams sending node-1's hello
// with tokens a node's credentials can mint are refused with
// PermissionDenied: the agents' ServiceAccount's token bound to the Node
// node-1 (`kubectl create token proxyplane-nodeagent --audience proxyplane
// --bound-object-kind Node --bound-object-name node-1`), one bound to
// nothing, one bound to a Pod of the agents' ServiceAccount on node-1
// that the DaemonSet does not control, and node-0's agent token. A debug
// token for the API server's audience is refused (Unauthenticated), one
// for the control plane's accepted. On an extra replica re-checking every
// recheckInterval, streams end once their identity no longer holds: an
// agent token's WatchTable when its Pod is deleted (PermissionDenied, at
// once), a reader's when its ClusterRoleBinding is removed
// (PermissionDenied) or its ServiceAccount deleted (Unauthenticated);
// the debug identity's stream stays. node-1's real stream keeps its
// connected_at throughout and receives the next change.
func (e *env) testAttackIdentity(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	stream := victimStream(ctx, t, b)
	victim, replica, other := stream.agent, stream.replica, b.Agents[0]
	ns := b.Deployment().Namespace
	audience := []string{b.Deployment().AgentMounts.TokenAudience}
	base := b.Credentials()
	admin := b.Admin()
	cleanup := func(what string, del func(context.Context) error) {
		t.Cleanup(func() {
			if err := del(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("deleting %s: %v", what, err)
			}
		})
	}

	t.Run("ForgedAgentTokens", func(t *testing.T) {
		node, err := admin.CoreV1().Nodes().Get(ctx, victim.Node.Name(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		agentSA := b.AgentServiceAccount()
		nodeBound, err := admin.CoreV1().ServiceAccounts(agentSA.Namespace).CreateToken(ctx, agentSA.Name, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				Audiences: audience, ExpirationSeconds: ptr.To[int64](tokenSeconds),
				BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("minting a token bound to Node %s: %v", node.Name, err)
		}
		unbound, err := b.Token(ctx, agentSA, audience, nil, tokenSeconds)
		if err != nil {
			t.Fatal(err)
		}
		// A Pod of the agents' ServiceAccount on node-1 that no DaemonSet
		// controls: the API server binds a token to it all the same.
		bare := b.AgentPodObject("proxyplane-nodeagent-e2e-bare", victim.Node.Name())
		bare, err = admin.CoreV1().Pods(ns).Create(ctx, bare, metav1.CreateOptions{FieldManager: box.FieldManager})
		if err != nil {
			t.Fatal(err)
		}
		cleanup("the bare Pod", func(ctx context.Context) error { return b.DeletePod(ctx, bare) })
		bareToken, err := b.AgentToken(ctx, bare)
		if err != nil {
			t.Fatal(err)
		}
		otherToken, err := b.AgentToken(ctx, other.Pod)
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name, token string
			want        codes.Code
		}{
			{"token bound to the Node", nodeBound.Status.Token, codes.PermissionDenied},
			{"token bound to nothing", unbound.Status.Token, codes.PermissionDenied},
			{"token of a Pod the DaemonSet does not control", bareToken.Status.Token, codes.PermissionDenied},
			{"token of another node's agent Pod", otherToken.Status.Token, codes.PermissionDenied},
		}
		for _, tc := range cases {
			start := time.Now()
			resp, err := syncAttempt(ctx, replica, withToken(base, tc.token), victim.Node.Name())
			switch {
			case err == nil:
				t.Errorf("%s: Sync as %s accepted, first response %T", tc.name, victim.Node.Name(), resp.GetKind())
			case status.Code(err) != tc.want:
				t.Errorf("%s: Sync as %s: %v, want %s", tc.name, victim.Node.Name(), err, tc.want)
			}
			figure(t, "identity-attack-refused", "case=%q code=%s took=%s", tc.name, status.Code(err), ms(time.Since(start)))
		}
	})

	t.Run("DebugTokenAudience", func(t *testing.T) {
		forAPI, err := b.Token(ctx, types.NamespacedName{Namespace: ns, Name: box.DebugServiceAccount}, nil, nil, tokenSeconds)
		if err != nil {
			t.Fatal(err)
		}
		if err := listNodes(ctx, replica, withToken(base, forAPI.Status.Token)); status.Code(err) != codes.Unauthenticated {
			t.Errorf("ListNodes with the debug identity's token for the API server: %v, want Unauthenticated", err)
		}
		if err := watchTable(ctx, replica, withToken(base, forAPI.Status.Token), victim.Node.Name()); status.Code(err) != codes.Unauthenticated {
			t.Errorf("WatchTable with the debug identity's token for the API server: %v, want Unauthenticated", err)
		}
		if err := listNodes(ctx, replica, base); err != nil {
			t.Errorf("ListNodes with the debug identity's token for audience %s: %v, want it answered", audience[0], err)
		}
	})

	t.Run("StreamsEndWithTheirIdentity", func(t *testing.T) {
		attack, err := b.StartExtraControlPlane(ctx, "controlplane-attack", 9690, fmt.Sprintf("--identity-recheck-interval=%s", recheckInterval))
		if err != nil {
			t.Fatal(err)
		}
		// An agent token of a Pod on node-1, as a thief holds it.
		pod, err := b.CreateAgentPod(ctx, "proxyplane-nodeagent-e2e-stolen", victim.Node.Name())
		if err != nil {
			t.Fatal(err)
		}
		cleanup("the stolen token's Pod", func(ctx context.Context) error { return b.DeletePod(ctx, pod) })
		stolen, err := b.AgentToken(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		// Two readers, each with its own ServiceAccount bound to the debug
		// identity's ClusterRole (list EndpointSlices).
		readerToken := func(name string) string {
			t.Helper()
			if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cleanup("ServiceAccount "+name, func(ctx context.Context) error {
				return ignoreNotFound(admin.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{}))
			})
			if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: box.DebugServiceAccount},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cleanup("ClusterRoleBinding "+name, func(ctx context.Context) error {
				return ignoreNotFound(admin.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}))
			})
			tr, err := b.Token(ctx, types.NamespacedName{Namespace: ns, Name: name}, audience, nil, tokenSeconds)
			if err != nil {
				t.Fatal(err)
			}
			// The RBAC authorizer learns of the binding through an
			// informer: wait until the replica admits the reader.
			if err := box.Eventually(ctx, func() error { return listNodes(ctx, attack, withToken(base, tr.Status.Token)) }); err != nil {
				t.Fatal(err)
			}
			return tr.Status.Token
		}
		unbound := readerToken("proxyplane-e2e-reader-unbound")
		deleted := readerToken("proxyplane-e2e-reader-deleted")

		node := victim.Node.Name()
		thief := openWatch(ctx, t, attack, withToken(base, stolen.Status.Token), "WatchTable with a stolen agent token", node)
		unboundReader := openWatch(ctx, t, attack, withToken(base, unbound), "WatchTable of a reader whose binding is removed", node)
		deletedReader := openWatch(ctx, t, attack, withToken(base, deleted), "WatchTable of a reader whose ServiceAccount is deleted", node)
		debug := openWatch(ctx, t, attack, base, "WatchTable of the debug identity", node)

		if err := b.DeletePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		took := thief.wantEnd(t, codes.PermissionDenied)
		figure(t, "identity-revoked", "case=pod-deleted took=%s", ms(took))
		if err := admin.RbacV1().ClusterRoleBindings().Delete(ctx, "proxyplane-e2e-reader-unbound", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		took = unboundReader.wantEnd(t, codes.PermissionDenied)
		figure(t, "identity-revoked", "case=binding-removed took=%s recheck-interval=%s", ms(took), recheckInterval)
		if err := admin.CoreV1().ServiceAccounts(ns).Delete(ctx, "proxyplane-e2e-reader-deleted", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		took = deletedReader.wantEnd(t, codes.Unauthenticated)
		figure(t, "identity-revoked", "case=serviceaccount-deleted took=%s recheck-interval=%s", ms(took), recheckInterval)
		// The debug identity's stream went through as many re-checks.
		debug.wantOpen(t)
	})

	// None of that touched node-1's stream, and node-1 still gets
	// changes: a new Service reaches every node.
	if _, _, err := b.CreateService(ctx, box.NewService("after-identity-attacks"), podOn(b, 0), podOn(b, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitProgrammed(ctx, hasEntry(e, "e2e/after-identity-attacks", podOn(b, 0), podOn(b, 2))); err != nil {
		t.Fatal(err)
	}
	stream.checkStayed(ctx, t)
}

// ignoreNotFound is nil for an object already gone.
func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
