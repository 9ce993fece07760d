package box

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/box/node"
)

const (
	// apiServerPort is where the box's API server is reached from the
	// nodes, kubeadm's port: on host-0's LAN address (the kubelets'
	// endpoint, as a load balancer in front of the API servers) and on
	// each control-plane node's address, where deploy/'s control plane
	// dials its own node's kube-apiserver.
	apiServerPort = 6443
	// clusterCIDR is node IPAM's range (kube-controller-manager
	// --cluster-cidr); each node gets a /24 of it.
	clusterCIDR = "10.246.0.0/16"
	// controlPlaneRole is the label kubeadm puts on control-plane nodes,
	// which deploy/'s Deployment requires.
	controlPlaneRole = "node-role.kubernetes.io/control-plane"
	kcmUser          = "system:kube-controller-manager"
	schedulerUser    = "system:kube-scheduler"
	// imageRegistry and imageTag name `make images`' images, as deploy/
	// does.
	imageRegistry = "ghcr.io/proxyplane"
	imageTag      = "dev"
)

// image returns the full name of one of `make images`' images.
func image(name string) string { return imageRegistry + "/" + name + ":" + imageTag }

// kubeletParts are what a box on real nodes runs beside the API server.
type kubeletParts struct {
	nodes      []*node.Node // by node index
	kcm, sched *Process
	// images holds `make images`' archives.
	images string
	// tokens are the static tokens of the nodes and the controllers, by
	// user.
	tokens map[string]string
	// servingCA is the API server's serving certificate chain, which the
	// kubelets and (through kube-root-ca.crt) every pod trust.
	servingCA []byte
	// kubeletClientCA signed the API server's client certificate for the
	// kubelets, which trust it.
	kubeletClientCA []byte
}

// kubeletRequirements skips tb unless a box on real nodes can start:
// upstream's node binaries, `make images`' archives and the OS packages.
func kubeletRequirements(tb TB, opts Options) {
	tb.Helper()
	for _, b := range []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kubectl"} {
		if !fileExists(filepath.Join(opts.BinDir, b)) {
			tb.Skip(fmt.Sprintf("%s is not built: run `make kube-node-bins`, or `make e2e`", b))
		}
	}
	for _, img := range []string{"pause", "e2e-backend", "controlplane", "nodeagent"} {
		if !fileExists(filepath.Join(opts.BinDir, "images", img+".tar")) {
			tb.Skip(fmt.Sprintf("the %s image is not built: run `make images`, or `make e2e`", img))
		}
	}
	for _, c := range []string{"containerd", "ctr", "runc", "nsenter", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/lib/cni/portmap"} {
		if _, err := exec.LookPath(c); err != nil {
			tb.Skip(fmt.Sprintf("needs %s: run hack/install-node-deps.sh (as root), or `make e2e`", c))
		}
	}
}

// seedAPIServer writes, before the API server's first start, the static
// tokens of every identity the box's real nodes need (e2e-apiserver
// keeps a token file it finds, and reads every record of it), and a
// serving certificate naming every address the API server is reached
// at. It returns the API server flags that use the certificate.
func (b *Box) seedAPIServer(apiDir string) ([]string, error) {
	if err := os.MkdirAll(apiDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", apiDir, err)
	}
	k := &kubeletParts{tokens: map[string]string{}, images: filepath.Join(b.opts.BinDir, "images")}
	b.nodes = k
	lines := []string{
		randomToken() + ",admin,e2e-admin,system:masters",
		randomToken() + ",proxyplane-controlplane,e2e-proxyplane-controlplane",
	}
	for _, u := range []string{kcmUser, schedulerUser} {
		k.tokens[u] = randomToken()
		lines = append(lines, k.tokens[u]+","+u+",e2e-"+strings.ReplaceAll(u, ":", "-"))
	}
	for i := range b.opts.Nodes {
		name := b.tp.Node(i).Name()
		k.tokens[name] = randomToken()
		lines = append(lines, node.TokenRecord(k.tokens[name], name))
	}
	if err := os.WriteFile(filepath.Join(apiDir, "tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("writing the API server's tokens: %w", err)
	}
	// kube-apiserver's own self-signed certificate names only its
	// advertise address (127.0.0.1 here) and the kubernetes Service.
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1"), b.tp.HostIP(0).AsSlice()}
	for k := range b.opts.Nodes {
		ips = append(ips, b.tp.Node(k).IP().AsSlice())
	}
	cert, key, err := certutil.GenerateSelfSignedCertKey("kubernetes", ips,
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"})
	if err != nil {
		return nil, fmt.Errorf("generating the API server's serving certificate: %w", err)
	}
	k.servingCA = cert
	// The API server's client certificate for the kubelets (logs, exec),
	// in system:masters as kubeadm's, from a CA the kubelets trust.
	clientCA, clientCert, clientKey, err := kubeletClientCert()
	if err != nil {
		return nil, err
	}
	k.kubeletClientCA = clientCA
	files := map[string][]byte{
		"serving.crt": cert, "serving.key": key,
		"kubelet-client.crt": clientCert, "kubelet-client.key": clientKey,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(apiDir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("writing the API server's %s: %w", name, err)
		}
	}
	return []string{
		"--tls-cert-file=" + filepath.Join(apiDir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(apiDir, "serving.key"),
		"--kubelet-client-certificate=" + filepath.Join(apiDir, "kubelet-client.crt"),
		"--kubelet-client-key=" + filepath.Join(apiDir, "kubelet-client.key"),
		// The nodes' names resolve nowhere; their addresses are what
		// they report.
		"--kubelet-preferred-address-types=InternalIP",
	}, nil
}

// kubeletClientCert returns a new CA and a client certificate and key it
// signed, for user kube-apiserver-kubelet-client in group
// system:masters, PEM-encoded.
func kubeletClientCert() (ca, cert, key []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generating the kubelet client CA's key: %w", err)
	}
	caCert, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "box-kubelet-client-ca"}, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("making the kubelet client CA: %w", err)
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generating the kubelet client key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &clientKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("signing the kubelet client certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encoding the kubelet client key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// startOnKubelets is Start's second half for Options.Kubelets: deploy/
// is applied as it is, and the Deployment, DaemonSet, ReplicaSet,
// EndpointSlice and ServiceAccount controllers, the scheduler and each
// node's kubelet make and run the pods, from the images `make images`
// built.
func (b *Box) startOnKubelets(ctx context.Context, config map[string]string) error {
	k := b.nodes
	host := b.tp.HostNS(0)
	began := time.Now()
	if err := node.EnsureRBAC(ctx, b.admin); err != nil {
		return err
	}
	var addrs []string
	for i := range b.opts.Replicas {
		addrs = append(addrs, net.JoinHostPort(b.tp.Node(i).IP().String(), strconv.Itoa(firstGRPCPort)))
	}
	config["CONTROL_PLANE_ADDRESSES"] = strings.Join(addrs, ",")
	for key, v := range b.opts.Config {
		config[key] = v
	}
	var err error
	if b.deploy, err = renderDeploy(b.opts.DeployDir, filepath.Join(b.dir, "overlay"), config); err != nil {
		return err
	}
	// As deploy/README.md tells operators, with upstream's kubectl (its
	// own kustomize), strict validation and the box's field manager.
	apply := exec.CommandContext(ctx, "ip", "netns", "exec", host, filepath.Join(b.opts.BinDir, "kubectl"),
		"--kubeconfig="+b.api.AdminKubeconfig(), "apply", "--server-side", "--validate=strict",
		"--field-manager="+FieldManager, "-k", b.deploy.OverlayDir)
	if out, err := apply.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply --server-side -k %s: %w: %s", b.deploy.OverlayDir, err, out)
	}
	b.serverName = "proxyplane-controlplane." + b.deploy.Namespace + ".svc"
	if _, err := b.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", Namespace, err)
	}

	// kube-apiserver listens on host-0's loopback; the nodes reach it on
	// host-0's LAN address, and each control-plane node on its own, as
	// kubeadm's static pods serve it.
	if err := b.relay(ctx, host, netip.AddrPortFrom(b.tp.HostIP(0), apiServerPort).String()); err != nil {
		return err
	}
	for i := range b.opts.Replicas {
		if err := b.relay(ctx, b.tp.Node(i).NS(), netip.AddrPortFrom(b.tp.Node(i).IP(), apiServerPort).String()); err != nil {
			return err
		}
	}
	if err := b.startControllers(ctx); err != nil {
		return err
	}

	k.nodes = make([]*node.Node, b.opts.Nodes)
	errs := make([]error, b.opts.Nodes)
	var wg sync.WaitGroup
	for i := range b.opts.Nodes {
		n := b.tp.Node(i)
		b.zones[n.Name()] = zoneName(i)
		wg.Go(func() {
			k.nodes[i], errs[i] = node.Start(ctx, node.Config{
				Name:         n.Name(),
				NetNS:        n.NS(),
				Dir:          filepath.Join(b.dir, "nodes", n.Name()),
				NodeIP:       n.IP(),
				Labels:       map[string]string{corev1.LabelTopologyZone: zoneName(i)},
				APIServerURL: "https://" + netip.AddrPortFrom(b.tp.HostIP(0), apiServerPort).String(),
				APIServerCA:  k.servingCA,
				ClientCA:     k.kubeletClientCA,
				Token:        k.tokens[n.Name()],
				Kubelet:      filepath.Join(b.opts.BinDir, "kubelet"),
				PauseImage:   image("pause"),
				Images:       k.archives(),
				Client:       b.admin,
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.tb.Logf("box: %d nodes Ready %s after the API server", len(k.nodes), time.Since(began).Round(time.Millisecond))
	if err := b.routePods(ctx); err != nil {
		return err
	}
	// The hardest fresh install, every time: each agent running, with an
	// empty cache and no table, before any replica can be scheduled.
	if err := b.waitAgentsRunning(ctx); err != nil {
		return err
	}
	// The kubelet may not give its Node a node-role label: an admin (or
	// kubeadm) does.
	for i := range b.opts.Replicas {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:""}}}`, controlPlaneRole)
		if _, err := b.admin.CoreV1().Nodes().Patch(ctx, b.tp.Node(i).Name(), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("labelling %s a control-plane node: %w", b.tp.Node(i).Name(), err)
		}
	}

	for i := range b.opts.Replicas {
		n := b.tp.Node(i)
		name := "controlplane-" + strconv.Itoa(i)
		c := &ControlPlane{
			Process: newProcess(name, n.NS(), "", nil, nil),
			Index:   i, GRPCPort: firstGRPCPort, MetricsPort: firstGRPCPort + 1, MetricsHTTPS: true,
			tp: b.tp, ns: n.NS(), ip: n.IP().String(), creds: b.Credentials,
		}
		c.onNode = func() bool { return b.replicaReady(n.Name()) } //nolint:contextcheck // Running takes no context; replicaReady bounds its own call
		// Below the replicas' default --peer-rate and --peer-burst (2 a
		// second, 20), with room for an operator's grpcurl.
		c.paced = rate.NewLimiter(1.5, 10)
		b.ControlPlanes = append(b.ControlPlanes, c)
	}
	for i := range b.opts.Nodes {
		n := b.tp.Node(i)
		b.Agents = append(b.Agents, &Agent{Process: newProcess("nodeagent-"+n.Name(), n.NS(), "", nil, nil), Node: n, tp: b.tp})
	}
	if err := b.WaitWorkloads(ctx); err != nil {
		return err
	}
	b.tb.Logf("box: deploy/'s workloads rolled out %s after the API server", time.Since(began).Round(time.Millisecond))
	// The box's own clients trust the bundle the agents mount.
	b.caFile = filepath.Join(b.dir, "ca.crt")
	b.debugTokenFile = filepath.Join(b.dir, "debug.token")
	cm, err := b.admin.CoreV1().ConfigMaps(b.deploy.Namespace).Get(ctx, b.deploy.AgentMounts.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the control plane's CA bundle: %w", err)
	}
	if err := writeAtomic(b.caFile, []byte(cm.Data[b.deploy.AgentMounts.CAKey])); err != nil {
		return err
	}
	if err := b.setUpDebugIdentity(ctx); err != nil {
		return err
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		return err
	}
	return nil
}

// randomToken returns a static token.
func randomToken() string { return rand.Text() }

// startControllers starts kube-controller-manager and kube-scheduler in
// host-0, as the identities RBAC's default bindings are for.
func (b *Box) startControllers(ctx context.Context) error {
	k := b.nodes
	dir := filepath.Join(b.dir, "controllers")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, k.servingCA, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", caFile, err)
	}
	kubeconfig := func(user string) (string, error) {
		path := filepath.Join(dir, strings.TrimPrefix(user, "system:")+".kubeconfig")
		return path, writeKubeconfig(path, b.api.URL(), k.servingCA, k.tokens[user])
	}
	kcmConfig, err := kubeconfig(kcmUser)
	if err != nil {
		return err
	}
	schedConfig, err := kubeconfig(schedulerUser)
	if err != nil {
		return err
	}
	host := b.tp.HostNS(0)
	k.kcm = newProcess("kube-controller-manager", host, filepath.Join(b.dir, "logs", "kube-controller-manager.log"), []string{
		filepath.Join(b.opts.BinDir, "kube-controller-manager"),
		"--kubeconfig=" + kcmConfig,
		"--leader-elect=false",
		// Each controller with a ServiceAccount of its own, as kubeadm
		// runs it; tokens signed with the API server's key, and the CA
		// published in every namespace's kube-root-ca.crt.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + filepath.Join(b.api.Dir(), "service-account.key"),
		"--root-ca-file=" + caFile,
		"--allocate-node-cidrs=true", "--cluster-cidr=" + clusterCIDR, "--node-cidr-mask-size=24",
		"--secure-port=0",
		// Its default, /usr/libexec/kubernetes/..., would be created on
		// the machine.
		"--flex-volume-plugin-dir=" + filepath.Join(dir, "flexvolume"),
	}, nil)
	k.sched = newProcess("kube-scheduler", host, filepath.Join(b.dir, "logs", "kube-scheduler.log"), []string{
		filepath.Join(b.opts.BinDir, "kube-scheduler"),
		"--kubeconfig=" + schedConfig,
		"--leader-elect=false",
		"--secure-port=0",
	}, nil)
	for _, p := range []*Process{k.kcm, k.sched} {
		if err := p.Start(); err != nil {
			return err
		}
	}
	// The ServiceAccount controller makes every namespace's default
	// ServiceAccount, without which pod admission refuses pods.
	return Eventually(ctx, func() error {
		_, err := b.admin.CoreV1().ServiceAccounts(Namespace).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// writeKubeconfig writes a kubeconfig for a bearer token.
func writeKubeconfig(path, server string, ca []byte, token string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["box"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	kc.AuthInfos["box"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["box"] = &clientcmdapi.Context{Cluster: "box", AuthInfo: "box"}
	kc.CurrentContext = "box"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// routePods routes each node's pod range (as node IPAM assigned it) via
// that node, in every other node, host-0 and the client: the routed pod
// network a cloud's route controller or a CNI would make.
func (b *Box) routePods(ctx context.Context) error {
	for i, n := range b.nodes.nodes {
		via := b.tp.Node(i).IP().String()
		cidr := n.PodCIDR().String()
		nss := []string{b.tp.HostNS(0), b.tp.ClientNS()}
		for j := range b.opts.Nodes {
			if j != i {
				nss = append(nss, b.tp.Node(j).NS())
			}
		}
		for _, ns := range nss {
			if out, err := exec.CommandContext(ctx, "ip", "-n", ns, "route", "replace", cidr, "via", via).CombinedOutput(); err != nil {
				return fmt.Errorf("routing %s via %s in %s: %w: %s", cidr, via, b.label(ns), err, out)
			}
		}
	}
	return nil
}

// waitAgentsRunning waits until the agent container of a DaemonSet pod
// runs on every node.
func (b *Box) waitAgentsRunning(ctx context.Context) error {
	err := Eventually(ctx, func() error {
		pods, err := b.admin.CoreV1().Pods(b.deploy.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + nodeagentDaemonSet})
		if err != nil {
			return err
		}
		running := 0
		for _, p := range pods.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Running != nil {
					running++
				}
			}
		}
		if running != b.opts.Nodes {
			return fmt.Errorf("%d of %d agents running", running, b.opts.Nodes)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the agents to start: %w%s", err, b.podSummary(ctx))
	}
	return nil
}

// replicaReady reports whether a pod of deploy/'s control plane is Ready
// on node.
func (b *Box) replicaReady(nodeName string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := b.admin.CoreV1().Pods(b.deploy.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=" + controlplaneDeployment,
		FieldSelector: "spec.nodeName=" + nodeName,
	})
	if err != nil {
		return false
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && PodReady(&p) {
			return true
		}
	}
	return false
}

// PodReady reports whether pod's Ready condition is true.
func PodReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitWorkloads waits until deploy/'s Deployment and DaemonSet have
// rolled out: every desired pod of the current revision available.
func (b *Box) WaitWorkloads(ctx context.Context) error {
	apps := b.admin.AppsV1()
	ns := b.deploy.Namespace
	err := Eventually(ctx, func() error {
		d, err := apps.Deployments(ns).Get(ctx, controlplaneDeployment, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := deploymentRolledOut(d); err != nil {
			return err
		}
		ds, err := apps.DaemonSets(ns).Get(ctx, nodeagentDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return daemonSetRolledOut(ds)
	})
	if err != nil {
		return fmt.Errorf("waiting for deploy/'s workloads to roll out: %w%s", err, b.podSummary(ctx))
	}
	return nil
}

func deploymentRolledOut(d *appsv1.Deployment) error {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.AvailableReplicas != want || s.Replicas != want {
		return fmt.Errorf("deployment %s: %d of %d updated, %d available, %d in all", d.Name, s.UpdatedReplicas, want, s.AvailableReplicas, s.Replicas)
	}
	return nil
}

func daemonSetRolledOut(ds *appsv1.DaemonSet) error {
	s := ds.Status
	if s.ObservedGeneration < ds.Generation || s.DesiredNumberScheduled == 0 || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
		return fmt.Errorf("daemonset %s: %d of %d updated, %d available", ds.Name, s.UpdatedNumberScheduled, s.DesiredNumberScheduled, s.NumberAvailable)
	}
	return nil
}

// podSummary lists every pod of the box with its phase, node and the
// reason any container is waiting, for errors.
func (b *Box) podSummary(ctx context.Context) string {
	pods, err := b.admin.CoreV1().Pods("").List(context.WithoutCancel(ctx), metav1.ListOptions{})
	if err != nil {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("; pods:")
	for _, p := range pods.Items {
		fmt.Fprintf(&sb, "\n  %s/%s on %q: %s", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&sb, " %s waiting (%s: %s)", cs.Name, w.Reason, w.Message)
			}
			if cs.RestartCount > 0 {
				fmt.Fprintf(&sb, " %s restarted %d times", cs.Name, cs.RestartCount)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				fmt.Fprintf(&sb, " %s: %s", c.Type, c.Message)
			}
		}
	}
	return sb.String()
}

// archives returns the image archives every node imports.
func (k *kubeletParts) archives() []string {
	var out []string
	for _, img := range []string{"pause", "e2e-backend", "controlplane", "nodeagent"} {
		out = append(out, filepath.Join(k.images, img+".tar"))
	}
	return out
}

// Nodes returns the real nodes, by index (nil unless Options.Kubelets).
func (b *Box) Nodes() []*node.Node {
	if b.nodes == nil {
		return nil
	}
	return b.nodes.nodes
}

// closeKubelets stops the nodes (their pods with them), then the
// controllers, and reports anything a node left behind.
func (b *Box) closeKubelets(ctx context.Context) error {
	k := b.nodes
	errs := make([]error, len(k.nodes))
	var wg sync.WaitGroup
	for i, n := range k.nodes {
		if n != nil {
			wg.Go(func() { errs[i] = n.Close(ctx) })
		}
	}
	wg.Wait()
	if k.kcm != nil {
		errs = append(errs, k.kcm.Stop(ctx))
	}
	// Without leader election, kube-scheduler exits 1 on SIGTERM
	// ("finished without leader elect"); it keeps no state to lose.
	if k.sched != nil {
		k.sched.Kill()
	}
	return errors.Join(errs...)
}

// logTails logs the end of the controllers' and kubelets' logs and of
// every container log on the nodes.
func (k *kubeletParts) logTails(tb TB, lines int) {
	for _, p := range []*Process{k.kcm, k.sched} {
		if p != nil {
			tb.Logf("last lines of %s:\n%s", p.LogPath(), p.LogTail(lines))
		}
	}
	for _, n := range k.nodes {
		if n == nil {
			continue
		}
		logs, _ := filepath.Glob(n.HostPath("/var/log/pods/*/*/*.log"))
		for _, path := range append([]string{n.LogPath("kubelet")}, logs...) {
			tb.Logf("last lines of %s:\n%s", path, (&Process{logPath: path}).LogTail(lines))
		}
	}
}

// Memory returns the resident memory, in bytes, of what a box on real
// nodes runs beside the API server, summed over the nodes by component
// (kubelet, containerd, containerd-shim-runc-v2, and "pods", the pods'
// memory cgroups, page cache included), and kube-controller-manager's
// and kube-scheduler's.
func (b *Box) Memory() (map[string]int64, error) {
	if b.nodes == nil {
		return nil, errors.New("box: Memory needs Options.Kubelets")
	}
	total := map[string]int64{}
	for _, n := range b.nodes.nodes {
		m, err := n.Memory()
		if err != nil {
			return nil, err
		}
		for k, v := range m {
			total[k] += v
		}
	}
	for _, p := range []*Process{b.nodes.kcm, b.nodes.sched} {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
		if err != nil {
			return nil, fmt.Errorf("reading %s's memory: %w", p.Name(), err)
		}
		for line := range strings.SplitSeq(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				total[p.Name()] = kb * 1024
			}
		}
	}
	return total, nil
}

// BackendPodSpec is the spec of a pod of the e2e backend image `make
// images` built (e2e/cmd/backend: answering its name on TCP and UDP
// BackendPort and HTTP 8081, ready once it serves), placed on node when
// node is not empty, with args added to its command line.
func BackendPodSpec(node string, args ...string) corev1.PodSpec {
	spec := corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](10),
		Containers: []corev1.Container{{
			Name: "backend", Image: image("e2e-backend"), ImagePullPolicy: corev1.PullNever,
			Args: append([]string{"--drain=2s"}, args...),
			Env:  []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8081)}},
				PeriodSeconds: 1,
			},
		}},
	}
	if node != "" {
		spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	return spec
}

// BackendDeployment is a Deployment of replicas backend pods
// (BackendPodSpec) in Namespace, labelled and selected app=name, placed
// on node when node is not empty.
func BackendDeployment(name string, replicas int32, node string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: BackendPodSpec(node)},
		},
	}
}

// KubeconfigOnLoopback relays a free port on the machine's 127.0.0.1 to
// the API server in host-0, until Close, and writes a kubeconfig for the
// admin there, so that kubectl runs from the machine's own shell. It
// returns the kubeconfig's path.
func (b *Box) KubeconfigOnLoopback(ctx context.Context) (string, error) {
	if b.nodes == nil {
		return "", errors.New("box: KubeconfigOnLoopback needs Options.Kubelets (the API server's certificate must name 127.0.0.1)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listening on loopback for kubectl: %w", err)
	}
	if err := b.relayFrom(ctx, ln); err != nil {
		return "", err
	}
	path := filepath.Join(b.dir, "admin.kubeconfig")
	return path, writeKubeconfig(path, "https://"+ln.Addr().String(), b.nodes.servingCA, b.adminRC.BearerToken)
}
