package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// With --secure, the harness sets up what deploy/ and the kubelet would:
// the control plane's namespace, where it keeps its CA, the agents'
// ServiceAccount, a Pod of the agents' DaemonSet on every node (which
// nothing runs: it stays Pending) and, for each, the token the kubelet
// would project into it. The names are deploy/'s and the control plane's
// defaults, passed to it explicitly so that both sides agree.
const (
	secureNamespace     = "proxyplane-system"
	agentServiceAccount = "proxyplane-nodeagent"
	// agentDaemonSet controls every agent Pod, as deploy/'s DaemonSet
	// does (the control plane's default --agent-daemonset): the control
	// plane accepts only tokens bound to its Pods. No controller runs, so
	// it creates nothing itself.
	agentDaemonSet = "proxyplane-nodeagent"
	// readerServiceAccount is the harness's own identity for ListNodes:
	// it may list EndpointSlices, and its token is for tokenAudience.
	readerServiceAccount = "proxyplane-fleet-reader"
	// agentPodPrefix names node i's Pod agentPodPrefix<i, 5 digits>.
	agentPodPrefix = "proxyplane-nodeagent-"
	// tokenAudience is deploy/nodeagent.yaml's projected audience.
	tokenAudience = "proxyplane"
	// tokenLifetime is deploy/nodeagent.yaml's expirationSeconds: no run
	// outlives it (--phase-timeout bounds each phase to 10 minutes, and
	// the TokenReview cache's 2 minutes are far shorter).
	tokenLifetime = time.Hour
	// caConfigMap and caKey are where the control plane publishes its CA
	// bundle (controlplane/certs).
	caConfigMap = "proxyplane-ca"
	caKey       = "ca.crt"
	// serverName is what agents verify: they dial node addresses, which
	// the certificate need not name (docs/protocol.md, "Trust").
	serverName = "proxyplane-controlplane." + secureNamespace + ".svc"
)

// identityFigures are what setting up the agents' identities cost.
type identityFigures struct {
	// Pods and Tokens are the wall time to create every Pod and to
	// request every token, each with the worker pool.
	Pods   time.Duration `json:"pods"`
	Tokens time.Duration `json:"tokens"`
	// TokenBytes is the tokens' total size.
	TokenBytes int `json:"tokenBytes"`
	// CAPublished is the control plane's first ready to its CA bundle
	// read from the ConfigMap.
	CAPublished time.Duration `json:"caPublished"`
}

// agentCredentials are the files the agents' process reads, and the
// harness's own reader token.
type agentCredentials struct {
	caFile, tokenFile string
	readerToken       string
}

// createIdentities creates the namespace, the agents' ServiceAccount, a
// Pod per node and a token bound to each (audience tokenAudience), and
// writes the tokens to tokenFile, one line per node in node order.
func createIdentities(ctx context.Context, css []kubernetes.Interface, nodes, workers int, tokenFile string) (identityFigures, error) {
	var f identityFigures
	cs := css[0]
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secureNamespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return f, fmt.Errorf("creating namespace %s: %w", secureNamespace, err)
	}
	sa := &corev1.ServiceAccount{
		ObjectMeta:                   metav1.ObjectMeta{Name: agentServiceAccount},
		AutomountServiceAccountToken: ptr.To(false),
	}
	if _, err := cs.CoreV1().ServiceAccounts(secureNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return f, fmt.Errorf("creating ServiceAccount %s/%s: %w", secureNamespace, agentServiceAccount, err)
	}

	ds, err := cs.AppsV1().DaemonSets(secureNamespace).Create(ctx, agentDaemonSetObject(), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		ds, err = cs.AppsV1().DaemonSets(secureNamespace).Get(ctx, agentDaemonSet, metav1.GetOptions{})
	}
	if err != nil {
		return f, fmt.Errorf("creating DaemonSet %s/%s: %w", secureNamespace, agentDaemonSet, err)
	}
	owner := metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))

	t0 := time.Now()
	// A token is bound to its Pod by name and UID.
	uids := make([]types.UID, nodes)
	if err := parallel(ctx, workers, nodes, func(ctx context.Context, worker, i int) error {
		pod := agentPod(i)
		pod.OwnerReferences = []metav1.OwnerReference{*owner}
		p, err := css[worker%len(css)].CoreV1().Pods(secureNamespace).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating Pod %s: %w", agentPodName(i), err)
		}
		uids[i] = p.UID
		return nil
	}); err != nil {
		return f, err
	}
	f.Pods = time.Since(t0)
	log.Printf("created %d agent Pods in %v", nodes, f.Pods.Round(time.Millisecond))

	t0 = time.Now()
	tokens := make([]string, nodes)
	var size atomic.Int64
	if err := parallel(ctx, workers, nodes, func(ctx context.Context, worker, i int) error {
		tr, err := css[worker%len(css)].CoreV1().ServiceAccounts(secureNamespace).CreateToken(ctx, agentServiceAccount, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				Audiences:         []string{tokenAudience},
				ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second)),
				BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPodName(i), UID: uids[i]},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("requesting a token for %s: %w", agentPodName(i), err)
		}
		tok := tr.Status.Token
		if tok == "" || strings.ContainsAny(tok, "\n\r ") {
			return fmt.Errorf("the token for %s is empty or not one line", agentPodName(i))
		}
		tokens[i] = tok
		size.Add(int64(len(tok)))
		return nil
	}); err != nil {
		return f, err
	}
	f.Tokens = time.Since(t0)
	f.TokenBytes = int(size.Load())
	log.Printf("requested %d tokens in %v", nodes, f.Tokens.Round(time.Millisecond))
	// The tokens are credentials: readable by this user only.
	if err := os.WriteFile(tokenFile, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		return f, fmt.Errorf("writing the agents' tokens: %w", err)
	}
	return f, nil
}

func agentPodName(i int) string { return fmt.Sprintf("%s%05d", agentPodPrefix, i) }

// agentDaemonSetObject is the agents' DaemonSet, owner of agentPod's.
func agentDaemonSetObject() *appsv1.DaemonSet {
	labels := map[string]string{"app.kubernetes.io/name": agentServiceAccount}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: agentDaemonSet, Namespace: secureNamespace},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: agentServiceAccount,
					Containers:         []corev1.Container{{Name: "nodeagent", Image: "proxyplane/nodeagent:fleet"}},
				},
			},
		},
	}
}

// createReader creates readerServiceAccount, a ClusterRole that may list
// EndpointSlices and its binding, and returns a token of it for
// tokenAudience once RBAC admits it: what an operator's grpcurl holds.
func createReader(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) (string, error) {
	name := readerServiceAccount
	if _, err := cs.CoreV1().ServiceAccounts(secureNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating ServiceAccount %s/%s: %w", secureNamespace, name, err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}}},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating ClusterRole %s: %w", name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: secureNamespace, Name: name}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating ClusterRoleBinding %s: %w", name, err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(secureNamespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{tokenAudience}, ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second))},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for %s: %w", name, err)
	}
	// The RBAC authorizer learns of the binding through an informer.
	user := "system:serviceaccount:" + secureNamespace + ":" + name
	err = poll(ctx, "RBAC to admit "+user, 20*time.Millisecond, timeout, func(ctx context.Context) (bool, error) {
		r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + secureNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"},
		}}, metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Errorf("asking whether %s may list EndpointSlices: %w", user, err)
		}
		return r.Status.Allowed, nil
	})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// agentPod is node i's Pod of the agents' DaemonSet, as the DaemonSet
// controller would create it (deploy/nodeagent.yaml's identity; the
// container is a placeholder, never run).
func agentPod(i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: agentPodName(i), Namespace: secureNamespace,
			Labels: map[string]string{"app.kubernetes.io/name": agentServiceAccount},
		},
		Spec: corev1.PodSpec{
			NodeName:                     nodeName(i),
			ServiceAccountName:           agentServiceAccount,
			AutomountServiceAccountToken: ptr.To(false),
			HostNetwork:                  true,
			Containers:                   []corev1.Container{{Name: "nodeagent", Image: "proxyplane/nodeagent:fleet"}},
		},
	}
}

// waitCA waits until the control plane has published its CA bundle and
// writes it to caFile.
func waitCA(ctx context.Context, cs kubernetes.Interface, timeout time.Duration, caFile string) ([]byte, error) {
	var ca string
	err := poll(ctx, "the CA bundle published in ConfigMap "+secureNamespace+"/"+caConfigMap, 20*time.Millisecond, timeout, func(ctx context.Context) (bool, error) {
		cm, err := cs.CoreV1().ConfigMaps(secureNamespace).Get(ctx, caConfigMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("reading ConfigMap %s: %w", caConfigMap, err)
		}
		ca = cm.Data[caKey]
		return ca != "", nil
	})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(caFile, []byte(ca), 0o644); err != nil {
		return nil, fmt.Errorf("writing the CA bundle: %w", err)
	}
	return []byte(ca), nil
}

// setupSecure creates the agents' identities before the control plane
// starts.
func (h *harness) setupSecure(ctx context.Context) error {
	h.creds = &agentCredentials{caFile: filepath.Join(h.o.Dir, "ca.crt"), tokenFile: filepath.Join(h.o.Dir, "agent-tokens")}
	f, err := createIdentities(ctx, h.css, h.o.Nodes, h.o.Workers, h.creds.tokenFile)
	h.res.Identities = &f
	if err != nil {
		return err
	}
	h.creds.readerToken, err = createReader(ctx, h.css[0], h.o.PhaseTimeout)
	return err
}

// connectSecure waits for the CA bundle of the control plane just
// started, and connects the harness's own client with it and a reader's
// token: readerServiceAccount's for the control plane's audience, or,
// for binaries that take readers' tokens for the API server's, the
// admin's, which the control plane reviews like any reader's.
func (h *harness) connectSecure(ctx context.Context, adminToken string) error {
	if h.cp.readersOwnAudience {
		adminToken = h.creds.readerToken
	}
	if adminToken == "" {
		return errors.New("the admin kubeconfig has no bearer token for the harness's ListNodes calls")
	}
	t0 := time.Now()
	ca, err := waitCA(ctx, h.css[0], h.o.PhaseTimeout, h.creds.caFile)
	if err != nil {
		return err
	}
	h.res.Identities.CAPublished = time.Since(t0)
	return h.cp.connect(ca, adminToken)
}

// agentArgs are the agents' process's flags for c: none in plaintext.
func (c *agentCredentials) agentArgs() []string {
	if c == nil {
		return nil
	}
	return []string{"--ca-file=" + c.caFile, "--server-name=" + serverName, "--token-file=" + c.tokenFile}
}

// reviewCounts are the TokenReviews and SubjectAccessReviews the API
// server has answered, by its apiserver_request_total: the control plane
// reports none of its own.
type reviewCounts struct {
	Token  uint64 `json:"token"`
	Access uint64 `json:"access"`
}

func (a reviewCounts) sub(b reviewCounts) reviewCounts {
	return reviewCounts{Token: a.Token - b.Token, Access: a.Access - b.Access}
}

// reviews scrapes the API server's counts of reviews created; nil
// outside --secure, where the control plane asks for none.
func (h *harness) reviews(ctx context.Context) (*reviewCounts, error) {
	if !h.o.Secure {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	body, err := h.css[0].CoreV1().RESTClient().Get().AbsPath("/metrics").SetHeader("Accept", "text/plain").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scraping the API server's metrics: %w", err)
	}
	var c reviewCounts
	for line := range strings.SplitSeq(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok || !strings.Contains(labels, `verb="POST"`) {
			continue
		}
		var n float64
		if _, err := fmt.Sscan(value, &n); err != nil {
			return nil, fmt.Errorf("parsing %q: %w", line, err)
		}
		switch {
		case strings.Contains(labels, `resource="tokenreviews"`):
			c.Token += uint64(n)
		case strings.Contains(labels, `resource="subjectaccessreviews"`):
			c.Access += uint64(n)
		}
	}
	return &c, nil
}

// reviewsSince returns the reviews since before (nil outside --secure).
func (h *harness) reviewsSince(ctx context.Context, before *reviewCounts) (*reviewCounts, error) {
	now, err := h.reviews(ctx)
	if err != nil || now == nil {
		return nil, err
	}
	d := now.sub(*before)
	return &d, nil
}
