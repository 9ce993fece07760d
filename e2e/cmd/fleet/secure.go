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

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
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

// agentCredentials are the files the agents' process reads.
type agentCredentials struct {
	caFile, tokenFile string
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

	t0 := time.Now()
	// A token is bound to its Pod by name and UID.
	uids := make([]types.UID, nodes)
	if err := parallel(ctx, workers, nodes, func(ctx context.Context, worker, i int) error {
		p, err := css[worker%len(css)].CoreV1().Pods(secureNamespace).Create(ctx, agentPod(i), metav1.CreateOptions{})
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
	return err
}

// connectSecure waits for the CA bundle of the control plane just
// started, and connects the harness's own client with it and a reader's
// token: the admin's, which the control plane reviews like any reader's.
func (h *harness) connectSecure(ctx context.Context, adminToken string) error {
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
