package client

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// serverName is the name the agent verifies, deploy/'s default.
const serverName = "proxyplane-controlplane.proxyplane-system.svc"

// testCA is a throwaway certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serving issues a serving certificate for dnsName.
func (ca *testCA) serving(t *testing.T, dnsName string, serial int64) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// tlsControlPlane is a fake control plane serving TLS on an in-memory
// listener, with a certificate the test may replace, counting the
// connections it accepts.
type tlsControlPlane struct {
	*fakeControlPlane
	accepted atomic.Int64
	mu       sync.Mutex // guards cert
	cert     tls.Certificate
}

func (c *tlsControlPlane) setCert(cert tls.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cert = cert
}

// countingListener counts accepted connections: a refused handshake
// never reaches a gRPC handler, so this is how a test sees the agent try.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// serveTLS serves a fake control plane with cert at the in-memory
// address "cp".
func serveTLS(t *testing.T, cert tls.Certificate) (*tlsControlPlane, grpc.DialOption) {
	t.Helper()
	l := bufconn.Listen(1 << 20)
	cp := serveTLSOn(t, cert, l)
	return cp, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if addr != "cp" {
			return nil, errors.New("connection refused")
		}
		return l.DialContext(ctx)
	})
}

// serveTLSLoopback serves a fake control plane with cert on a loopback
// TCP port, and returns it with its "ip:port", as the control plane
// reports its replicas.
func serveTLSLoopback(t *testing.T, cert tls.Certificate) (*tlsControlPlane, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveTLSOn(t, cert, l), l.Addr().String()
}

// serveTLSOn serves a fake control plane with cert on l.
func serveTLSOn(t *testing.T, cert tls.Certificate, l net.Listener) *tlsControlPlane {
	t.Helper()
	cp := &tlsControlPlane{fakeControlPlane: &fakeControlPlane{
		streams: make(chan grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse], 4), done: make(chan struct{}),
	}, cert: cert}
	creds := credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			cp.mu.Lock()
			defer cp.mu.Unlock()
			c := cp.cert
			return &c, nil
		},
	})
	gs := grpc.NewServer(grpc.Creds(creds))
	pb.RegisterTableServiceServer(gs, cp)
	go func() { _ = gs.Serve(countingListener{Listener: l, n: &cp.accepted}) }()
	t.Cleanup(func() { close(cp.done); gs.Stop() })
	return cp
}

// files is an agent's CA and token files in a temporary directory, none
// written yet.
type files struct{ ca, token string }

func newFiles(t *testing.T) files {
	t.Helper()
	d := t.TempDir()
	return files{ca: filepath.Join(d, "ca", "ca.crt"), token: filepath.Join(d, "token")}
}

func (f files) creds() Credentials {
	return Credentials{CAFile: f.ca, ServerName: serverName, TokenFile: f.token}
}

// write replaces path's content as the kubelet does: a new file renamed
// over the old, so a reader sees one or the other.
func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// authorization returns the stream's authorization header values.
func authorization(s grpc.BidiStreamingServer[pb.SyncRequest, pb.SyncResponse]) []string {
	md, _ := metadata.FromIncomingContext(s.Context())
	return md.Get("authorization")
}

// syncBuffer is a log sink the client's goroutine writes while the test
// reads.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitUntil polls cond until it holds, failing t after waitFor.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		<-tick.C
	}
}

// TestCredentialsReadOnEveryConnect starts the agent before its CA
// bundle and token exist, as on a node whose first control plane has not
// published the bundle yet: it logs which file is missing, dials nothing,
// touches no rule, and connects once both appear. A rotated token and a
// renewed serving certificate (same CA) are picked up at the next
// connect.
func TestCredentialsReadOnEveryConnect(t *testing.T) {
	ca := newCA(t, "proxyplane-ca")
	cp, dial := serveTLS(t, ca.serving(t, serverName, 2))
	f := newFiles(t)
	logs := &syncBuffer{}
	a := &fakeApplier{held: proxytable.Empty()}
	startWith(t, a, f.creds(), slog.New(slog.NewTextHandler(logs, nil)), dial, "cp")

	waitUntil(t, "a log line naming the missing CA bundle", func() bool {
		return strings.Contains(logs.String(), "reading CA bundle "+f.ca)
	})
	write(t, f.ca, ca.pem)
	waitUntil(t, "a log line naming the missing token", func() bool {
		return strings.Contains(logs.String(), "reading token "+f.token)
	})
	if n := cp.accepted.Load(); n != 0 {
		t.Errorf("the agent dialled %d times without credentials, want 0", n)
	}
	write(t, f.token, []byte("token-1\n"))
	s := accept(t, cp.fakeControlPlane)
	if got := authorization(s); len(got) != 1 || got[0] != "Bearer token-1" {
		t.Errorf("authorization %q, want [Bearer token-1]", got)
	}
	recv(t, s) // hello

	// The kubelet rotates the token and the control plane renews its
	// certificate; the next connect uses both.
	write(t, f.token, []byte("token-2"))
	cp.setCert(ca.serving(t, serverName, 3))
	s2 := accept(t, cp.fakeControlPlane) // the first stream goes silent and is replaced
	if got := authorization(s2); len(got) != 1 || got[0] != "Bearer token-2" {
		t.Errorf("after rotation, authorization %q, want [Bearer token-2]", got)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.applied) != 0 {
		t.Errorf("the agent applied %d tables with no table sent", len(a.applied))
	}
}

// TestUntrustedServerRefused serves a certificate the agent's bundle does
// not trust, then one for another name: the agent hands neither its token
// (no stream reaches the server) and keeps trying; once its bundle trusts
// the server, it connects.
func TestUntrustedServerRefused(t *testing.T) {
	trusted, other := newCA(t, "proxyplane-ca"), newCA(t, "someone-else")
	cases := []struct {
		name string
		cert func(t *testing.T) tls.Certificate
	}{
		{"another CA", func(t *testing.T) tls.Certificate { t.Helper(); return other.serving(t, serverName, 2) }},
		{"another name", func(t *testing.T) tls.Certificate {
			t.Helper()
			return trusted.serving(t, "proxyplane-controlplane.elsewhere.svc", 2)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp, dial := serveTLS(t, tc.cert(t))
			f := newFiles(t)
			write(t, f.ca, trusted.pem)
			write(t, f.token, []byte("secret"))
			startWith(t, &fakeApplier{held: proxytable.Empty()}, f.creds(), slog.New(slog.DiscardHandler), dial, "cp")
			// Three handshakes: the agent refused the server and retried.
			waitUntil(t, "three connection attempts", func() bool { return cp.accepted.Load() >= 3 })
			select {
			case s := <-cp.streams:
				t.Fatalf("a stream reached an untrusted server, with authorization %q", authorization(s))
			default:
			}
			cp.setCert(trusted.serving(t, serverName, 3))
			if got := authorization(accept(t, cp.fakeControlPlane)); len(got) != 1 || got[0] != "Bearer secret" {
				t.Errorf("authorization %q, want [Bearer secret]", got)
			}
		})
	}
}

// TestUntrustedLearnedAddressRefused: a learned address (which whoever
// can write the control plane Service's EndpointSlices could plant) is
// dialled first, but a server there whose certificate the bundle does not
// trust gets neither the token nor a stream, however often the agent
// checks it for failback; the agent connects to its seed and keeps that
// stream.
func TestUntrustedLearnedAddressRefused(t *testing.T) {
	trusted, other := newCA(t, "proxyplane-ca"), newCA(t, "someone-else")
	seed, seedAddr := serveTLSLoopback(t, trusted.serving(t, serverName, 2))
	rogue, rogueAddr := serveTLSLoopback(t, other.serving(t, serverName, 2))
	f := newFiles(t)
	write(t, f.ca, trusted.pem)
	write(t, f.token, []byte("secret"))
	startOpts(t, &fakeApplier{held: tableLearning(rogueAddr)}, slog.New(slog.DiscardHandler), grpc.EmptyDialOption{}, func(o *Options) {
		o.Addresses, o.Credentials = []string{seedAddr}, f.creds()
		o.SilenceTimeout, o.FailbackInterval = time.Minute, 20*time.Millisecond
	})

	s := accept(t, seed.fakeControlPlane)
	if got := authorization(s); len(got) != 1 || got[0] != "Bearer secret" {
		t.Errorf("authorization %q on the seed, want [Bearer secret]", got)
	}
	if h := recv(t, s).GetHello(); h == nil {
		t.Fatal("no hello on the seed")
	}
	if rogue.accepted.Load() == 0 {
		t.Error("the learned address was not dialled first")
	}
	// Failback checks of the learned address, the preferred one: each a
	// refused handshake.
	n := rogue.accepted.Load()
	waitUntil(t, "three failback checks of the learned address", func() bool { return rogue.accepted.Load() >= n+3 })
	select {
	case r := <-rogue.streams:
		t.Fatalf("a stream reached the untrusted learned address, with authorization %q", authorization(r))
	case <-s.Context().Done():
		t.Fatal("the stream to the seed ended")
	case again := <-seed.streams:
		t.Fatalf("a second stream to the seed, with authorization %q", authorization(again))
	default:
	}
}

// TestInsecureSendsNoToken checks that --insecure dials in plaintext and
// sends no authorization header, even with a token file present.
func TestInsecureSendsNoToken(t *testing.T) {
	fakes, dial := listeners(t, "cp")
	f := newFiles(t)
	write(t, f.token, []byte("secret"))
	creds := f.creds()
	creds.Insecure = true
	startWith(t, &fakeApplier{held: proxytable.Empty()}, creds, slog.New(slog.DiscardHandler), dial, "cp")
	s := accept(t, fakes["cp"])
	if got := authorization(s); len(got) != 0 {
		t.Errorf("--insecure sent authorization %q, want none", got)
	}
	if recv(t, s).GetHello() == nil {
		t.Error("no hello")
	}
}

// TestTokenNeedsTransportSecurity checks the token's own guard: it is
// never put on a connection without privacy and integrity.
func TestTokenNeedsTransportSecurity(t *testing.T) {
	if !bearerToken("x").RequireTransportSecurity() {
		t.Fatal("the token does not require transport security")
	}
	ctx := credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{})
	if md, err := bearerToken("x").GetRequestMetadata(ctx); err == nil {
		t.Errorf("token given over a connection without security: %v", md)
	}
}

// TestBadCredentialFiles checks the errors for files that exist but hold
// nothing usable: each names the file.
func TestBadCredentialFiles(t *testing.T) {
	f := newFiles(t)
	write(t, f.ca, []byte("not a certificate"))
	write(t, f.token, []byte(" \n"))
	_, err := f.creds().dialOptions()
	if !errors.Is(err, errCredentials) || !strings.Contains(err.Error(), f.ca) {
		t.Errorf("bad bundle: %v, want a credentials error naming %s", err, f.ca)
	}
	write(t, f.ca, newCA(t, "ca").pem)
	_, err = f.creds().dialOptions()
	if !errors.Is(err, errCredentials) || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty token: %v, want a credentials error saying it is empty", err)
	}
}
