package app

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/proxyplane/proxyplane/controlplane/certs"
	"github.com/proxyplane/proxyplane/controlplane/limit"
)

const testNS = "proxyplane-system"

func TestSecureMetrics(t *testing.T) {
	for _, tc := range []struct {
		addr     string
		insecure bool
		secure   bool
	}{
		{":9641", false, true},
		{"0.0.0.0:9641", false, true},
		{"10.0.0.1:9641", false, true},
		{"[::]:9641", false, true},
		{"127.0.0.1:9641", false, false},
		{"127.0.0.2:9641", false, false},
		{"[::1]:9641", false, false},
		{"localhost:9641", false, false},
		{":9641", true, false},
	} {
		o := NewOptions()
		o.MetricsAddress, o.Insecure = tc.addr, tc.insecure
		if got := secureMetrics(o); got != tc.secure {
			t.Errorf("--metrics-address=%s --insecure=%t: secure %t, want %t", tc.addr, tc.insecure, got, tc.secure)
		}
	}
	if !secureMetrics(NewOptions()) {
		t.Error("the default --metrics-address is served in plaintext to every interface")
	}
}

// reviewer answers TokenReviews and SubjectAccessReviews as an API server
// whose only valid tokens are "scraper" (allowed to get /metrics),
// "profiler" (allowed to get /debug/pprof/ only) and "nobody" (not
// allowed), and counts them.
type reviewer struct {
	tokens, access atomic.Int64
	down           atomic.Bool
	// hold, when set, keeps the reviews of tokens starting "random-"
	// waiting until it is closed; inFlight and maxInFlight count the
	// token reviews under way.
	hold                  chan struct{}
	inFlight, maxInFlight atomic.Int64
}

func (rv *reviewer) client() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rv.tokens.Add(1)
		if rv.down.Load() {
			return true, nil, apierrors.NewServiceUnavailable("etcdserver: leader changed SECRET-DETAIL")
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if len(tr.Spec.Audiences) != 0 {
			return true, nil, errors.New("a /metrics TokenReview named audiences")
		}
		switch tr.Spec.Token {
		case "scraper", "scraper-rotated":
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:monitoring:prometheus", Groups: []string{"system:serviceaccounts"}}}
		case "nobody":
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "nobody"}}
		case "profiler":
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "profiler"}}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		rv.access.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		nr := sar.Spec.NonResourceAttributes
		// The scraper may get /metrics, the profiler /debug/pprof/ only.
		path := map[string]string{"system:serviceaccount:monitoring:prometheus": "/metrics", "profiler": "/debug/pprof/"}[sar.Spec.User]
		sar.Status.Allowed = path != "" && nr != nil && nr.Path == path && nr.Verb == "get" && sar.Spec.ResourceAttributes == nil
		return true, sar, nil
	})
	return c
}

// holding returns rv's client with its token reviews counted in flight
// and, for tokens starting "random-", held until rv.hold is closed: a
// slow API server. (The fake clientset runs its reactors under one lock,
// so the hold comes before it.)
func (rv *reviewer) holding() kubernetes.Interface {
	return holdingClient{Interface: rv.client(), rv: rv}
}

type holdingClient struct {
	kubernetes.Interface
	rv *reviewer
}

func (c holdingClient) AuthenticationV1() authnv1client.AuthenticationV1Interface {
	return holdingAuthn{AuthenticationV1Interface: c.Interface.AuthenticationV1(), rv: c.rv}
}

type holdingAuthn struct {
	authnv1client.AuthenticationV1Interface
	rv *reviewer
}

func (a holdingAuthn) TokenReviews() authnv1client.TokenReviewInterface {
	return holdingReviews{TokenReviewInterface: a.AuthenticationV1Interface.TokenReviews(), rv: a.rv}
}

type holdingReviews struct {
	authnv1client.TokenReviewInterface
	rv *reviewer
}

func (h holdingReviews) Create(ctx context.Context, tr *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error) {
	rv := h.rv
	n := rv.inFlight.Add(1)
	defer rv.inFlight.Add(-1)
	for m := rv.maxInFlight.Load(); n > m && !rv.maxInFlight.CompareAndSwap(m, n); m = rv.maxInFlight.Load() {
	}
	if rv.hold != nil && strings.HasPrefix(tr.Spec.Token, "random-") {
		<-rv.hold
	}
	return h.TokenReviewInterface.Create(ctx, tr, opts)
}

// testServing serves newHTTPServer on loopback and returns its address;
// secure forces the secure mode there.
func testServing(t *testing.T, cfg httpConfig) (string, *http.Server) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxyplane_test_gauge", Help: "A gauge."})
		g.Set(1)
		cfg.Registry.MustRegister(g)
	}
	if cfg.Ready.Synced == nil {
		cfg.Ready = Readiness{Synced: closed(), Certified: closed()}
	}
	cfg.Namespace = testNS
	srv, l, err := newHTTPServer(lis, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String(), srv
}

// servingCA issues a serving certificate as the bootstrapper would.
func servingCA(t *testing.T) (*x509.CertPool, func(*tls.ClientHelloInfo) (*tls.Certificate, error)) {
	t.Helper()
	ca, err := certs.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, err := ca.Issue(certs.DNSNames(testNS), nil, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return crt, nil }
}

// get sends a GET with token (none when empty) and returns the status and
// body; err is a failure to get any answer.
func get(c *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestMetricsNeedTheAPIServersAuthorization is the attack on :9641 from
// any pod: without a token the API server accepts for a user allowed to
// get /metrics, nothing but the probes answers, and the probes say only
// what they must; a scraper with the right answers as before.
func TestMetricsNeedTheAPIServersAuthorization(t *testing.T) {
	rv := &reviewer{}
	pool, getCert := servingCA(t)
	addr, _ := testServing(t, httpConfig{Secure: true, GetCertificate: getCert, Reviews: rv.client()})
	verified := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: certs.ServerName(testNS), MinVersion: tls.VersionTLS12,
	}}}
	base := "https://" + addr
	for _, tc := range []struct {
		name, path, token string
		code              int
	}{
		{"no token", "/metrics", "", http.StatusUnauthorized},
		{"a token the API server refuses", "/metrics", "forged", http.StatusUnauthorized},
		{"a user who may not get /metrics", "/metrics", "nobody", http.StatusForbidden},
		{"a scraper who may", "/metrics", "scraper", http.StatusOK},
		{"readiness, for the kubelet", "/readyz", "", http.StatusOK},
		{"liveness, for the kubelet", "/healthz", "", http.StatusOK},
		{"liveness by its other name", "/livez", "", http.StatusOK},
		{"anything else", "/debug/pprof/", "", http.StatusNotFound},
	} {
		code, body, err := get(verified, base+tc.path, tc.token)
		if err != nil || code != tc.code {
			t.Errorf("%s: GET %s: %d %v, want %d", tc.name, tc.path, code, err, tc.code)
			continue
		}
		if strings.Contains(body, "proxyplane_test_gauge") != (tc.code == http.StatusOK && tc.path == "/metrics") {
			t.Errorf("%s: the metrics were or were not served:\n%s", tc.name, body)
		}
	}
	// Answers are cached: a second scrape costs the API server nothing.
	before := rv.tokens.Load() + rv.access.Load()
	if code, _, _ := get(verified, base+"/metrics", "scraper"); code != http.StatusOK || rv.tokens.Load()+rv.access.Load() != before {
		t.Errorf("a second scrape: %d, %d more reviews; want 200 from the cache", code, rv.tokens.Load()+rv.access.Load()-before)
	}
	// The API server unreachable: 503, and nothing of its answer.
	rv.down.Store(true)
	code, body, err := get(verified, base+"/metrics", "another")
	if err != nil || code != http.StatusServiceUnavailable || strings.Contains(body, "SECRET-DETAIL") {
		t.Errorf("the API server down: %d %v %q, want a bare 503", code, err, body)
	}
	// Plaintext on the TLS port gets no answer at all.
	plain := &http.Client{Timeout: 10 * time.Second}
	if code, body, err := get(plain, "http://"+addr+"/metrics", "scraper"); err == nil && strings.Contains(body, "proxyplane_test_gauge") {
		t.Errorf("plaintext request answered with the metrics (%d)", code)
	}
}

// TestMetricsTokenFloodBounded is the flood of random bearer tokens at
// :9641 from a pod: every one costs a TokenReview, so at most two are in
// flight (metricsReviewsInFlight), and the flood's hold at most one of
// them, so a scraper already known by its address is still answered,
// even when its token has just rotated and must be reviewed while the
// flood's reviews are stuck at the API server.
func TestMetricsTokenFloodBounded(t *testing.T) {
	rv := &reviewer{hold: make(chan struct{})}
	pool, getCert := servingCA(t)
	addr, _ := testServing(t, httpConfig{Secure: true, GetCertificate: getCert, Reviews: rv.holding()})
	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			DialContext: d.DialContext, DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: certs.ServerName(testNS), MinVersion: tls.VersionTLS12},
		}}
	}
	scraper, attacker := from("127.0.0.1"), from("127.0.0.2")
	url := "https://" + addr + "/metrics"
	if code, _, err := get(scraper, url, "scraper"); err != nil || code != http.StatusOK {
		t.Fatalf("the scraper's first scrape: %d %v", code, err)
	}

	const flood = 12 // within the listener's 16 connections per address
	var wg sync.WaitGroup
	codes := make(chan int, flood)
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, err := get(attacker, url, fmt.Sprintf("random-%d", i))
			if err != nil {
				t.Errorf("flood request %d: %v", i, err)
			}
			codes <- code
		}()
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(rv.hold)
		}
	}
	defer func() { release(); wg.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for rv.inFlight.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no review of the flood started")
		}
		time.Sleep(time.Millisecond)
	}

	// The scraper's token rotated: a review it must get while the
	// flood's are stuck.
	if code, body, err := get(scraper, url, "scraper-rotated"); err != nil || code != http.StatusOK || !strings.Contains(body, "proxyplane_test_gauge") {
		t.Errorf("the scraper during the flood: %d %v, want 200 with the metrics", code, err)
	}
	release()
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != http.StatusUnauthorized && code != http.StatusServiceUnavailable {
			t.Errorf("a flood request got %d, want 401 or 503", code)
		}
	}
	if m := rv.maxInFlight.Load(); m > metricsReviewsInFlight {
		t.Errorf("%d token reviews in flight at once, want at most %d", m, metricsReviewsInFlight)
	}
	if n := rv.tokens.Load(); n > flood+2 {
		t.Errorf("%d token reviews, want at most one per token (%d)", n, flood+2)
	}
}

// TestMetricsPortBeforeTheCertificate: until a serving certificate
// exists the port serves a self-signed one, so that the kubelet's probes
// (which verify nothing) are answered, and /readyz says why the replica
// is not ready; a client that verifies refuses the fallback and sends no
// token.
func TestMetricsPortBeforeTheCertificate(t *testing.T) {
	pool, _ := servingCA(t)
	why := "no serving certificate: Secret proxyplane-system/proxyplane-ca holds no usable CA: the certificate is not a CA"
	addr, _ := testServing(t, httpConfig{
		Secure: true, Reviews: (&reviewer{}).client(),
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return nil, errors.New("no serving certificate yet")
		},
		Ready: Readiness{Synced: closed(), Certified: make(chan struct{}), CertProblem: func(time.Time) string { return why }},
	})
	kubelet := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // as the kubelet's HTTPS probes
	code, body, err := get(kubelet, "https://"+addr+"/readyz", "")
	if err != nil || code != http.StatusServiceUnavailable || strings.TrimSpace(body) != why {
		t.Errorf("/readyz: %d %v %q, want 503 saying %q", code, err, body, why)
	}
	if code, _, err := get(kubelet, "https://"+addr+"/healthz", ""); err != nil || code != http.StatusOK {
		t.Errorf("/healthz: %d %v, want 200", code, err)
	}
	verified := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: certs.ServerName(testNS), MinVersion: tls.VersionTLS12,
	}}}
	if _, _, err := get(verified, "https://"+addr+"/metrics", "scraper"); err == nil {
		t.Error("a verifying client accepted the fallback certificate")
	}
}

// TestMetricsOnLoopbackArePlaintext: bound to loopback (make run), the
// port is plaintext and open, as kube-proxy's 10249.
func TestMetricsOnLoopbackArePlaintext(t *testing.T) {
	addr, _ := testServing(t, httpConfig{})
	code, body, err := get(&http.Client{Timeout: 10 * time.Second}, "http://"+addr+"/metrics", "")
	if err != nil || code != http.StatusOK || !strings.Contains(body, "proxyplane_test_gauge") {
		t.Errorf("GET /metrics on loopback: %d %v", code, err)
	}
}

// TestHTTPServerTimeouts: the server bounds every phase of a connection,
// and a client that sends half a request and waits is cut off.
func TestHTTPServerTimeouts(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, l, err := newHTTPServer(lis, httpConfig{Registry: prometheus.NewRegistry(), Ready: Readiness{Synced: closed(), Certified: closed()}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("unbounded: read header %s, read %s, write %s, idle %s, max header bytes %d",
			srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout, srv.MaxHeaderBytes)
	}
	// The same server with short timeouts, so that the test waits for
	// them rather than for the real ones.
	srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout = 200*time.Millisecond, 400*time.Millisecond, 200*time.Millisecond
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	closedByServer := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		return err == nil || !errors.As(err, &ne) || !ne.Timeout()
	}
	slow, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = slow.Close() }()
	if _, err := slow.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	if !closedByServer(slow) {
		t.Error("a connection with half a request was kept open")
	}
	idle, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = idle.Close() }()
	if _, err := idle.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %v", err)
	}
	_ = resp.Body.Close()
	if !closedByServer(idle) {
		t.Error("an idle kept-alive connection was kept open")
	}
}

// TestHTTPConnectionCaps: one address cannot hold more than its share of
// connections, so the kubelet's probes from another still get in.
func TestHTTPConnectionCaps(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	capped := limit.New(limit.Config{MaxConnections: 100, MaxConnectionsPerSource: 3, PeerRate: -1}, slog.New(slog.DiscardHandler)).Listener(lis)
	defer func() { _ = capped.Close() }()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := capped.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }()
		held = append(held, <-accepted)
	}
	extra, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = extra.Close() }()
	_ = extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Errorf("a fourth connection from one address: %v, want it closed", err)
	}
	_ = held[0].Close()
	again, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = again.Close() }()
	select {
	case c := <-accepted:
		_ = c.Close()
	case <-time.After(10 * time.Second):
		t.Error("a slot given back was not reused")
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// TestProbesSayOnlyTheirCheck: a failing watch's error, which carries the
// API server's answer, stays in the log; /readyz names the check.
func TestProbesSayOnlyTheirCheck(t *testing.T) {
	w := &fakeWatches{}
	w.set(errors.New("[services] watch failing: Get https://10.0.0.1:6443/api/v1/services: x509 SECRET-DETAIL"), errors.New("publish loop stuck for 3m SECRET-DETAIL"))
	addr, _ := testServing(t, httpConfig{Ready: Readiness{Synced: closed(), Certified: closed(), Watches: w}, Watches: w})
	c := &http.Client{Timeout: 10 * time.Second}
	for path, want := range map[string]string{
		"/readyz":  "a watch of the API server has failed for over 45s",
		"/healthz": "the publish loop is stuck",
	} {
		code, body, err := get(c, "http://"+addr+path, "")
		if err != nil || code != http.StatusServiceUnavailable || strings.TrimSpace(body) != want {
			t.Errorf("GET %s: %d %v %q, want 503 %q", path, code, err, body, want)
		}
	}
}

// TestProfilingNeedsItsOwnRight: with --profiling, /debug/pprof/ is served
// on the metrics port to callers the API server allows to get
// /debug/pprof/, and to no one else: a scraper's right to /metrics is
// not enough. Without --profiling it is not served at all.
func TestProfilingNeedsItsOwnRight(t *testing.T) {
	rv := &reviewer{}
	pool, getCert := servingCA(t)
	verified := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: certs.ServerName(testNS), MinVersion: tls.VersionTLS12,
	}}}
	on, _ := testServing(t, httpConfig{Secure: true, GetCertificate: getCert, Reviews: rv.client(), Profiling: true})
	off, _ := testServing(t, httpConfig{Secure: true, GetCertificate: getCert, Reviews: rv.client()})
	for _, tc := range []struct {
		name, addr, path, token string
		code                    int
	}{
		{"no token", on, "/debug/pprof/", "", http.StatusUnauthorized},
		{"a scraper, allowed /metrics only", on, "/debug/pprof/", "scraper", http.StatusForbidden},
		{"a profiler", on, "/debug/pprof/", "profiler", http.StatusOK},
		{"a profiler, a profile", on, "/debug/pprof/goroutine?debug=1", "profiler", http.StatusOK},
		{"a profiler, /metrics", on, "/metrics", "profiler", http.StatusForbidden},
		{"a scraper, /metrics", on, "/metrics", "scraper", http.StatusOK},
		{"without --profiling", off, "/debug/pprof/", "profiler", http.StatusNotFound},
	} {
		code, body, err := get(verified, "https://"+tc.addr+tc.path, tc.token)
		if err != nil || code != tc.code {
			t.Errorf("%s: GET %s: %d %v, want %d", tc.name, tc.path, code, err, tc.code)
			continue
		}
		if tc.code == http.StatusOK && strings.HasPrefix(tc.path, "/debug/") && !strings.Contains(body, "goroutine") {
			t.Errorf("%s: GET %s: not a profile:\n%.200s", tc.name, tc.path, body)
		}
	}
}

// TestProfilingOnLoopbackIsOpen: on a loopback address, as /metrics, the
// profiles need no token.
func TestProfilingOnLoopbackIsOpen(t *testing.T) {
	addr, _ := testServing(t, httpConfig{Profiling: true})
	c := &http.Client{Timeout: 10 * time.Second}
	if code, body, err := get(c, "http://"+addr+"/debug/pprof/cmdline", ""); err != nil || code != http.StatusOK || body == "" {
		t.Errorf("GET /debug/pprof/cmdline: %d %v %q, want 200 and the command line", code, err, body)
	}
}
