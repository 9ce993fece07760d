package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

const ns = "proxyplane-system"

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// serveTLS serves the health service over TLS with getCert and returns
// its address.
func serveTLS(t *testing.T, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{GetCertificate: getCert, MinVersion: tls.VersionTLS12})))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// dial connects as an agent does: trusting caPEM only, verifying name.
func dial(t *testing.T, addr string, caPEM []byte, name string) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in the bundle")
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// check makes a health check on cc and returns the serving certificate
// of the connection that carried it.
func check(cc *grpc.ClientConn) (*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0], nil
}

func newTestCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// writePair writes c's certificate and key to certFile and keyFile.
func writePair(t *testing.T, c *tls.Certificate, certFile, keyFile string) {
	t.Helper()
	certPEM, err := cert.EncodeCertificates(c.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if certFile != "" {
		writeFile(t, certFile, certPEM)
	}
	if keyFile != "" {
		writeFile(t, keyFile, keyPEM)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func issue(t *testing.T, ca *CA) *tls.Certificate {
	t.Helper()
	c, err := ca.Issue(DNSNames(ns), nil, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFileSourceReload rewrites the files under a live server: a new
// connection gets the new certificate when the files hold a valid pair,
// the old one otherwise, and an established connection keeps working.
func TestFileSourceReload(t *testing.T) {
	cases := []struct {
		name    string
		rewrite func(t *testing.T, next *tls.Certificate, certFile, keyFile string)
		wantNew bool
	}{
		{"both files rewritten", func(t *testing.T, next *tls.Certificate, certFile, keyFile string) {
			t.Helper()
			writePair(t, next, certFile, keyFile)
		}, true},
		{"files replaced by renaming, as a Secret volume does", func(t *testing.T, next *tls.Certificate, certFile, keyFile string) {
			t.Helper()
			writePair(t, next, certFile+".new", keyFile+".new")
			for _, f := range []string{certFile, keyFile} {
				if err := os.Rename(f+".new", f); err != nil {
					t.Fatal(err)
				}
			}
		}, true},
		{"certificate rewritten, key not yet", func(t *testing.T, next *tls.Certificate, certFile, _ string) {
			t.Helper()
			writePair(t, next, certFile, "")
		}, false},
		{"files removed", func(t *testing.T, _ *tls.Certificate, certFile, keyFile string) {
			t.Helper()
			_ = os.Remove(certFile)
			_ = os.Remove(keyFile)
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ca := newTestCA(t)
			first, next := issue(t, ca), issue(t, ca)
			dir := t.TempDir()
			certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
			writePair(t, first, certFile, keyFile)
			// Interval 0: every handshake looks at the files, so the test
			// needs no clock.
			src, err := newFileSource(certFile, keyFile, 0, time.Now, discard())
			if err != nil {
				t.Fatal(err)
			}
			addr := serveTLS(t, src.GetCertificate)
			old := dial(t, addr, ca.CertPEM, ServerName(ns))
			if got, err := check(old); err != nil || got.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
				t.Fatalf("before the rewrite: %v, serial %v", err, got)
			}

			tc.rewrite(t, next, certFile, keyFile)

			want := first.Leaf
			if tc.wantNew {
				want = next.Leaf
			}
			got, err := check(dial(t, addr, ca.CertPEM, ServerName(ns)))
			if err != nil {
				t.Fatalf("new connection: %v", err)
			}
			if got.SerialNumber.Cmp(want.SerialNumber) != 0 {
				t.Errorf("new connection got serial %v, want %v", got.SerialNumber, want.SerialNumber)
			}
			got, err = check(old)
			if err != nil {
				t.Fatalf("established connection after the rewrite: %v", err)
			}
			if got.SerialNumber.Cmp(first.Leaf.SerialNumber) != 0 {
				t.Errorf("established connection was replaced (serial %v)", got.SerialNumber)
			}
		})
	}
}

func TestNewFileSourceRefusesBadFiles(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePair(t, issue(t, ca), certFile, "")
	writePair(t, issue(t, ca), "", keyFile) // another certificate's key
	if _, err := NewFileSource(certFile, keyFile, discard()); err == nil {
		t.Error("a certificate with another's key was accepted")
	}
	if _, err := NewFileSource(filepath.Join(dir, "missing"), keyFile, discard()); err == nil {
		t.Error("a missing file was accepted")
	}
}

// bootstrap runs one round of a new Bootstrapper against client.
func bootstrap(t *testing.T, client *fake.Clientset, sans ...string) *Bootstrapper {
	t.Helper()
	b := NewBootstrapper(client, BootstrapConfig{Namespace: ns, ExtraSANs: sans}, discard())
	if _, err := b.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

// published returns the CA Secret's certificate and the bundle.
func published(t *testing.T, client *fake.Clientset) (secretCA, bundle []byte) {
	t.Helper()
	ctx := context.Background()
	s, err := client.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, CABundleConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Data[corev1.TLSCertKey], []byte(cm.Data[CABundleKey])
}

// TestTLSAsAnAgent dials a bootstrapped replica as agents and strangers
// do: only a client trusting the published bundle and verifying the
// Service's name gets through.
func TestTLSAsAnAgent(t *testing.T) {
	client := fake.NewClientset()
	b := bootstrap(t, client)
	select {
	case <-b.Ready():
	default:
		t.Fatal("not ready after a successful round")
	}
	_, bundle := published(t, client)
	addr := serveTLS(t, b.GetCertificate)
	other := newTestCA(t)
	cases := []struct {
		name string
		opt  grpc.DialOption
		ok   bool
	}{
		{"trusting the bundle, verifying the Service name", tlsOpt(t, bundle, ServerName(ns)), true},
		{"verifying the short name", tlsOpt(t, bundle, ServiceName), true},
		{"plaintext", grpc.WithTransportCredentials(insecure.NewCredentials()), false},
		{"trusting another CA", tlsOpt(t, other.CertPEM, ServerName(ns)), false},
		{"trusting the system roots", grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: ServerName(ns), MinVersion: tls.VersionTLS12})), false},
		{"verifying a name the certificate lacks", tlsOpt(t, bundle, "proxyplane-controlplane.other.svc"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := grpc.NewClient(addr, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = cc.Close() }()
			if _, err := check(cc); (err == nil) != tc.ok {
				t.Errorf("health check: %v, want success %t", err, tc.ok)
			}
		})
	}
}

func tlsOpt(t *testing.T, caPEM []byte, name string) grpc.DialOption {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate")
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}))
}

func TestServingCertificateNames(t *testing.T) {
	b := bootstrap(t, fake.NewClientset(), "cp.example.com", "10.0.0.11", "fd00::11")
	c, _ := b.GetCertificate(nil)
	wantDNS := []string{"proxyplane-controlplane", "proxyplane-controlplane.proxyplane-system", "proxyplane-controlplane.proxyplane-system.svc", "cp.example.com"}
	if !slices.Equal(c.Leaf.DNSNames, wantDNS) {
		t.Errorf("DNS names %v, want %v", c.Leaf.DNSNames, wantDNS)
	}
	var ips []string
	for _, ip := range c.Leaf.IPAddresses {
		ips = append(ips, ip.String())
	}
	if want := []string{"10.0.0.11", "fd00::11"}; !slices.Equal(ips, want) {
		t.Errorf("IPs %v, want %v", ips, want)
	}
	if c.Leaf.IsCA || !slices.Contains(c.Leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
		t.Errorf("serving certificate: IsCA %t, ext key usage %v", c.Leaf.IsCA, c.Leaf.ExtKeyUsage)
	}
}

// chainsTo says whether b's certificate verifies against caPEM.
func chainsTo(t *testing.T, b *Bootstrapper, caPEM []byte) bool {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c, err := b.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: ServerName(ns), CurrentTime: b.now()})
	return err == nil
}

// TestBootstrapRace: replicas starting together end with one CA, both
// serving certificates signed by it, and it published.
func TestBootstrapRace(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, client *fake.Clientset) []*Bootstrapper
	}{
		{"both read before either creates", func(t *testing.T, client *fake.Clientset) []*Bootstrapper {
			t.Helper()
			// The first two reads of the Secret find nothing, as when
			// both replicas read before either wrote.
			var gets atomic.Int64
			client.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
				if gets.Add(1) <= 2 {
					return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, CASecretName)
				}
				return false, nil, nil
			})
			a := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, discard())
			b := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, discard())
			ctx := context.Background()
			// a reads (nothing) and creates; b read (nothing) before that
			// and now creates too: AlreadyExists.
			if _, err := a.sync(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := b.sync(ctx); err != nil {
				t.Fatal(err)
			}
			return []*Bootstrapper{a, b}
		}},
		{"concurrent replicas", func(t *testing.T, client *fake.Clientset) []*Bootstrapper {
			t.Helper()
			bs := make([]*Bootstrapper, 4)
			var wg sync.WaitGroup
			for i := range bs {
				bs[i] = NewBootstrapper(client, BootstrapConfig{Namespace: ns}, discard())
				wg.Go(func() {
					if _, err := bs[i].sync(context.Background()); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			return bs
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			bs := tc.run(t, client)
			secretCA, bundle := published(t, client)
			if string(secretCA) != string(bundle) {
				t.Error("the published bundle is not the Secret's CA")
			}
			for i, b := range bs {
				if !chainsTo(t, b, secretCA) {
					t.Errorf("replica %d serves a certificate the Secret's CA did not sign", i)
				}
			}
			secrets, _ := client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{})
			if len(secrets.Items) != 1 {
				t.Errorf("%d Secrets, want 1", len(secrets.Items))
			}
		})
	}
}

// TestBootstrapExistingObjects: an existing valid CA is used as is, an
// invalid one is reported and left alone, and a stale bundle is updated.
func TestBootstrapExistingObjects(t *testing.T) {
	operatorCA := newTestCA(t)
	secret := func(crt, key []byte) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: CASecretName},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
		}
	}
	staleBundle := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: CABundleConfigMapName},
		Data:       map[string]string{CABundleKey: "stale", "other": "kept"},
	}
	leaf := issue(t, operatorCA)
	leafPEM, _ := cert.EncodeCertificates(leaf.Leaf)
	leafKey, _ := keyutil.MarshalPrivateKeyToPEM(leaf.PrivateKey)
	cases := []struct {
		name    string
		objects []runtime.Object
		wantErr bool
	}{
		{"an operator's CA is used", []runtime.Object{secret(operatorCA.CertPEM, operatorCA.KeyPEM)}, false},
		{"a stale bundle is updated", []runtime.Object{secret(operatorCA.CertPEM, operatorCA.KeyPEM), staleBundle}, false},
		{"a CA without its key is left alone", []runtime.Object{secret(operatorCA.CertPEM, nil)}, true},
		{"a certificate that is no CA is left alone", []runtime.Object{secret(leafPEM, leafKey)}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objects...)
			before, _ := client.CoreV1().Secrets(ns).Get(context.Background(), CASecretName, metav1.GetOptions{})
			b := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, discard())
			_, err := b.sync(context.Background())
			if (err != nil) != tc.wantErr {
				t.Fatalf("sync: %v, want error %t", err, tc.wantErr)
			}
			after, _ := client.CoreV1().Secrets(ns).Get(context.Background(), CASecretName, metav1.GetOptions{})
			if string(before.Data[corev1.TLSCertKey]) != string(after.Data[corev1.TLSCertKey]) ||
				string(before.Data[corev1.TLSPrivateKeyKey]) != string(after.Data[corev1.TLSPrivateKeyKey]) {
				t.Error("the existing Secret was overwritten")
			}
			if tc.wantErr {
				select {
				case <-b.Ready():
					t.Error("ready without a certificate")
				default:
				}
				return
			}
			secretCA, bundle := published(t, client)
			if string(bundle) != string(operatorCA.CertPEM) || !chainsTo(t, b, secretCA) {
				t.Error("the operator's CA is not the one published and used")
			}
			cm, _ := client.CoreV1().ConfigMaps(ns).Get(context.Background(), CABundleConfigMapName, metav1.GetOptions{})
			if _, had := staleBundleKey(tc.objects); had && cm.Data["other"] != "kept" {
				t.Error("updating the bundle dropped the ConfigMap's other keys")
			}
		})
	}
}

func staleBundleKey(objs []runtime.Object) (string, bool) {
	for _, o := range objs {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			return cm.Data["other"], true
		}
	}
	return "", false
}

// TestRenewal: the serving certificate is reissued, by the same CA, once
// two thirds of its life have passed, and not before.
func TestRenewal(t *testing.T) {
	client := fake.NewClientset()
	b := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, discard())
	now := time.Now()
	b.now = func() time.Time { return now }
	ctx := context.Background()
	serial := func() string {
		c, err := b.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.String()
	}
	wait, err := b.sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wait > resync {
		t.Errorf("next round in %s, want at most %s", wait, resync)
	}
	first := serial()
	steps := []struct {
		name    string
		advance time.Duration
		renewed bool
	}{
		{"a resync later", resync, false},
		{"just before two thirds", ServingValidity*2/3 - resync - backdate - time.Minute, false},
		{"past two thirds", 10 * time.Minute, true},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		if _, err := b.sync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := serial() != first; got != s.renewed {
			t.Errorf("%s: renewed %t, want %t", s.name, got, s.renewed)
		}
	}
	secretCA, _ := published(t, client)
	if !chainsTo(t, b, secretCA) {
		t.Error("the renewed certificate is not signed by the CA")
	}
}
