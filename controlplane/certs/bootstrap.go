package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Names shared with the agents and the manifests (deploy/rbac.yaml grants
// access to these two objects by name).
const (
	// CASecretName is the Secret (type kubernetes.io/tls: tls.crt, tls.key)
	// holding the CA. An operator may create it beforehand with a CA of
	// their own; the control plane then uses it as is.
	CASecretName = "proxyplane-ca"
	// CABundleConfigMapName is the ConfigMap publishing the CA certificate
	// that agents verify the control plane against.
	CABundleConfigMapName = "proxyplane-ca"
	// CABundleKey is the key of the PEM bundle in that ConfigMap.
	CABundleKey = "ca.crt"
	// ServiceName is the control plane's Service, whose DNS names every
	// serving certificate carries.
	ServiceName = "proxyplane-controlplane"
)

// Bootstrap timing.
const (
	// ServingValidity is a bootstrapped serving certificate's lifetime.
	// Short enough that renewal runs routinely (a broken renewal shows
	// within days, not in a year), long enough to outlast an API server
	// outage: the certificate is issued in memory, without the API server,
	// but a renewal re-reads the CA.
	ServingValidity = 7 * 24 * time.Hour
	// resync is how often the Secret and the ConfigMap are read again
	// between renewals: a deleted and re-created CA, or a bundle edited
	// away, is noticed within minutes, at two GETs per replica.
	resync = 5 * time.Minute
	// minRetry and maxRetry bound the backoff after a failed round.
	minRetry, maxRetry = time.Second, time.Minute
)

// ServerName is the name agents verify the serving certificate against:
// the control plane's Service in namespace ns. Agents dial node addresses,
// which the certificate does not name, so they set it explicitly.
func ServerName(ns string) string { return ServiceName + "." + ns + ".svc" }

// DNSNames are the names every bootstrapped serving certificate carries.
func DNSNames(ns string) []string {
	return []string{ServiceName, ServiceName + "." + ns, ServerName(ns)}
}

// BootstrapConfig configures a Bootstrapper.
type BootstrapConfig struct {
	// Namespace holds the CA Secret and the bundle ConfigMap.
	Namespace string
	// ExtraSANs are DNS names or IP addresses that serving certificates
	// carry besides DNSNames (--tls-san).
	ExtraSANs []string
}

// Bootstrapper keeps the CA in a Secret, issues this replica's serving
// certificate and publishes the CA bundle. Run does the work; the other
// methods are safe for concurrent use.
type Bootstrapper struct {
	secrets  corev1client.SecretInterface
	cms      corev1client.ConfigMapInterface
	ns       string
	dnsNames []string
	ips      []net.IP
	log      *slog.Logger
	now      func() time.Time
	validity time.Duration

	cert      atomic.Pointer[tls.Certificate]
	ready     chan struct{}
	readyOnce sync.Once
	// caPEM is the CA that signed cert; only Run's goroutine uses it.
	caPEM []byte
}

// NewBootstrapper returns a Bootstrapper writing to cfg.Namespace.
func NewBootstrapper(client kubernetes.Interface, cfg BootstrapConfig, log *slog.Logger) *Bootstrapper {
	b := &Bootstrapper{
		secrets:  client.CoreV1().Secrets(cfg.Namespace),
		cms:      client.CoreV1().ConfigMaps(cfg.Namespace),
		ns:       cfg.Namespace,
		dnsNames: DNSNames(cfg.Namespace),
		log:      log,
		now:      time.Now,
		validity: ServingValidity,
		ready:    make(chan struct{}),
	}
	for _, san := range cfg.ExtraSANs {
		if ip := net.ParseIP(san); ip != nil {
			b.ips = append(b.ips, ip)
		} else {
			b.dnsNames = append(b.dnsNames, san)
		}
	}
	return b
}

// Ready is closed once a serving certificate exists and the CA bundle is
// published: agents can then verify what this replica serves.
func (b *Bootstrapper) Ready() <-chan struct{} { return b.ready }

// GetCertificate returns the current serving certificate, for
// tls.Config.GetCertificate. It fails only before Ready.
func (b *Bootstrapper) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := b.cert.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no serving certificate yet")
}

// Run keeps the CA, the serving certificate and the bundle current until
// ctx ends, retrying failures with backoff. It returns nil when ctx ends.
func (b *Bootstrapper) Run(ctx context.Context) error {
	retry := minRetry
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		wait, err := b.sync(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			b.log.Error("serving certificate bootstrap failed, retrying", "err", err, "retryIn", retry)
			wait, retry = retry, min(2*retry, maxRetry)
		default:
			retry = minRetry
		}
		t.Reset(wait)
	}
}

// sync makes one round: read (or create) the CA, issue a certificate if
// there is none, the CA changed or renewal is due, and publish the
// bundle. It returns when the next round is due.
func (b *Bootstrapper) sync(ctx context.Context) (time.Duration, error) {
	now := b.now()
	ca, err := ensureCA(ctx, b.secrets, b.ns, now, b.log)
	if err != nil {
		return 0, err
	}
	cur := b.cert.Load()
	if cur == nil || !bytes.Equal(ca.CertPEM, b.caPEM) || !now.Before(renewAt(cur)) {
		crt, err := ca.Issue(b.dnsNames, b.ips, now, b.validity)
		if err != nil {
			return 0, err
		}
		b.cert.Store(crt)
		b.caPEM = ca.CertPEM
		cur = crt
		b.log.Info("serving certificate issued", "dnsNames", b.dnsNames, "ips", b.ips, "notAfter", crt.Leaf.NotAfter, "ca", ca.Cert.Subject.CommonName)
	}
	if err := publishBundle(ctx, b.cms, ca.CertPEM); err != nil {
		return 0, err
	}
	b.readyOnce.Do(func() { close(b.ready) })
	return max(min(resync, renewAt(cur).Sub(now)), minRetry), nil
}

// renewAt is two thirds into c's lifetime, as kubelet rotation does: the
// remaining third leaves days to retry a failing renewal.
func renewAt(c *tls.Certificate) time.Time {
	life := c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)
	return c.Leaf.NotBefore.Add(life * 2 / 3)
}

// ensureCA returns the CA in the Secret, creating the Secret if it does
// not exist. Replicas race safely: a create that finds the Secret already
// there (another replica won) reads it back and uses that CA. A Secret
// that exists is never overwritten, even if invalid: it may be an
// operator's, so the error names it and asks for it to be fixed or
// deleted.
func ensureCA(ctx context.Context, secrets corev1client.SecretInterface, ns string, now time.Time, log *slog.Logger) (*CA, error) {
	s, err := secrets.Get(ctx, CASecretName, metav1.GetOptions{})
	if err == nil {
		return caFromSecret(s, ns, now)
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", ns, CASecretName, err)
	}
	ca, err := NewCA("proxyplane-ca@" + strconv.FormatInt(now.Unix(), 10))
	if err != nil {
		return nil, err
	}
	_, err = secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: CASecretName, Namespace: ns, Labels: labels},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM},
	}, metav1.CreateOptions{})
	if err == nil {
		log.Info("created the CA", "secret", ns+"/"+CASecretName, "notAfter", ca.Cert.NotAfter)
		return ca, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating Secret %s/%s: %w", ns, CASecretName, err)
	}
	s, err = secrets.Get(ctx, CASecretName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s created by another replica: %w", ns, CASecretName, err)
	}
	return caFromSecret(s, ns, now)
}

func caFromSecret(s *corev1.Secret, ns string, now time.Time) (*CA, error) {
	ca, err := ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], now)
	if err != nil {
		return nil, fmt.Errorf("invalid CA in Secret %s/%s (keys %s, %s): %w; fix it, or delete it for a new CA to be generated",
			ns, CASecretName, corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
	}
	return ca, nil
}

// labels mark the objects the control plane creates.
var labels = map[string]string{
	"app.kubernetes.io/part-of":    "proxyplane",
	"app.kubernetes.io/managed-by": "proxyplane-controlplane",
}

// publishBundle makes the ConfigMap's ca.crt equal caPEM. A concurrent
// writer (another replica, which publishes the same CA) makes the create
// or update fail with AlreadyExists or Conflict; reading again then finds
// the bundle current, so a few attempts always settle.
func publishBundle(ctx context.Context, cms corev1client.ConfigMapInterface, caPEM []byte) error {
	var err error
	for range 3 {
		if err = publishBundleOnce(ctx, cms, caPEM); !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

func publishBundleOnce(ctx context.Context, cms corev1client.ConfigMapInterface, caPEM []byte) error {
	cm, err := cms.Get(ctx, CABundleConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: CABundleConfigMapName, Labels: labels},
			Data:       map[string]string{CABundleKey: string(caPEM)},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating ConfigMap %s: %w", CABundleConfigMapName, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s: %w", CABundleConfigMapName, err)
	}
	if cm.Data[CABundleKey] == string(caPEM) {
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[CABundleKey] = string(caPEM)
	// The Get's resourceVersion rides along: a concurrent change makes
	// this a Conflict instead of a lost update.
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating ConfigMap %s: %w", CABundleConfigMapName, err)
	}
	return nil
}
