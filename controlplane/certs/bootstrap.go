package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
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
	// their own; the control plane then checks it (ParseCA) and uses it,
	// never changing it. One it created itself it rotates.
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
	// between renewals: a deleted and re-created CA, a rotation step, or a
	// bundle edited away, is noticed within minutes, at two GETs per
	// replica.
	resync = 5 * time.Minute
	// CAOverlap is how long each step of a CA rotation lasts (see
	// rotation). Agents read the bundle file on every connect, and the
	// kubelet refreshes a ConfigMap volume within its sync period and
	// cache TTL (a minute or two), so after an hour every agent trusts
	// the new CA; and every replica reads the Secret every resync and
	// reissues its certificate in the same round, so an hour after the
	// switch every replica that can read the Secret serves the new chain
	// (one that cannot is indistinguishable from one that is gone, and its
	// agents fail over). Rotations are months apart: a slow overlap costs
	// nothing.
	CAOverlap = time.Hour
	// minRetry and maxRetry bound the backoff after a failed round.
	minRetry, maxRetry = time.Second, time.Minute
)

// Keys and annotations of the CA Secret during a rotation, besides
// tls.crt and tls.key (the CA that signs).
const (
	// nextCertKey and nextKeyKey hold the CA being introduced: in the
	// bundle, not signing yet.
	nextCertKey, nextKeyKey = "next.crt", "next.key"
	// previousCertKey holds the CA being retired: no longer signing (its
	// key is gone), still in the bundle.
	previousCertKey = "previous.crt"
	// nextSinceAnnotation and switchedAtAnnotation date those steps.
	nextSinceAnnotation  = "proxyplane.io/ca-next-since"
	switchedAtAnnotation = "proxyplane.io/ca-switched-at"
	// RotateAnnotation, set to any value on the CA Secret by an operator,
	// starts a rotation of a CA the control plane created at its next
	// round (deploy/README.md); the rotation removes it.
	RotateAnnotation = "proxyplane.io/rotate-ca"
	// managedByLabel marks the objects the control plane creates; only a
	// CA Secret carrying it is ever rotated or replaced.
	managedByLabel = "app.kubernetes.io/managed-by"
	managedBy      = "proxyplane-controlplane"
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
// certificate and publishes the CA bundle. A CA it created it rotates
// with an overlap (rotation); one it did not it checks and uses, never
// changing it. Run does the work; the other methods are safe for
// concurrent use.
type Bootstrapper struct {
	secrets    corev1client.SecretInterface
	cms        corev1client.ConfigMapInterface
	namespaces corev1client.NamespaceInterface
	ns         string
	dnsNames   []string
	ips        []net.IP
	log        *slog.Logger
	now        func() time.Time
	validity   time.Duration

	cert      atomic.Pointer[tls.Certificate]
	ready     chan struct{}
	readyOnce sync.Once
	// problem is why the last round failed, as Problem says it; nil after
	// a round that succeeded.
	problem atomic.Pointer[string]
	// caPEM is the CA that signed cert, logged the error last logged and
	// warned whether an operator's CA nearing its end was reported; only
	// Run's goroutine uses them.
	caPEM  []byte
	logged string
	warned bool
}

// ErrNamespace is returned by Run when the namespace of the CA does not
// exist and the control plane may not create it: retrying cannot help.
var ErrNamespace = errors.New("the CA's namespace does not exist")

// roundError is a failed round: public is what Problem says to anyone
// who asks (/readyz), err what the log says.
type roundError struct {
	public string
	err    error
}

func (e *roundError) Error() string { return e.err.Error() }
func (e *roundError) Unwrap() error { return e.err }

// fail wraps err with the public reason public.
func fail(public string, err error) error { return &roundError{public: public, err: err} }

// NewBootstrapper returns a Bootstrapper writing to cfg.Namespace.
func NewBootstrapper(client kubernetes.Interface, cfg BootstrapConfig, log *slog.Logger) *Bootstrapper {
	b := &Bootstrapper{
		secrets:    client.CoreV1().Secrets(cfg.Namespace),
		cms:        client.CoreV1().ConfigMaps(cfg.Namespace),
		namespaces: client.CoreV1().Namespaces(),
		ns:         cfg.Namespace,
		dnsNames:   DNSNames(cfg.Namespace),
		log:        log,
		now:        time.Now,
		validity:   ServingValidity,
		ready:      make(chan struct{}),
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

// Problem returns "" while this replica serves a certificate valid at
// now, and otherwise why not: no certificate yet, or one expired that
// could not be renewed, with the reason of the last failed round. The
// text names objects and checks, never the API server's answers (those
// are in the log), so that /readyz can show it to anyone. Safe for
// concurrent use.
func (b *Bootstrapper) Problem(now time.Time) string {
	why := "see the log"
	if p := b.problem.Load(); p != nil {
		why = *p
	}
	c := b.cert.Load()
	switch {
	case c == nil && b.problem.Load() == nil:
		return "no serving certificate yet"
	case c == nil:
		return "no serving certificate: " + why
	case !now.Before(c.Leaf.NotAfter):
		return "the serving certificate expired and cannot be renewed: " + why
	}
	return ""
}

// Run keeps the CA, the serving certificate and the bundle current until
// ctx ends, retrying failures with backoff. It returns nil when ctx ends,
// and ErrNamespace (wrapped), unlogged, at once when the namespace is
// missing and cannot be created. Any other failure is logged once, with
// its reason, and again only when the reason changes or the round
// succeeds again.
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
		case errors.Is(err, ErrNamespace):
			// Not logged here: the caller ends with it, and says so.
			b.problem.Store(publicOf(err))
			return err
		case err != nil:
			b.report(err)
			wait, retry = retry, min(2*retry, maxRetry)
		default:
			b.report(nil)
			retry = minRetry
		}
		t.Reset(wait)
	}
}

// report records a round's outcome for Problem and logs a change of it:
// one clear line per problem, not one per retry.
func (b *Bootstrapper) report(err error) {
	if err == nil {
		if b.logged != "" {
			b.log.Info("the CA and the serving certificate are current again")
		}
		b.logged = ""
		b.problem.Store(nil)
		return
	}
	public := publicOf(err)
	b.problem.Store(public)
	if msg := err.Error(); msg != b.logged {
		b.logged = msg
		b.log.Error("cannot keep the CA and the serving certificate; retrying with backoff, this is logged again only if the reason changes",
			"reason", *public, "err", err, "servingCertificate", b.Problem(b.now()) == "")
	}
}

// publicOf is the public reason of a round's error.
func publicOf(err error) *string {
	public := "see the log"
	var re *roundError
	if errors.As(err, &re) {
		public = re.public
	}
	return &public
}

// sync makes one round: read (or create) the CA and take any rotation
// step that is due, issue a certificate if there is none, the signing CA
// changed or renewal is due, and publish the bundle. It returns when the
// next round is due.
func (b *Bootstrapper) sync(ctx context.Context) (time.Duration, error) {
	now := b.now()
	st, err := b.ensureCA(ctx, now)
	if err != nil {
		return 0, err
	}
	ca := st.signer
	cur := b.cert.Load()
	if cur == nil || !bytes.Equal(ca.CertPEM, b.caPEM) || !now.Before(renewAt(cur)) {
		crt, err := ca.Issue(b.dnsNames, b.ips, now, b.validity)
		if err != nil {
			return 0, fail("cannot issue a serving certificate", err)
		}
		b.cert.Store(crt)
		b.caPEM = ca.CertPEM
		cur = crt
		b.log.Info("serving certificate issued", "dnsNames", b.dnsNames, "ips", b.ips, "notAfter", crt.Leaf.NotAfter, "ca", ca.Cert.Subject.CommonName)
	}
	if err := publishBundle(ctx, b.cms, st.bundle); err != nil {
		return 0, fail("cannot publish the CA bundle in ConfigMap "+b.ns+"/"+CABundleConfigMapName, err)
	}
	b.readyOnce.Do(func() { close(b.ready) })
	return max(min(resync, renewAt(cur).Sub(now)), minRetry), nil
}

// renewAt is two thirds into c's lifetime, as kubelet rotation does: the
// remaining third leaves days to retry a failing renewal.
func renewAt(c *tls.Certificate) time.Time { return twoThirds(c.Leaf) }

// caState is what a round signs with and publishes.
type caState struct {
	// signer signs serving certificates.
	signer *CA
	// bundle is every CA agents must trust now, PEM: the signer, and the
	// CA being introduced or retired during a rotation.
	bundle []byte
}

// ensureCA returns the CA in the Secret, creating the Secret (and its
// namespace, where the control plane may) if it does not exist, and
// taking the rotation step that is due. Replicas race safely: a create
// that finds the Secret already there (another replica won) reads it back
// and uses that CA, and an update that meets a Conflict reads again.
func (b *Bootstrapper) ensureCA(ctx context.Context, now time.Time) (*caState, error) {
	var err error
	for range 3 {
		var s *corev1.Secret
		s, err = b.secrets.Get(ctx, CASecretName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			s, err = b.createCA(ctx, now)
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return nil, err
			}
		case err != nil:
			return nil, fail("cannot read Secret "+b.secretName(), fmt.Errorf("reading Secret %s: %w", b.secretName(), err))
		}
		var st *caState
		st, err = b.reconcileCA(ctx, s, now)
		if apierrors.IsConflict(err) {
			continue
		}
		return st, err
	}
	return nil, fail("cannot keep Secret "+b.secretName()+" (concurrent changes)", err)
}

func (b *Bootstrapper) secretName() string { return b.ns + "/" + CASecretName }

// createCA creates the Secret with a new CA, and the namespace first if
// it is missing (`make run` against a cluster deploy/ was not applied
// to). It returns AlreadyExists when another replica created the Secret
// first.
func (b *Bootstrapper) createCA(ctx context.Context, now time.Time) (*corev1.Secret, error) {
	ca, err := newCA("proxyplane-ca@"+strconv.FormatInt(now.Unix(), 10), now, CAValidity)
	if err != nil {
		return nil, fail("cannot generate a CA", err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: CASecretName, Namespace: b.ns, Labels: labels},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM},
	}
	s, err := b.secrets.Create(ctx, secret, metav1.CreateOptions{})
	if isNamespaceNotFound(err) {
		if err := b.createNamespace(ctx); err != nil {
			return nil, err
		}
		s, err = b.secrets.Create(ctx, secret, metav1.CreateOptions{})
	}
	if apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	if err != nil {
		return nil, fail("cannot create Secret "+b.secretName(), fmt.Errorf("creating Secret %s: %w", b.secretName(), err))
	}
	b.log.Info("created the CA", "secret", b.secretName(), "notAfter", ca.Cert.NotAfter)
	return s, nil
}

// isNamespaceNotFound says whether err is the API server's answer to a
// create in a namespace that does not exist.
func isNamespaceNotFound(err error) bool {
	var st apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d != nil && d.Kind == "namespaces"
}

// createNamespace creates the namespace, or returns ErrNamespace when
// the control plane may not: retrying would not change that.
func (b *Bootstrapper) createNamespace(ctx context.Context) error {
	_, err := b.namespaces.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns, Labels: labels}}, metav1.CreateOptions{})
	switch {
	case err == nil:
		b.log.Info("created the namespace of the CA", "namespace", b.ns)
		return nil
	case apierrors.IsAlreadyExists(err):
		return nil
	case apierrors.IsForbidden(err):
		public := "namespace " + b.ns + " does not exist and the control plane may not create it"
		return fail(public, fmt.Errorf("%w: %s: apply deploy/ (namespace.yaml), create the namespace, or pass --namespace: %w", ErrNamespace, public, err))
	default:
		return fail("cannot create namespace "+b.ns, fmt.Errorf("creating namespace %s: %w", b.ns, err))
	}
}

// reconcileCA checks the CA in s and, for a CA the control plane
// created, takes the rotation step that is due. An operator's CA (no
// managed-by label) is used as is, never changed: it is checked, and a
// warning is logged once it has a third of its life left.
func (b *Bootstrapper) reconcileCA(ctx context.Context, s *corev1.Secret, now time.Time) (*caState, error) {
	managed := s.Labels[managedByLabel] == managedBy
	cur, err := ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], now)
	// Only our own CA may be past its dates: it is replaced below.
	if err != nil && (!managed || !errors.Is(err, errCAExpired)) {
		public := fmt.Sprintf("Secret %s holds no usable CA: %v", b.secretName(), err)
		return nil, fail(public, fmt.Errorf("invalid CA in Secret %s (keys %s, %s): %w; fix it, or delete it for a new CA to be generated",
			b.secretName(), corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err))
	}
	if !managed {
		if !b.warned && !now.Before(rotateCAAt(cur.Cert)) {
			b.warned = true
			b.log.Warn("the CA in the Secret was not created by the control plane, which therefore never rotates it, and it nears its end: rotate it (deploy/README.md)",
				"secret", b.secretName(), "notAfter", cur.Cert.NotAfter)
		}
		return &caState{signer: cur, bundle: cur.CertPEM}, nil
	}
	r := rotation{s: s.DeepCopy(), now: now, log: b.log.With("secret", b.secretName())}
	if err != nil {
		// Our own CA outlived: nothing trusts it any more, so a new one
		// replaces it at once (agents trust it once their bundle
		// updates).
		cur, err = r.replace()
	} else {
		cur, err = r.step(cur)
	}
	if err != nil {
		return nil, fail("cannot rotate the CA in Secret "+b.secretName(), err)
	}
	if r.changed {
		if _, err := b.secrets.Update(ctx, r.s, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsConflict(err) {
				return nil, err
			}
			return nil, fail("cannot update Secret "+b.secretName()+" to rotate the CA", fmt.Errorf("updating Secret %s: %w", b.secretName(), err))
		}
		r.logStep()
	}
	return &caState{signer: cur, bundle: r.bundle(cur)}, nil
}

// rotateCAAt is two thirds into a CA's life, as renewAt.
func rotateCAAt(c *x509.Certificate) time.Time { return twoThirds(c) }

// twoThirds is the point two thirds into c's validity.
func twoThirds(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// rotation takes one step of a CA rotation on a copy of the Secret:
//
//  1. introduce: a new CA is added under next.crt/next.key; the bundle
//     holds both, the old one still signs. Due two thirds into the old
//     CA's life, or when an operator sets RotateAnnotation.
//  2. switch, CAOverlap later (every agent now trusts the new CA): the
//     new CA moves to tls.crt/tls.key and signs, the old certificate
//     moves to previous.crt without its key; the bundle still holds both,
//     for replicas that serve certificates from the old CA until their
//     next round.
//  3. retire, CAOverlap later (every replica serves the new chain):
//     previous.crt is removed; the bundle holds the new CA only.
//
// Every step is one update of the Secret, guarded by its resourceVersion,
// so two replicas never take the same step twice.
type rotation struct {
	s       *corev1.Secret
	now     time.Time
	log     *slog.Logger
	changed bool
	did     string
	// next and previous are the other CAs of the bundle, if any.
	next     *CA
	previous []byte
}

func (r *rotation) step(cur *CA) (*CA, error) {
	data, ann := r.s.Data, r.s.Annotations
	if pem := data[nextCertKey]; pem != nil {
		next, err := ParseCA(pem, data[nextKeyKey], r.now)
		if err != nil {
			// Ours, half written or damaged: drop it and start over.
			r.log.Warn("dropping an unusable CA being introduced", "err", err)
			delete(data, nextCertKey)
			delete(data, nextKeyKey)
			r.changed = true
		} else {
			r.next = next
		}
	}
	if pem := data[previousCertKey]; pem != nil {
		if _, err := ParseCACert(pem, r.now); err != nil {
			delete(data, previousCertKey)
			r.changed, r.did = true, "retired the previous CA (it is no longer valid)"
		} else {
			r.previous = pem
		}
	}
	switch {
	case r.next != nil && !r.now.Before(r.since(nextSinceAnnotation).Add(CAOverlap)):
		old := cur
		cur, r.next = r.next, nil
		data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey] = cur.CertPEM, cur.KeyPEM
		data[previousCertKey] = old.CertPEM
		r.previous = old.CertPEM
		delete(data, nextCertKey)
		delete(data, nextKeyKey)
		delete(ann, nextSinceAnnotation)
		r.annotate(switchedAtAnnotation)
		r.changed, r.did = true, "switched to the new CA: it signs from now on; the previous CA stays in the bundle for "+CAOverlap.String()
	case r.previous != nil && !r.now.Before(r.since(switchedAtAnnotation).Add(CAOverlap)):
		delete(data, previousCertKey)
		delete(ann, switchedAtAnnotation)
		r.previous = nil
		r.changed, r.did = true, "retired the previous CA: the bundle holds the current CA only"
	case r.next == nil && r.previous == nil && (!r.now.Before(rotateCAAt(cur.Cert)) || ann[RotateAnnotation] != ""):
		next, err := newCA("proxyplane-ca@"+strconv.FormatInt(r.now.Unix(), 10), r.now, CAValidity)
		if err != nil {
			return nil, err
		}
		r.next = next
		data[nextCertKey], data[nextKeyKey] = next.CertPEM, next.KeyPEM
		delete(ann, RotateAnnotation)
		r.annotate(nextSinceAnnotation)
		r.changed, r.did = true, "introduced a new CA: in the bundle now, signing in "+CAOverlap.String()
	}
	return cur, nil
}

// replace puts a new CA in place of one that expired (or is not valid
// yet: a clock set back), dropping any rotation under way.
func (r *rotation) replace() (*CA, error) {
	ca, err := newCA("proxyplane-ca@"+strconv.FormatInt(r.now.Unix(), 10), r.now, CAValidity)
	if err != nil {
		return nil, err
	}
	data := r.s.Data
	for _, k := range []string{nextCertKey, nextKeyKey, previousCertKey} {
		delete(data, k)
	}
	for _, k := range []string{nextSinceAnnotation, switchedAtAnnotation, RotateAnnotation} {
		delete(r.s.Annotations, k)
	}
	data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey] = ca.CertPEM, ca.KeyPEM
	r.changed, r.did = true, "replaced the CA, which is not valid now: agents trust the new one once their bundle updates"
	return ca, nil
}

// since reads a step's date; a missing or garbled one counts as now, so
// that the step waits a full overlap rather than being skipped.
func (r *rotation) since(key string) time.Time {
	t, err := time.Parse(time.RFC3339, r.s.Annotations[key])
	if err != nil {
		r.annotate(key)
		r.changed = true
		return r.now
	}
	return t
}

func (r *rotation) annotate(key string) {
	if r.s.Annotations == nil {
		r.s.Annotations = map[string]string{}
	}
	r.s.Annotations[key] = r.now.UTC().Format(time.RFC3339)
}

func (r *rotation) logStep() {
	if r.did != "" {
		r.log.Info("CA rotation: " + r.did)
	}
}

// bundle is cur, then the CA being introduced or retired.
func (r *rotation) bundle(cur *CA) []byte {
	b := slices.Clone(cur.CertPEM)
	if r.next != nil {
		b = append(b, r.next.CertPEM...)
	}
	return append(b, r.previous...)
}

// labels mark the objects the control plane creates.
var labels = map[string]string{
	"app.kubernetes.io/part-of": "proxyplane",
	managedByLabel:              managedBy,
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
