package box

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyplane/proxyplane/e2e/internal/kubeproxy"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/config"
)

// kube-proxy's identity, as kubeadm sets it up: a ServiceAccount bound to
// the API server's bootstrap ClusterRole system:node-proxier, which may
// list and watch Services, EndpointSlices and Nodes and write Events.
const (
	kubeProxyNamespace      = metav1.NamespaceSystem
	kubeProxyServiceAccount = "kube-proxy"
	kubeProxyClusterRole    = "system:node-proxier"
	kubeProxyBinding        = "proxyplane-e2e:kube-proxy"
)

// KubeProxy is upstream kube-proxy in a node's namespace, run as kubeadm's
// DaemonSet runs it (iptables mode unless SetMode says otherwise, a
// ServiceAccount token bound to system:node-proxier, --hostname-override
// naming the node) with the settings the node's agent has
// (--cluster-cidr, --detect-local-mode, the masquerade bit), so that both
// program the same Services alike. It
// serves kube-proxy's ports, /healthz on 10256 and /metrics on
// 127.0.0.1:10249, the agent's too: whichever binds first holds them.
type KubeProxy struct {
	*Process
	// Node is the node it runs on.
	Node *nstest.Node
	// Binary is the kube-proxy executable.
	Binary string

	tp  *nstest.Topology
	cfg kubeproxy.Config
}

// KubeProxyBinary returns the path of upstream kube-proxy in the box's
// binary directory (`make kube-proxy` builds it), or an error saying how
// to build it.
func (b *Box) KubeProxyBinary() (string, error) {
	p := filepath.Join(b.opts.BinDir, "kube-proxy")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("upstream kube-proxy is not built (%w): run `make kube-proxy`, or `make e2e`", err)
	}
	return p, nil
}

// KubeProxy returns node k's kube-proxy, stopped, creating it on first
// use: its ServiceAccount and binding, its kubeconfig, and a relay in the
// node's namespace from the API server's address (127.0.0.1, in host-0)
// to the API server, since the node cannot reach host-0's loopback. The
// box stops it, and the relay, on Close.
func (b *Box) KubeProxy(ctx context.Context, k int) (*KubeProxy, error) {
	if kp := b.kubeProxies[k]; kp != nil {
		return kp, nil
	}
	bin, err := b.KubeProxyBinary()
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(b.dir, "kube-proxy.kubeconfig")
	if err := b.kubeProxyIdentity(ctx, kubeconfig); err != nil {
		return nil, err
	}
	n := b.tp.Node(k)
	if err := b.reportAddresses(ctx, n); err != nil {
		return nil, err
	}
	if err := b.relayAPIServer(ctx, n.NS()); err != nil {
		return nil, err
	}
	agent, err := agentProxy(b.Agents[k].Args())
	if err != nil {
		return nil, fmt.Errorf("reading node %s's agent settings: %w", n.Name(), err)
	}
	cfg := kubeproxy.Config{
		Binary:          bin,
		Mode:            "iptables",
		Kubeconfig:      kubeconfig,
		NodeName:        n.Name(),
		ClusterCIDR:     strings.Join(agent.ClusterCIDRs, ","),
		DetectLocalMode: agent.DetectLocalMode,
		MasqueradeBit:   agent.MasqueradeBit,
		Extra:           []string{"--v=2"},
	}
	name := "kube-proxy-" + n.Name()
	kp := &KubeProxy{
		Process: newProcess(name, n.NS(), filepath.Join(b.dir, "logs", name+".log"), cfg.Args(), nil),
		Node:    n, Binary: bin, tp: b.tp, cfg: cfg,
	}
	if b.kubeProxies == nil {
		b.kubeProxies = map[int]*KubeProxy{}
	}
	b.kubeProxies[k] = kp
	return kp, nil
}

// kubeProxyIdentity creates kube-proxy's ServiceAccount and binding (once),
// writes a kubeconfig with a token of it to path, and waits until RBAC
// lets it list what kube-proxy watches.
func (b *Box) kubeProxyIdentity(ctx context.Context, path string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: kubeProxyNamespace, Name: kubeProxyServiceAccount}}
	if _, err := b.admin.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{FieldManager: FieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating kube-proxy's ServiceAccount: %w", err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: kubeProxyBinding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: kubeProxyClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
	}
	if _, err := b.admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{FieldManager: FieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding kube-proxy to %s: %w", kubeProxyClusterRole, err)
	}
	if err := serviceAccountKubeconfig(ctx, b.admin, types.NamespacedName{Namespace: sa.Namespace, Name: sa.Name}, b.api.URL(), b.api.Info().CAFile, path); err != nil {
		return err
	}
	rc, err := restConfigFrom(path)
	if err != nil {
		return err
	}
	if err := waitCanList(ctx, inNamespace(rc, b.tp, b.HostNS())); err != nil {
		return fmt.Errorf("waiting for RBAC to admit kube-proxy's ServiceAccount: %w", err)
	}
	return nil
}

// reportAddresses writes n's addresses into its Node's status, as the
// kubelet does: kube-proxy waits up to 30 s for them before it programs
// anything.
func (b *Box) reportAddresses(ctx context.Context, n *nstest.Node) error {
	node, err := b.admin.CoreV1().Nodes().Get(ctx, n.Name(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading Node %s: %w", n.Name(), err)
	}
	if len(node.Status.Addresses) > 0 {
		return nil
	}
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.IP().String()},
		{Type: corev1.NodeInternalIP, Address: n.IPv6().String()},
		{Type: corev1.NodeHostName, Address: n.Name()},
	}
	if _, err := b.admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("reporting Node %s's addresses: %w", n.Name(), err)
	}
	return nil
}

// relayAPIServer listens on the API server's address inside ns and relays
// to the API server in host-0, until Close.
func (b *Box) relayAPIServer(ctx context.Context, ns string) error {
	u, err := url.Parse(b.api.URL())
	if err != nil {
		return fmt.Errorf("parsing the API server's URL: %w", err)
	}
	return b.relay(ctx, ns, u.Host)
}

// relay listens on addr inside ns and relays to the API server in host-0,
// until Close.
func (b *Box) relay(ctx context.Context, ns, addr string) error {
	var ln net.Listener
	if err := b.tp.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return fmt.Errorf("relaying the API server to %s in %s: %w", addr, b.label(ns), err)
	}
	return b.relayFrom(ctx, ln)
}

// relayFrom relays every connection ln accepts to the API server in
// host-0, until Close.
func (b *Box) relayFrom(ctx context.Context, ln net.Listener) error {
	u, err := url.Parse(b.api.URL())
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("parsing the API server's URL: %w", err)
	}
	// The relay lives as long as the box, not as ctx.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); kubeproxy.Relay(rctx, ln, dialIn(b.tp, b.HostNS()), u.Host) }()
	b.relays = append(b.relays, func() { cancel(); <-done })
	return nil
}

// SetMode sets kube-proxy's --proxy-mode (iptables or nftables) for its
// next start, as an operator edits `mode` in kube-proxy's ConfigMap; the
// rest of its command line stays. kube-proxy must be stopped.
func (kp *KubeProxy) SetMode(mode string) error {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.cmd != nil {
		select {
		case <-kp.exited:
		default:
			return fmt.Errorf("setting %s's mode to %s: it is running", kp.name, mode)
		}
	}
	kp.cfg.Mode = mode
	kp.argv = kp.cfg.Args()
	return nil
}

// Metrics scrapes 127.0.0.1:10249 in the node: kube-proxy's metrics when
// it holds the port, the agent's when the agent does.
func (kp *KubeProxy) Metrics(ctx context.Context) (Metrics, error) {
	return scrape(ctx, kp.tp, kp.Node.NS(), "http://127.0.0.1:10249/metrics")
}

// Synced returns nil once kube-proxy serves its metrics on 10249 and they
// show a full sync of the rules done (the last-sync timestamp set); an
// error says what is missing. Another process's metrics on the port (the
// agent's) are an error.
func (kp *KubeProxy) Synced(ctx context.Context) error {
	m, err := kp.Metrics(ctx)
	if err != nil {
		return err
	}
	if m["proxyplane_agent_connected"] != nil {
		return errors.New("127.0.0.1:10249 serves the proxyplane agent's metrics, not kube-proxy's")
	}
	if m.Value("kubeproxy_sync_proxy_rules_last_timestamp_seconds") == 0 {
		return errors.New("kube-proxy has not synced its rules yet")
	}
	return nil
}

// WaitSynced waits until Synced, failing early if kube-proxy exits.
func (kp *KubeProxy) WaitSynced(ctx context.Context) error {
	return waitProcess(ctx, kp.Process, func() error { return kp.Synced(ctx) })
}

// Cleanup runs `kube-proxy --cleanup` in the node, as an operator leaving
// kube-proxy does once it is stopped: it removes kube-proxy's rules in
// every mode and family (iptables, IPVS where the kernel has it,
// nftables) and exits. It returns the command's output.
func (kp *KubeProxy) Cleanup() ([]byte, error) {
	out, err := kp.tp.Exec(kp.Node.NS(), kp.Binary, "--cleanup", "--v=2")
	if err != nil {
		return out, fmt.Errorf("kube-proxy --cleanup in %s: %w", kp.Node.Name(), err)
	}
	return out, nil
}

// agentProxy returns the proxy settings of an agent started with args:
// its --config file's, which win over the flags they cover (as
// kube-proxy's do), read by the agent's own code; without one, its flags.
func agentProxy(args []string) (config.Proxy, error) {
	if path := flagValue(args, "--config"); path != "" {
		f, err := config.Load(path)
		if err != nil {
			return config.Proxy{}, err
		}
		return f.Proxy, nil
	}
	p := config.DefaultProxy()
	p.DetectLocalMode = cmp.Or(flagValue(args, "--detect-local-mode"), p.DetectLocalMode)
	if v := flagValue(args, "--cluster-cidr"); v != "" {
		p.ClusterCIDRs = strings.Split(v, ",")
	}
	if v := flagValue(args, "--masquerade-bit"); v != "" {
		bit, err := strconv.Atoi(v)
		if err != nil {
			return config.Proxy{}, fmt.Errorf("--masquerade-bit %q: %w", v, err)
		}
		p.MasqueradeBit = bit
	}
	return p, nil
}

// flagValue returns the value of the last --name=value in args, or "".
func flagValue(args []string, name string) string {
	v := ""
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, name+"="); ok {
			v = rest
		}
	}
	return v
}
