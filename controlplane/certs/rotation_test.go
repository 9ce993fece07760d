package certs

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// clock is a settable time for Bootstrappers under test.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func clocked(client *fake.Clientset, c *clock) *Bootstrapper {
	b := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, discard())
	b.now = c.now
	return b
}

func syncOK(t *testing.T, b *Bootstrapper) {
	t.Helper()
	if _, err := b.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// bundleCerts are the certificates of the published bundle.
func bundleCerts(t *testing.T, client *fake.Clientset) []*x509.Certificate {
	t.Helper()
	_, bundle := published(t, client)
	crts, err := cert.ParseCertsPEM(bundle)
	if err != nil {
		t.Fatal(err)
	}
	return crts
}

// verifies says whether b's serving certificate verifies, as an agent
// verifies it, against a bundle of roots at b's time.
func verifies(t *testing.T, b *Bootstrapper, roots []*x509.Certificate) bool {
	t.Helper()
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	c, err := b.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: ServerName(ns), CurrentTime: b.now()})
	return err == nil
}

func TestNewCALifetimeIsBounded(t *testing.T) {
	ca := newTestCA(t)
	if life := ca.Cert.NotAfter.Sub(ca.Cert.NotBefore); life > CAValidity+backdate || life < CAValidity {
		t.Errorf("CA valid for %s, want %s", life, CAValidity)
	}
	if _, err := ParseCA(ca.CertPEM, ca.KeyPEM, time.Now()); err != nil {
		t.Errorf("a new CA fails its own checks: %v", err)
	}
}

// TestCARotationOverlap rotates the CA of two replicas that read the
// Secret at different times, and checks at every moment that each
// replica's serving certificate verifies against the bundle published
// now and the one published before it (an agent's file may lag one
// update behind): the bundle holds the old and the new CA until every
// replica serves the new chain.
func TestCARotationOverlap(t *testing.T) {
	client := fake.NewClientset()
	c := &clock{t: time.Now()}
	a, b := clocked(client, c), clocked(client, c)
	syncOK(t, a)
	syncOK(t, b)
	first := bundleCerts(t, client)
	if len(first) != 1 {
		t.Fatalf("bundle of %d certificates before any rotation, want 1", len(first))
	}
	bundles := [][]*x509.Certificate{first}
	check := func(when string) {
		t.Helper()
		bundles = append(bundles, bundleCerts(t, client))
		for _, bn := range bundles[len(bundles)-2:] {
			for i, r := range []*Bootstrapper{a, b} {
				if !verifies(t, r, bn) {
					t.Errorf("%s: replica %d's certificate does not verify against a bundle of %d CAs", when, i, len(bn))
				}
			}
		}
	}
	// Halfway: nothing happens.
	c.advance(CAValidity / 2)
	syncOK(t, a)
	syncOK(t, b)
	check("halfway")
	if n := len(bundleCerts(t, client)); n != 1 {
		t.Fatalf("rotation started halfway: bundle of %d", n)
	}
	// Just before two thirds both renew their serving certificates, as
	// rounds every resync would; then a introduces the new CA, and both
	// still sign with the old.
	c.advance(CAValidity/6 - 2*time.Minute)
	syncOK(t, a)
	syncOK(t, b)
	c.advance(3 * time.Minute)
	syncOK(t, a)
	check("new CA introduced, b not synced")
	syncOK(t, b)
	check("new CA introduced")
	if n := len(bundleCerts(t, client)); n != 2 {
		t.Fatalf("after the introduction: bundle of %d, want 2", n)
	}
	if !verifies(t, a, first) || !verifies(t, b, first) {
		t.Error("a replica signs with the new CA before every agent can trust it")
	}
	// Not yet an overlap later: no switch.
	c.advance(CAOverlap - time.Minute)
	syncOK(t, a)
	check("before the switch")
	if !verifies(t, a, first) {
		t.Error("switched before the overlap ended")
	}
	// The switch: a signs with the new CA, b still serves the old chain.
	c.advance(2 * time.Minute)
	syncOK(t, a)
	check("switched, b not synced")
	if verifies(t, a, first) {
		t.Error("a does not serve the new chain after the switch")
	}
	c.advance(resync)
	syncOK(t, b)
	check("switched")
	if verifies(t, b, first) {
		t.Error("b does not serve the new chain after its round")
	}
	if n := len(bundleCerts(t, client)); n != 2 {
		t.Fatalf("after the switch: bundle of %d, want the old CA still in it", n)
	}
	// Retired an overlap later: the new CA alone.
	c.advance(CAOverlap)
	syncOK(t, b)
	syncOK(t, a)
	check("retired")
	final := bundleCerts(t, client)
	if len(final) != 1 || final[0].Equal(first[0]) {
		t.Fatalf("after the rotation: bundle of %d, want the new CA alone", len(final))
	}
	s, err := client.CoreV1().Secrets(ns).Get(context.Background(), CASecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Data) != 2 || len(s.Annotations) != 0 {
		t.Errorf("after the rotation the Secret holds keys %v and annotations %v, want tls.crt and tls.key only", keys(s.Data), s.Annotations)
	}
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestCARotationOnDemand: an operator's annotation starts a rotation at
// the next round, and is removed.
func TestCARotationOnDemand(t *testing.T) {
	client := fake.NewClientset()
	c := &clock{t: time.Now()}
	a := clocked(client, c)
	syncOK(t, a)
	ctx := context.Background()
	s, _ := client.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
	s.Annotations = map[string]string{RotateAnnotation: "suspected leak"}
	if _, err := client.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	syncOK(t, a)
	if n := len(bundleCerts(t, client)); n != 2 {
		t.Errorf("bundle of %d after a rotation was asked for, want 2", n)
	}
	s, _ = client.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
	if _, ok := s.Annotations[RotateAnnotation]; ok {
		t.Error("the request to rotate stayed on the Secret")
	}
}

// TestExpiredCA: a CA the control plane created is replaced once it
// expired (nothing trusts it any more); an operator's is never touched.
func TestExpiredCA(t *testing.T) {
	for _, managed := range []bool{true, false} {
		client := fake.NewClientset()
		c := &clock{t: time.Now()}
		syncOK(t, clocked(client, c))
		ctx := context.Background()
		if !managed {
			s, _ := client.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
			s.Labels = nil
			if _, err := client.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		before, _ := published(t, client)
		c.advance(CAValidity + time.Hour)
		b := clocked(client, c)
		_, err := b.sync(ctx)
		b.report(err)
		after, _ := published(t, client)
		if managed {
			if err != nil || bytes.Equal(before, after) || !chainsTo(t, b, after) {
				t.Errorf("our expired CA: %v, replaced %t; want a new CA signing", err, !bytes.Equal(before, after))
			}
			continue
		}
		if err == nil || !bytes.Equal(before, after) {
			t.Errorf("an operator's expired CA: %v, replaced %t; want an error and the Secret untouched", err, !bytes.Equal(before, after))
		}
		if p := b.Problem(c.now()); !strings.Contains(p, "Secret "+ns+"/"+CASecretName+" holds no usable CA") {
			t.Errorf("Problem %q does not say why", p)
		}
	}
}

// badCA builds a certificate and key from tmpl signed by signer (self
// when nil) with a P-256 key, or with key when given.
func badCA(t *testing.T, tmpl *x509.Certificate, signer *CA, key any) (certPEM, keyPEM []byte) {
	t.Helper()
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		key = k
	}
	pub := key.(crypto.Signer).Public()
	parent, signKey := tmpl, key
	if signer != nil {
		parent, signKey = signer.Cert, signer.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	crt, _ := x509.ParseCertificate(der)
	certPEM, _ = cert.EncodeCertificates(crt)
	return certPEM, keyPEM
}

func caTemplate(mod func(*x509.Certificate)) *x509.Certificate {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "planted"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	if mod != nil {
		mod(tmpl)
	}
	return tmpl
}

// TestPlantedSecretIsChecked plants CA Secrets before the control plane
// starts: each bad one is refused with an error saying which check
// failed, nothing is signed or published, and the Secret is left alone;
// a good one is used.
func TestPlantedSecretIsChecked(t *testing.T) {
	other := newTestCA(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // the weak key under test
	if err != nil {
		t.Fatal(err)
	}
	pair := func(crt, key []byte) [2][]byte { return [2][]byte{crt, key} }
	goodCrt, goodKey := badCA(t, caTemplate(nil), nil, nil)
	leafCrt, leafKey := badCA(t, caTemplate(func(c *x509.Certificate) {
		c.IsCA, c.KeyUsage, c.ExtKeyUsage = false, x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}), other, nil)
	// Issuer equals subject, but another key signed it.
	forgedCrt, forgedKey := badCA(t, caTemplate(func(c *x509.Certificate) { c.Subject = other.Cert.Subject }), other, nil)
	cases := []struct {
		name string
		pair [2][]byte
		want string
	}{
		{"a good CA of the operator's", pair(goodCrt, goodKey), ""},
		{"a leaf", pair(leafCrt, leafKey), "not a CA"},
		{"a CA without CertSign", pair(badCA(t, caTemplate(func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }), nil, nil)), "CertSign"},
		{"a CA for client certificates only", pair(badCA(t, caTemplate(func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }), nil, nil)), "ServerAuth"},
		{"a certificate with another's key", pair(goodCrt, other.KeyPEM), "private key does not match"},
		{"an expired CA", pair(badCA(t, caTemplate(func(c *x509.Certificate) { c.NotAfter = time.Now().Add(-time.Minute) }), nil, nil)), "not valid now"},
		{"a weak RSA key", pair(badCA(t, caTemplate(nil), nil, rsaKey)), "1024 bits"},
		{"a self-signed certificate whose signature does not hold", pair(forgedCrt, forgedKey), "signature does not hold"},
		{"no key", pair(goodCrt, nil), "parsing CA certificate and key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			planted := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: CASecretName},
				Type:       corev1.SecretTypeTLS,
				Data:       map[string][]byte{corev1.TLSCertKey: tc.pair[0], corev1.TLSPrivateKeyKey: tc.pair[1]},
			}
			client := fake.NewClientset(planted)
			b := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, discard())
			_, err := b.sync(context.Background())
			b.report(err)
			after, _ := client.CoreV1().Secrets(ns).Get(context.Background(), CASecretName, metav1.GetOptions{})
			if !bytes.Equal(after.Data[corev1.TLSCertKey], tc.pair[0]) || !bytes.Equal(after.Data[corev1.TLSPrivateKeyKey], tc.pair[1]) || len(after.Data) != 2 {
				t.Error("the planted Secret was changed")
			}
			if tc.want == "" {
				if err != nil || b.Problem(time.Now()) != "" {
					t.Fatalf("a good CA refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("sync: %v, want an error saying %q", err, tc.want)
			}
			if _, err := b.GetCertificate(nil); err == nil {
				t.Error("a serving certificate was issued from a refused CA")
			}
			if _, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), CABundleConfigMapName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("a refused CA was published (%v)", err)
			}
			if p := b.Problem(time.Now()); !strings.Contains(p, tc.want) {
				t.Errorf("Problem %q does not say %q", p, tc.want)
			}
		})
	}
}

// namespaceGuard makes creates in ns fail as the API server does while
// the namespace does not exist.
func namespaceGuard(client *fake.Clientset, mayCreate bool) {
	exists := false
	var mu sync.Mutex
	client.PrependReactor("create", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !mayCreate {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "", errors.New("cannot create resource namespaces at the cluster scope"))
		}
		mu.Lock()
		exists = true
		mu.Unlock()
		return false, nil, nil
	})
	for _, res := range []string{"secrets", "configmaps"} {
		client.PrependReactor("create", res, func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if !exists {
				return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns)
			}
			return false, nil, nil
		})
	}
}

// TestMissingNamespace: a namespace that does not exist is created where
// the control plane may; where it may not, Run ends at once with an error
// that says what to do, instead of retrying forever.
func TestMissingNamespace(t *testing.T) {
	t.Run("may create it", func(t *testing.T) {
		client := fake.NewClientset()
		namespaceGuard(client, true)
		b := bootstrap(t, client)
		if _, err := client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); err != nil {
			t.Errorf("namespace not created: %v", err)
		}
		if _, err := b.GetCertificate(nil); err != nil {
			t.Error(err)
		}
	})
	t.Run("may not", func(t *testing.T) {
		client := fake.NewClientset()
		namespaceGuard(client, false)
		var logs bytes.Buffer
		b := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, slog.New(slog.NewTextHandler(&logs, nil)))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := b.Run(ctx)
		if !errors.Is(err, ErrNamespace) || !strings.Contains(err.Error(), "apply deploy/") {
			t.Fatalf("Run: %v, want ErrNamespace saying what to do", err)
		}
		if p := b.Problem(time.Now()); !strings.Contains(p, "namespace "+ns+" does not exist") {
			t.Errorf("Problem %q", p)
		}
		// The caller logs the error Run ends with; retries would log more.
		if n := strings.Count(logs.String(), "level=ERROR"); n != 0 {
			t.Errorf("%d error lines, want none besides the caller's:\n%s", n, logs.String())
		}
	})
}

// TestProblemLoggedOnce: a round failing again for the same reason is not
// logged again; a recovery is.
func TestProblemLoggedOnce(t *testing.T) {
	client := fake.NewClientset()
	var fail atomic.Bool
	client.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail.Load() {
			return true, nil, apierrors.NewServiceUnavailable("etcd is down")
		}
		return false, nil, nil
	})
	var logs bytes.Buffer
	b := NewBootstrapper(client, BootstrapConfig{Namespace: ns}, slog.New(slog.NewTextHandler(&logs, nil)))
	fail.Store(true)
	for range 3 {
		_, err := b.sync(context.Background())
		b.report(err)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines for three failed rounds, want one:\n%s", n, logs.String())
	}
	if p := b.Problem(time.Now()); p != "no serving certificate: cannot read Secret "+ns+"/"+CASecretName {
		t.Errorf("Problem %q", p)
	}
	if strings.Contains(b.Problem(time.Now()), "etcd") {
		t.Error("Problem shows the API server's answer")
	}
	fail.Store(false)
	_, err := b.sync(context.Background())
	b.report(err)
	if err != nil || b.Problem(time.Now()) != "" || !strings.Contains(logs.String(), "current again") {
		t.Errorf("after recovery: %v, Problem %q", err, b.Problem(time.Now()))
	}
}
