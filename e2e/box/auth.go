package box

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Names of what the box creates for authentication, besides deploy/.
const (
	// DebugServiceAccount is the identity the box's own clients (ListNodes,
	// WatchTable, grpcurl) use: a ServiceAccount in deploy/'s namespace
	// with a ClusterRole that may list EndpointSlices, which is what the
	// control plane's SubjectAccessReview asks of a debug caller. Its
	// token is for the control plane's audience, as an operator gets one
	// with `kubectl create token <sa> --audience proxyplane`: the control
	// plane refuses tokens for the API server's own.
	DebugServiceAccount = "proxyplane-e2e-debug"
	// kubeletPeriod is how often the box, playing the kubelet, refreshes
	// the agents' mounted CA bundle and tokens. The kubelet takes up to a
	// minute for a ConfigMap; a second keeps tests quick.
	kubeletPeriod = time.Second
	// tokenRenewAt is the fraction of a projected token's lifetime after
	// which the kubelet replaces it.
	tokenRenewAt = 0.8
)

// ClientCredentials are what a client of the control plane presents: the
// CA bundle it verifies the server with, the name it expects, and a
// bearer token. The box's own clients use Box.Credentials; scenarios vary
// them to be refused.
type ClientCredentials struct {
	// Insecure dials in plaintext; the token is then not sent.
	Insecure bool
	// CAFile is the PEM bundle the server must chain to, read at each
	// dial (the control plane may renew its CA).
	CAFile string
	// CAPEM, when set, is used instead of CAFile.
	CAPEM []byte
	// ServerName is the name the serving certificate must carry.
	ServerName string
	// Token is sent as "authorization: Bearer <Token>" when not empty.
	Token string
}

// DialOptions returns the transport and per-RPC credentials.
func (c ClientCredentials) DialOptions() ([]grpc.DialOption, error) {
	if c.Insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	ca := c.CAPEM
	if ca == nil {
		var err error
		if ca, err = os.ReadFile(c.CAFile); err != nil {
			return nil, fmt.Errorf("reading the control plane's CA bundle: %w", err)
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("the CA bundle holds no PEM certificate")
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: c.ServerName, MinVersion: tls.VersionTLS12,
	}))}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(c.Token)))
	}
	return opts, nil
}

// bearer sends a token with every RPC, over TLS only.
type bearer string

// GetRequestMetadata returns the authorization header.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is true: a token is never sent in plaintext.
func (bearer) RequireTransportSecurity() bool { return true }

// Credentials returns the box's own client credentials: the published CA
// bundle, the control plane's name, and DebugServiceAccount's token.
func (b *Box) Credentials() ClientCredentials {
	return ClientCredentials{Insecure: b.opts.Insecure, CAFile: b.caFile, ServerName: b.serverName, Token: b.debugToken}
}

// CAFile returns where the box keeps the control plane's CA bundle, as
// last published in ConfigMap proxyplane-ca.
func (b *Box) CAFile() string { return b.caFile }

// ServerName returns the name the control plane's certificate carries
// and clients verify: proxyplane-controlplane.<namespace>.svc.
func (b *Box) ServerName() string { return b.serverName }

// DebugTokenFile returns the file holding DebugServiceAccount's token.
func (b *Box) DebugTokenFile() string { return b.debugTokenFile }

// GRPCurlArgs returns grpcurl's flags for the box's credentials, to run
// grpcurl directly (no shell).
func (b *Box) GRPCurlArgs() []string {
	if b.opts.Insecure {
		return []string{"-plaintext"}
	}
	return []string{"-cacert", b.caFile, "-authority", b.serverName, "-H", "authorization: Bearer " + b.debugToken}
}

// GRPCurlShellArgs returns the same flags for a person to paste into a
// shell: the token is read from its file when the command runs.
func (b *Box) GRPCurlShellArgs() string {
	if b.opts.Insecure {
		return "-plaintext"
	}
	return fmt.Sprintf(`-cacert %s -authority %s -H "authorization: Bearer $(cat %s)"`, b.caFile, b.serverName, b.debugTokenFile)
}

// setUpDebugIdentity creates DebugServiceAccount, a ClusterRole that may
// list EndpointSlices and its binding, and writes a token for it (the
// control plane's audience, the agents' token audience, as `kubectl create
// token --audience` gives), waiting until RBAC admits it.
func (b *Box) setUpDebugIdentity(ctx context.Context) error {
	ns := b.deploy.Namespace
	labels := map[string]string{"app.kubernetes.io/managed-by": FieldManager}
	if _, err := b.admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: DebugServiceAccount, Labels: labels},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating ServiceAccount %s: %w", DebugServiceAccount, err)
	}
	if _, err := b.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: DebugServiceAccount, Labels: labels},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating ClusterRole %s: %w", DebugServiceAccount, err)
	}
	if _, err := b.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: DebugServiceAccount, Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: DebugServiceAccount},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: DebugServiceAccount}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating ClusterRoleBinding %s: %w", DebugServiceAccount, err)
	}
	tok, err := b.Token(ctx, types.NamespacedName{Namespace: ns, Name: DebugServiceAccount}, []string{b.deploy.AgentMounts.TokenAudience}, nil, tokenLifetime)
	if err != nil {
		return err
	}
	b.debugToken = tok.Status.Token
	if err := writeAtomic(b.debugTokenFile, []byte(b.debugToken)); err != nil {
		return err
	}
	// The RBAC authorizer learns of the binding through an informer. The
	// token is useless against the API server, so ask it the control
	// plane's own question.
	user := "system:serviceaccount:" + ns + ":" + DebugServiceAccount
	err = Eventually(ctx, func() error {
		r, err := b.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if !r.Status.Allowed {
			return fmt.Errorf("%s may not list EndpointSlices yet", user)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waiting for RBAC to admit %s: %w", DebugServiceAccount, err)
	}
	return nil
}

// Token asks the TokenRequest API for a token of sa: for audiences (nil:
// the API server's own, as `kubectl create token`), bound to pod when it
// is not nil (the token then names the pod's node and dies with the pod),
// valid for seconds (the API server's minimum is 600).
func (b *Box) Token(ctx context.Context, sa types.NamespacedName, audiences []string, pod *corev1.Pod, seconds int64) (*authenticationv1.TokenRequest, error) {
	spec := authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: ptr.To(seconds)}
	if pod != nil {
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := b.admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token for ServiceAccount %s: %w", sa, err)
	}
	return tr, nil
}

// AgentServiceAccount returns the DaemonSet's ServiceAccount.
func (b *Box) AgentServiceAccount() types.NamespacedName {
	return types.NamespacedName{Namespace: b.deploy.Namespace, Name: b.deploy.AgentPod.Spec.ServiceAccountName}
}

// CreateAgentPod creates a Pod named name from the DaemonSet's template
// on node, controlled by the DaemonSet, as the DaemonSet controller would.
// Nothing runs it (it stays Pending): it exists so that tokens can be
// bound to it, as the kubelet binds the projected token to the pod it
// runs, and the control plane accepts an agent token only while its Pod
// is such a Pod.
func (b *Box) CreateAgentPod(ctx context.Context, name, node string) (*corev1.Pod, error) {
	ds, err := b.admin.AppsV1().DaemonSets(b.deploy.Namespace).Get(ctx, nodeagentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading DaemonSet %s/%s: %w", b.deploy.Namespace, nodeagentDaemonSet, err)
	}
	pod := b.AgentPodObject(name, node)
	pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}
	created, err := b.admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, fmt.Errorf("creating Pod %s/%s on %s: %w", pod.Namespace, name, node, err)
	}
	return created, nil
}

// AgentPodObject returns, without creating it, a Pod named name on node
// made from the DaemonSet's template, without an owner: CreateAgentPod
// adds the DaemonSet's, and scenarios make it a Pod the DaemonSet does
// not control.
func (b *Box) AgentPodObject(name, node string) *corev1.Pod {
	tmpl := b.deploy.AgentPod.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.deploy.Namespace, Labels: tmpl.Labels, Annotations: tmpl.Annotations},
		Spec:       tmpl.Spec,
	}
	pod.Spec.NodeName = node
	return pod
}

// AgentToken returns a token for pod as the kubelet projects it for the
// agent: the DaemonSet's ServiceAccount, audience and lifetime, bound to
// pod.
func (b *Box) AgentToken(ctx context.Context, pod *corev1.Pod) (*authenticationv1.TokenRequest, error) {
	m := b.deploy.AgentMounts
	return b.Token(ctx, b.AgentServiceAccount(), []string{m.TokenAudience}, pod, m.TokenExpirationSeconds)
}

// DeletePod deletes pod at once (grace 0): no kubelet runs to confirm a
// graceful deletion, which would otherwise wait forever.
func (b *Box) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	err := b.admin.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// kubelet is the part of the kubelet the box plays for each agent: it
// keeps the projected token and the CA bundle ConfigMap written where the
// agent's flags point, renewing the token at 80% of its life and
// rewriting the bundle when the ConfigMap changes, each file replaced
// atomically.
type kubelet struct {
	b *Box
	// mu guards every field below, and serialises syncs.
	mu sync.Mutex
	// renew is when each agent's token is due for renewal, by node.
	renew map[string]time.Time
	// written is the bundle last written to each file.
	written map[string]string
	// held are the nodes whose mounts a scenario has taken away.
	held map[string]bool
	// failing is set while syncs fail, so that an API server outage is
	// logged once, not every second.
	failing bool
}

// UnmountCredentials deletes a's token and CA bundle and stops the box's
// kubelet from writing them, as on a node where the volumes are not
// there yet; MountCredentials gives them back.
func (b *Box) UnmountCredentials(a *Agent) error {
	if b.kubelet == nil {
		return errors.New("the box runs without credentials (Options.Insecure)")
	}
	k := b.kubelet
	k.mu.Lock()
	defer k.mu.Unlock()
	k.held[a.Node.Name()] = true
	for _, f := range []string{a.TokenFile, a.CAFile} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("deleting %s: %w", f, err)
		}
		delete(k.written, f)
	}
	delete(k.renew, a.Node.Name())
	return nil
}

// MountCredentials writes a's token and CA bundle again, at once, and
// lets the box's kubelet keep them current.
func (b *Box) MountCredentials(ctx context.Context, a *Agent) error {
	if b.kubelet == nil {
		return errors.New("the box runs without credentials (Options.Insecure)")
	}
	b.kubelet.mu.Lock()
	delete(b.kubelet.held, a.Node.Name())
	b.kubelet.mu.Unlock()
	return b.SyncMounts(ctx)
}

// SyncMounts writes, now, what the kubelet would: tokens due for renewal
// and the current CA bundle, if published. The box also does this every
// second in the background.
func (b *Box) SyncMounts(ctx context.Context) error {
	if b.opts.Insecure || b.kubelet == nil {
		return nil
	}
	return b.kubelet.sync(ctx)
}

func (k *kubelet) sync(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.b
	now := time.Now()
	for _, a := range b.Agents {
		if k.held[a.Node.Name()] || now.Before(k.renew[a.Node.Name()]) {
			continue
		}
		tr, err := b.AgentToken(ctx, a.Pod)
		if err != nil {
			return err
		}
		if err := writeAtomic(a.TokenFile, []byte(tr.Status.Token)); err != nil {
			return err
		}
		life := tr.Status.ExpirationTimestamp.Sub(now)
		k.renew[a.Node.Name()] = now.Add(time.Duration(float64(life) * tokenRenewAt))
	}
	m := b.deploy.AgentMounts
	cm, err := b.admin.CoreV1().ConfigMaps(b.deploy.Namespace).Get(ctx, m.CAConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil // optional: the mount stays empty until it is published
	}
	if err != nil {
		return fmt.Errorf("reading ConfigMap %s: %w", m.CAConfigMap, err)
	}
	ca, ok := cm.Data[m.CAKey]
	if !ok {
		return nil
	}
	files := []string{b.caFile}
	for _, a := range b.Agents {
		if !k.held[a.Node.Name()] {
			files = append(files, a.CAFile)
		}
	}
	for _, f := range files {
		if k.written[f] == ca {
			continue
		}
		if err := writeAtomic(f, []byte(ca)); err != nil {
			return err
		}
		k.written[f] = ca
	}
	return nil
}

// run syncs every kubeletPeriod until ctx ends, logging a failure when
// syncs start failing and again when they recover.
func (k *kubelet) run(ctx context.Context) {
	tick := time.NewTicker(kubeletPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := k.sync(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && !k.failing:
			k.b.tb.Logf("box kubelet: refreshing the agents' tokens and CA bundle: %v (retrying every %s)", err, kubeletPeriod)
		case err == nil && k.failing:
			k.b.tb.Logf("box kubelet: tokens and CA bundle refreshed again")
		}
		k.failing = err != nil
	}
}

// waitCA waits until the CA bundle has been published and written.
func (b *Box) waitCA(ctx context.Context) error {
	err := Eventually(ctx, func() error {
		if err := b.SyncMounts(ctx); err != nil {
			return err
		}
		if _, err := os.Stat(b.caFile); err != nil {
			return fmt.Errorf("ConfigMap %s not published yet: %w", b.deploy.AgentMounts.CAConfigMap, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the control plane's CA bundle: %w", err)
	}
	return nil
}

// writeAtomic replaces path's content so that a reader sees the old file
// or the new one, never a part: a new file renamed over the old, as the
// kubelet's atomic writer swaps a symlink.
func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return nil
}

// hostPath maps a path in the agent's container to its place in the
// node's directory of the box: the nodes share this machine's filesystem,
// so each node's mounts live under a directory of its own (not its state
// directory, which scenarios delete).
func hostPath(nodeDir, containerPath string) string {
	return filepath.Join(nodeDir, strings.TrimPrefix(containerPath, "/"))
}
