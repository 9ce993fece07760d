package scenarios

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyplane/proxyplane/e2e/box"
)

// metricsReplicaPort is the gRPC port of the replica whose metrics port
// (the next one) listens on host-0's LAN address, as deploy/ runs it.
const metricsReplicaPort = 9740

// testAttackMetrics attacks a replica's metrics port the way deploy/
// exposes it (every address of the node, so the kubelet's probes and
// Prometheus reach it) from the client namespace, a stranger on the node
// network: metrics need a token the API server accepts for a user who
// may get /metrics, the probes answer anyone but say only what a probe
// needs, plaintext gets nothing, and a client that sends nothing is cut
// off. No agent's stream notices.
func (e *env) testAttackMetrics(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	c, err := b.StartExtraControlPlane(ctx, "controlplane-metrics", metricsReplicaPort, "--metrics-address=:9741")
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(tp.HostIP(0).String(), "9741")
	ca, err := os.ReadFile(b.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("no certificate in the box's CA bundle")
	}
	// The stranger verifies the serving certificate: the port speaks with
	// the control plane's identity, not a throwaway one.
	client := b.HTTPClient(tp.ClientNS(), &tls.Config{RootCAs: pool, ServerName: b.ServerName(), MinVersion: tls.VersionTLS12})
	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(body)
	}

	// Two ServiceAccounts with tokens for the API server, as Prometheus
	// has: one bound to deploy/'s proxyplane-metrics-reader, one to
	// nothing.
	admin := b.Admin()
	ns := b.Deployment().Namespace
	token := func(name string, bind bool) string {
		t.Helper()
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.CoreV1().ServiceAccounts(ns).Delete(ctx, name, metav1.DeleteOptions{})
		})
		if bind {
			if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "proxyplane-metrics-reader"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = admin.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}) })
		}
		tr, err := b.Token(ctx, types.NamespacedName{Namespace: ns, Name: name}, nil, nil, 600)
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper := token("proxyplane-e2e-scraper", true)
	nobody := token("proxyplane-e2e-nobody", false)

	// The RBAC authorizer learns of the binding through an informer, and
	// the replica caches answers: wait for the scraper's first 200.
	if err := box.Eventually(ctx, func() error {
		if code, _ := get("/metrics", scraper); code != http.StatusOK {
			return errors.New("the scraper's token is not answered yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, token string
		code              int
	}{
		{"no token", "/metrics", "", http.StatusUnauthorized},
		{"a forged token", "/metrics", "forged", http.StatusUnauthorized},
		{"a token for the control plane's audience, not the API server's", "/metrics", b.Credentials().Token, http.StatusUnauthorized},
		{"a user who may not get /metrics", "/metrics", nobody, http.StatusForbidden},
		{"the scraper", "/metrics", scraper, http.StatusOK},
		{"readiness, for the kubelet", "/readyz", "", http.StatusOK},
		{"liveness, for the kubelet", "/healthz", "", http.StatusOK},
		{"anything else", "/debug/pprof/", scraper, http.StatusNotFound},
	} {
		code, body := get(tc.path, tc.token)
		if code != tc.code {
			t.Errorf("%s: GET %s answered %d, want %d", tc.name, tc.path, code, tc.code)
		}
		metrics := strings.Contains(body, "process_cpu_seconds_total")
		if metrics != (tc.code == http.StatusOK && tc.path == "/metrics") {
			t.Errorf("%s: GET %s served metrics: %v", tc.name, tc.path, metrics)
		}
		if tc.path != "/metrics" && len(body) > 64 {
			t.Errorf("%s: GET %s says more than a probe needs: %q", tc.name, tc.path, body)
		}
	}

	// Plaintext gets no answer of substance.
	plain := b.HTTPClient(tp.ClientNS(), nil)
	if resp, err := plain.Get("http://" + addr + "/metrics"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("GET /metrics in plaintext answered 200")
		}
	}

	// A client that connects and sends nothing is cut off by the server
	// rather than holding a connection for as long as it likes; 30 s
	// bounds the wait, far above the server's own bound.
	conn, err := b.Dial(ctx, tp.ClientNS(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(30 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("a silent client's connection: %v, want it closed by the server", err)
	}
	figure(t, "metrics-silent-client-cut", "after=%s", ms(time.Since(start)))

	// None of it reached an agent: every node is still current and
	// connected where it was.
	if !c.Running() {
		t.Fatalf("%s exited under attack:\n%s", c.Name(), c.LogTail(20))
	}
	whole(ctx, t, b)
}
