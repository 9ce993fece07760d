package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Defaults, each bounding a wait that normally takes a fraction of it.
const (
	// DefaultReadyTimeout bounds start to Node Ready: about 2 s on an idle
	// 2-core machine (containerd, image import, kubelet registration),
	// several times that while builds share the cores.
	DefaultReadyTimeout = 2 * time.Minute
	// stopTimeout bounds each process's graceful stop before SIGKILL.
	stopTimeout = 20 * time.Second
	// pollInterval paces the condition polls of Start and Close.
	pollInterval = 100 * time.Millisecond
)

// Config describes one node.
type Config struct {
	// Name is the Node's name (the kubelet's --hostname-override).
	Name string
	// NetNS is the network namespace (`ip netns` name) the node runs in.
	NetNS string
	// Dir holds all of the node's state and logs and is removed by Close.
	// It must be absolute and not under /var/lib, /var/log or /run, which
	// the node's processes see replaced.
	Dir string
	// NodeIP is the node's address in NetNS (the kubelet's --node-ip).
	NodeIP netip.Addr
	// PodCIDR is the range the CNI bridge plugin hands pod addresses
	// from; its first address is the bridge's. It must not overlap
	// anything routed in NetNS. Zero means the Node's spec.podCIDR, as
	// kube-controller-manager's node IPAM assigns it
	// (--allocate-node-cidrs): the CNI configuration is written once it
	// is, and until then the node is not Ready, as in a real cluster.
	PodCIDR netip.Prefix
	// Labels are the Node's labels (the kubelet's --node-labels).
	Labels map[string]string
	// APIServerURL is the API server as seen from inside NetNS.
	APIServerURL string
	// APIServerName, when set, is the name the API server's certificate
	// is checked against, for a URL whose host it does not name.
	APIServerName string
	// APIServerCA is the PEM the API server's certificate must chain to.
	APIServerCA []byte
	// ClientCA, when set, is the PEM of the CA whose client certificates
	// the kubelet's own server accepts: the API server's
	// --kubelet-client-certificate, for logs, exec and port-forward.
	ClientCA []byte
	// Token is the kubelet's bearer token: a user system:node:<Name> in
	// group system:nodes (see TokenRecord).
	Token string
	// Kubelet is the path of the kubelet binary.
	Kubelet string
	// PauseImage is containerd's sandbox image; it must be among Images.
	PauseImage string
	// Images are image archives (docker-archive or OCI tar) imported into
	// containerd's k8s.io namespace before the kubelet starts: no registry
	// is reachable from the box.
	Images []string
	// Client reads the Node object, to wait for it to be Ready.
	Client kubernetes.Interface
	// ReadyTimeout bounds Start; zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if c.Name == "" || c.NetNS == "" || c.Kubelet == "" || c.PauseImage == "" || c.APIServerURL == "" || c.Token == "" {
		errs = append(errs, errors.New("config: Name, NetNS, Kubelet, PauseImage, APIServerURL and Token are required"))
	}
	if c.Client == nil {
		errs = append(errs, errors.New("client is required"))
	}
	if !filepath.IsAbs(c.Dir) {
		errs = append(errs, fmt.Errorf("dir %q must be absolute", c.Dir))
	}
	for _, p := range []string{"/var/lib", "/var/log", "/run"} {
		if c.Dir == p || strings.HasPrefix(c.Dir, p+"/") {
			errs = append(errs, fmt.Errorf("dir %q is under %s, which the node's processes see replaced", c.Dir, p))
		}
	}
	if !c.NodeIP.IsValid() {
		errs = append(errs, errors.New("NodeIP is required"))
	}
	if c.PodCIDR.IsValid() {
		if err := checkPodCIDR(c.PodCIDR); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func checkPodCIDR(p netip.Prefix) error {
	if p != p.Masked() || !p.Addr().Is4() || p.Bits() > 28 {
		return fmt.Errorf("pod CIDR %v must be a masked IPv4 prefix of /28 or wider", p)
	}
	return nil
}

// TokenRecord returns the line of a kube-apiserver --token-auth-file that
// authenticates token as node name's kubelet: user system:node:<name> in
// group system:nodes, the identity a kubelet has in a real cluster, which
// RBAC's system:node ClusterRole is written for (see NodeRBAC).
func TokenRecord(token, name string) string {
	return fmt.Sprintf("%s,system:node:%s,e2e-node-%s,system:nodes", token, name, name)
}

// Node is a running node. Its methods must not be called concurrently.
type Node struct {
	cfg        Config
	host       hostState
	cgroupRoot string

	containerd *exec.Cmd
	kubelet    *exec.Cmd
	// containerdExited and kubeletExited are closed once each process has
	// been reaped.
	containerdExited <-chan struct{}
	kubeletExited    <-chan struct{}
	// mntNS identifies the node's mount namespace (its /proc/PID/ns/mnt
	// link), which containerd, its shims and the kubelet share.
	mntNS string
	// mntNSRef keeps that namespace, and so its identity, alive until
	// Close.
	mntNSRef *os.File
	podCIDR  netip.Prefix
	closed   bool
	// readyCondition is the Node's Ready condition as last seen, for
	// errors.
	readyCondition string
}

// Start starts containerd and the kubelet in cfg.NetNS and returns once
// the Node is Ready. On error everything started is stopped again.
func Start(ctx context.Context, cfg Config) (n *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	host, err := snapshotHost(cfg.NetNS)
	if err != nil {
		return nil, err
	}
	n = &Node{cfg: cfg, host: host, cgroupRoot: "/proxyplane-node-" + cfg.Name, podCIDR: cfg.PodCIDR}
	defer func() {
		if err != nil {
			if cerr := n.Close(context.WithoutCancel(ctx)); cerr != nil {
				err = errors.Join(err, fmt.Errorf("cleaning up after the failed start: %w", cerr))
			}
		}
	}()
	if err := n.writeFiles(); err != nil {
		return n, err
	}
	if err := createCgroups(n.cgroupRoot); err != nil {
		return n, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return n, err
	}
	for _, img := range cfg.Images {
		if out, err := n.ctr(ctx, "images", "import", img); err != nil {
			return n, fmt.Errorf("importing %s into containerd: %w: %s", img, err, out)
		}
	}
	if err := n.startKubelet(); err != nil {
		return n, err
	}
	if !cfg.PodCIDR.IsValid() {
		if err := n.writeCNIFromNode(ctx); err != nil {
			return n, err
		}
	}
	if err := n.waitReady(ctx); err != nil {
		return n, fmt.Errorf("waiting for Node %s to be Ready: %w; last condition: %s (kubelet log %s:\n%s)", cfg.Name, err, n.readyCondition, n.logPath("kubelet"), tail(n.logPath("kubelet"), 20)+"\ncontainerd:\n"+tail(n.logPath("containerd"), 30))
	}
	return n, nil
}

// LogPath returns the log of "kubelet" or "containerd".
func (n *Node) LogPath(component string) string { return n.logPath(component) }

func (n *Node) logPath(component string) string {
	return filepath.Join(n.cfg.Dir, "logs", component+".log")
}

func (n *Node) writeFiles() error {
	d := n.cfg.Dir
	for _, sub := range []string{hostVarLib, hostVarLog, hostRun, hostSysctl, "containerd", "cni", "logs", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o700); err != nil {
			return fmt.Errorf("creating node dir: %w", err)
		}
	}
	// The bind mounts replace world-readable directories: keep them so.
	for _, sub := range []string{"host", hostVarLib, hostVarLog, hostRun} {
		if err := os.Chmod(filepath.Join(d, sub), 0o755); err != nil {
			return fmt.Errorf("setting node dir mode: %w", err)
		}
	}
	files := map[string]string{
		"containerd/config.toml": containerdConfig(d, n.cfg.PauseImage),
		"kubelet/config.yaml":    kubeletConfig(n.cfg, n.cgroupRoot),
	}
	if len(n.cfg.ClientCA) > 0 {
		files["kubelet/client-ca.crt"] = string(n.cfg.ClientCA)
	}
	for name, val := range sysctls {
		files[filepath.Join(hostSysctl, strings.ReplaceAll(name, "/", "."))] = val + "\n"
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(d, name), []byte(content), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	if n.cfg.PodCIDR.IsValid() {
		if err := n.writeCNI(n.cfg.PodCIDR); err != nil {
			return err
		}
	}
	return n.writeKubeconfig()
}

// writeCNI writes the CNI configuration for podCIDR. containerd 1.6
// watches its directory, but a file renamed into it does not make it
// reload (tried: the node stays "cni plugin not initialized"); a write in
// place does. The file is small enough for one write.
func (n *Node) writeCNI(podCIDR netip.Prefix) error {
	conf, err := cniConfig(podCIDR.String(), podCIDR.Addr().Next().String())
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.cfg.Dir, "cni", "10-proxyplane-e2e.conflist"), []byte(conf), 0o600); err != nil {
		return fmt.Errorf("writing the CNI configuration: %w", err)
	}
	return nil
}

// writeCNIFromNode waits for the Node's spec.podCIDR and writes the CNI
// configuration for it, as a real cluster's network plugin does.
func (n *Node) writeCNIFromNode(ctx context.Context) error {
	var cidr netip.Prefix
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		select {
		case <-n.kubeletExited:
			return false, errors.New("the kubelet exited")
		default:
		}
		node, err := n.cfg.Client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil || node.Spec.PodCIDR == "" {
			return false, nil //nolint:nilerr // not registered or not assigned yet: poll on
		}
		p, err := netip.ParsePrefix(node.Spec.PodCIDR)
		if err != nil {
			return false, fmt.Errorf("node %s's pod CIDR: %w", n.cfg.Name, err)
		}
		cidr = p
		return true, checkPodCIDR(p)
	})
	if err != nil {
		return fmt.Errorf("waiting for Node %s's pod CIDR (does kube-controller-manager run with --allocate-node-cidrs?): %w", n.cfg.Name, err)
	}
	n.podCIDR = cidr
	return n.writeCNI(cidr)
}

// PodCIDR returns the range the node's pods get addresses from: Config's,
// or the one assigned to the Node.
func (n *Node) PodCIDR() netip.Prefix { return n.podCIDR }

func (n *Node) writeKubeconfig() error {
	const name = "e2e"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: n.cfg.APIServerURL, CertificateAuthorityData: n.cfg.APIServerCA, TLSServerName: n.cfg.APIServerName}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: n.cfg.Token}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	if err := clientcmd.WriteToFile(*kc, filepath.Join(n.cfg.Dir, "kubelet", "kubeconfig")); err != nil {
		return fmt.Errorf("writing the kubelet's kubeconfig: %w", err)
	}
	return nil
}

// mountScript runs as root inside the node's new mount namespace, before exec'ing containerd: it replaces /var/lib, /var/log and
// /run, and the sysctl files the kubelet writes, with the node's own.
// "$1" is Dir, "$2..." containerd's command line.
const mountScript = `set -e
d=$1; shift
mount --bind "$d/` + hostVarLib + `" /var/lib
mount --bind "$d/` + hostVarLog + `" /var/log
mount --bind "$d/` + hostRun + `" /run
for f in "$d/` + hostSysctl + `"/*; do
  mount --bind "$f" "/proc/sys/$(basename "$f" | tr . /)"
done
exec "$@"
`

func (n *Node) startContainerd(ctx context.Context) error {
	// Not `ip netns exec`: it remounts /sys for the network namespace,
	// which hides the cgroup hierarchies the kubelet needs ("failed to
	// find cgroup mounts"). A mount namespace of its own, a slave of the
	// host's so that nothing mounted in it propagates out, and /sys the
	// host's.
	cmd := exec.Command("nsenter", "--net="+filepath.Join("/run/netns", n.cfg.NetNS), "--",
		"unshare", "--mount", "--propagation", "slave", "--",
		"sh", "-c", mountScript, "sh", n.cfg.Dir,
		"containerd", "--config", filepath.Join(n.cfg.Dir, "containerd", "config.toml"))
	if err := startLogged(cmd, n.logPath("containerd")); err != nil {
		return fmt.Errorf("starting containerd: %w", err)
	}
	n.containerd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// The socket appears once every plugin has loaded; ctr version then
	// answers. The mount namespace is containerd's once it has exec'd.
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("containerd exited: %s", tail(n.logPath("containerd"), 15))
		default:
		}
		if _, err := os.Stat(socketPath(n.cfg.Dir)); err != nil {
			return false, nil
		}
		_, err := n.ctr(ctx, "version")
		return err == nil, nil
	})
	n.containerdExited = exited
	if err != nil {
		return fmt.Errorf("waiting for containerd: %w", err)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid))
	if err != nil {
		return fmt.Errorf("reading containerd's mount namespace: %w", err)
	}
	if own, _ := os.Readlink("/proc/self/ns/mnt"); own == ns {
		return errors.New("containerd runs in the test's own mount namespace: unshare did not make one")
	}
	// Held open until Close has killed every process in it: a freed
	// namespace's inode number can be reused at once by a new one (every
	// `ip -n` makes one), and Close, matching processes by that number,
	// would kill whatever runs there.
	if n.mntNSRef, err = os.Open(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid)); err != nil {
		return fmt.Errorf("holding containerd's mount namespace: %w", err)
	}
	n.mntNS = ns
	return nil
}

// ctr runs containerd's client against the node's containerd, in the
// k8s.io namespace where the CRI plugin keeps images and containers.
func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, "ctr", append([]string{"--address", socketPath(n.cfg.Dir), "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

// HostPath returns where a path under /var/lib, /var/log or /run, as the
// node's processes (and its pods' hostPath volumes) see it, is on the
// machine; other paths are returned as they are.
func (n *Node) HostPath(p string) string {
	for prefix, dir := range map[string]string{"/var/lib": hostVarLib, "/var/log": hostVarLog, "/run": hostRun} {
		if rest, ok := strings.CutPrefix(p, prefix); ok && (rest == "" || rest[0] == '/') {
			return filepath.Join(n.cfg.Dir, dir, rest)
		}
	}
	return p
}

// TagImage gives image src the further name dst in the node's
// containerd, as a push of a new tag to a registry would: a workload
// changed to dst then rolls without any pull.
func (n *Node) TagImage(ctx context.Context, src, dst string) error {
	if out, err := n.ctr(ctx, "images", "tag", "--force", src, dst); err != nil {
		return fmt.Errorf("tagging %s as %s on %s: %w: %s", src, dst, n.cfg.Name, err, out)
	}
	return nil
}

func (n *Node) startKubelet() error {
	args := []string{
		"--target", strconv.Itoa(n.containerd.Process.Pid), "--mount", "--net", "--",
		n.cfg.Kubelet,
		"--config=" + filepath.Join(n.cfg.Dir, "kubelet", "config.yaml"),
		"--kubeconfig=" + filepath.Join(n.cfg.Dir, "kubelet", "kubeconfig"),
		"--root-dir=" + kubeletRoot,
		"--hostname-override=" + n.cfg.Name,
		"--node-ip=" + n.cfg.NodeIP.String(),
		"--v=2",
	}
	if len(n.cfg.Labels) > 0 {
		args = append(args, "--node-labels="+labelsFlag(n.cfg.Labels))
	}
	// nsenter enters containerd's mount and network namespaces and execs
	// the kubelet: both must see the same pod volumes, logs and netns
	// mounts.
	cmd := exec.Command("nsenter", args...)
	if err := startLogged(cmd, n.logPath("kubelet")); err != nil {
		return fmt.Errorf("starting the kubelet: %w", err)
	}
	n.kubelet = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.kubeletExited = exited
	return nil
}

func (n *Node) waitReady(ctx context.Context) error {
	return wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		select {
		case <-n.kubeletExited:
			return false, errors.New("the kubelet exited")
		default:
		}
		node, err := n.cfg.Client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil // not registered yet, or a transient error: poll on
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				n.readyCondition = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// startLogged starts cmd with stdout and stderr appended to path.
func startLogged(cmd *exec.Cmd, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a terminal's Ctrl-C goes to the test, which
	// then stops the node in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	_ = f.Close() // the child holds its own descriptor
	return err
}

// tail returns the last n lines of the file at path, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
