package node_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/box/node"
	"github.com/proxyplane/proxyplane/e2e/cluster"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

const (
	pauseImage   = "ghcr.io/proxyplane/pause:dev"
	backendImage = "ghcr.io/proxyplane/e2e-backend:dev"
	backendPort  = 8080
	nodeName     = "node-0"
)

// requirements skips the test, saying what to run, unless everything it
// needs is here: root, the binaries (`make e2e-node` builds them), the
// images (`make images`) and the OS packages (hack/install-node-deps.sh).
func requirements(t *testing.T) (apiserver, kubelet, images string) {
	t.Helper()
	if os.Getenv("E2E_NODE") == "" {
		t.Skip("runs real kubelets and containerd: set E2E_NODE=1, or run `make e2e-node`")
	}
	nstest.RequireRoot(t)
	bin := os.Getenv("E2E_BIN_DIR")
	apiserver = os.Getenv(cluster.BinaryEnv)
	if bin == "" || apiserver == "" {
		t.Skip("needs E2E_BIN_DIR and " + cluster.BinaryEnv + ": run `make e2e-node`")
	}
	kubelet = filepath.Join(bin, "kubelet")
	images = filepath.Join(bin, "images")
	for _, f := range []string{apiserver, kubelet, filepath.Join(images, "pause.tar"), filepath.Join(images, "e2e-backend.tar")} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("needs %s: run `make e2e-node` (it builds the kubelet and the images): %v", f, err)
		}
	}
	for _, c := range []string{"containerd", "ctr", "runc", "nsenter", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/lib/cni/portmap"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs %s: run hack/install-node-deps.sh (as root)", c)
		}
	}
	return apiserver, kubelet, images
}

// seedTokens writes the API server's token file before its first start,
// with e2e-apiserver's two identities (admin in system:masters, and
// proxyplane-controlplane, as e2e/cmd/apiserver/identity.go writes them),
// the node's, and users': e2e-apiserver keeps a token file it finds and
// reads every record of it. It returns the tokens by user name.
func seedTokens(t *testing.T, dir string, users ...string) map[string]string {
	t.Helper()
	tok := func() string {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	tokens := map[string]string{}
	lines := []string{
		tok() + ",admin,e2e-admin,system:masters",
		tok() + ",proxyplane-controlplane,e2e-proxyplane-controlplane",
	}
	tokens["system:node:"+nodeName] = tok()
	lines = append(lines, node.TokenRecord(tokens["system:node:"+nodeName], nodeName))
	for _, u := range users {
		tokens[u] = tok()
		lines = append(lines, tokens[u]+","+u+",e2e-"+strings.ReplaceAll(u, ":", "-"))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return tokens
}

// dialIn dials from inside network namespace ns.
func dialIn(tp *nstest.Topology, ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := tp.Do(ns, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// forward serves on ln (opened in host-0, on its LAN address) and
// forwards every connection to to, dialled inside host-0: the API server
// listens on host-0's 127.0.0.1 only, and a kubelet in another namespace
// must reach it over the LAN as a real kubelet reaches its API server.
func forward(t *testing.T, tp *nstest.Topology, ln net.Listener, ns, to string) {
	t.Helper()
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = in.Close() }()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				out, err := dialIn(tp, ns)(ctx, "tcp", to)
				cancel()
				if err != nil {
					return
				}
				defer func() { _ = out.Close() }()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done // either side closing ends both
			})
		}
	})
}

// env is what every test here starts: e2e-apiserver in host-0, reached
// from the nodes' LAN through a forwarder, and one real node in node-0.
type env struct {
	tp     *nstest.Topology
	api    *cluster.Cluster
	admin  *rest.Config
	client kubernetes.Interface
	tokens map[string]string // by user
	node   *node.Node
}

// startEnv starts the API server, then runs beforeNode (if not nil), then
// starts one node with pod range podCIDR (zero: the Node's assigned one).
// extraUsers get tokens too.
func startEnv(ctx context.Context, t *testing.T, podCIDR netip.Prefix, beforeNode func(*env), extraUsers ...string) *env {
	t.Helper()
	apiserverBin, kubelet, images := requirements(t)
	e := &env{tp: nstest.New(t, nstest.Options{Nodes: 1, Pods: 1, Hosts: 1})} //nolint:contextcheck // its cleanups outlive ctx
	tp := e.tp
	host := tp.HostNS(0)
	apiDir := filepath.Join(t.TempDir(), "apiserver")
	e.tokens = seedTokens(t, apiDir, extraUsers...)
	api, err := cluster.New(ctx, cluster.Config{
		Binary: apiserverBin, Dir: apiDir,
		CommandPrefix: []string{"ip", "netns", "exec", host},
	})
	if err != nil {
		t.Fatalf("starting e2e-apiserver: %v", err)
	}
	e.api = api
	t.Cleanup(func() { //nolint:contextcheck // runs after ctx is done
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", api.LogPath(), api.LogTail(30))
		}
		if err := api.Stop(context.Background()); err != nil {
			t.Errorf("stopping e2e-apiserver: %v", err)
		}
	})
	admin, err := api.AdminConfig()
	if err != nil {
		t.Fatal(err)
	}
	admin.Dial = dialIn(tp, host)
	e.admin = admin
	client := kubernetes.NewForConfigOrDie(admin)
	e.client = client

	apiURL, err := netip.ParseAddrPort(strings.TrimPrefix(api.URL(), "https://"))
	if err != nil {
		t.Fatalf("parsing the API server's URL %s: %v", api.URL(), err)
	}
	var ln net.Listener
	if err := tp.Do(host, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(tp.HostIP(0), 0).String())
		return err
	}); err != nil {
		t.Fatalf("listening in %s: %v", host, err)
	}
	forward(t, tp, ln, host, apiURL.String()) //nolint:contextcheck // serves until the test's cleanups, past ctx

	if err := node.EnsureRBAC(ctx, client); err != nil {
		t.Fatal(err)
	}

	if beforeNode != nil {
		beforeNode(e)
	}
	n0 := tp.Node(0)
	start := time.Now()
	n, err := node.Start(ctx, node.Config{
		Name:          nodeName,
		NetNS:         n0.NS(),
		Dir:           filepath.Join(t.TempDir(), "node"),
		NodeIP:        n0.IP(),
		PodCIDR:       podCIDR,
		Labels:        map[string]string{corev1.LabelTopologyZone: "zone-a"},
		APIServerURL:  "https://" + ln.Addr().String(),
		APIServerName: "kubernetes", // a name the self-signed serving certificate holds
		APIServerCA:   admin.CAData,
		Token:         e.tokens["system:node:"+nodeName],
		Kubelet:       kubelet,
		PauseImage:    pauseImage,
		Images:        []string{filepath.Join(images, "pause.tar"), filepath.Join(images, "e2e-backend.tar")},
		Client:        client,
	})
	if err != nil {
		t.Fatalf("starting the node: %v", err)
	}
	t.Logf("e2e-figure: node start to Ready %v", time.Since(start).Round(time.Millisecond))
	e.node = n
	// Close is idempotent: a test that closes the node itself gets nil.
	t.Cleanup(func() { //nolint:contextcheck // runs after ctx is done
		if t.Failed() {
			t.Logf("kubelet log:\n%s", logTail(n.LogPath("kubelet")))
		}
		if err := n.Close(context.Background()); err != nil {
			t.Errorf("closing the node: %v", err)
		}
	})
	return e
}

// TestNodeRunsPod starts e2e-apiserver in host-0 and one real node
// (containerd, runc, CNI, kubelet) in node-0's namespace, runs backend
// pods from the image built here, connects to them from the node, deletes
// one, closes the node with the other running and checks nothing is left
// on the host.
func TestNodeRunsPod(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := startEnv(ctx, t, netip.MustParsePrefix("10.246.1.0/24"), nil)
	tp, client, n, n0 := e.tp, e.client, e.node, e.tp.Node(0)
	// No controller-manager runs here: nothing makes the namespace's
	// default ServiceAccount, which pod admission requires.
	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	// Two backend pods: "backend" is deleted, so the kubelet tears it down
	// as in a real cluster; "left" still runs when the node closes, so
	// Close must kill its containers and shim itself.
	start := time.Now()
	for _, name := range []string{"backend", "left"} {
		if _, err := client.CoreV1().Pods("default").Create(ctx, backendPod(name), metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", name, err)
		}
	}
	for _, name := range []string{"backend", "left"} {
		podIP := waitRunning(ctx, t, client, name)
		t.Logf("e2e-figure: pod %s create to Running %v, IP %s", name, time.Since(start).Round(time.Millisecond), podIP)
		// The pod answers from the node's namespace, through the CNI
		// bridge. The server may take a moment after Running to listen:
		// retry.
		var answer string
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			a, err := ask(ctx, tp, n0.NS(), net.JoinHostPort(podIP, strconv.Itoa(backendPort)))
			answer = a
			return err == nil, nil
		}); err != nil {
			t.Fatalf("connecting to pod %s at %s from %s: %v", name, podIP, n0.NS(), err)
		}
		if !strings.HasPrefix(answer, name+" ") {
			t.Fatalf("pod answered %q, want its name %q first", answer, name)
		}
	}
	if mem, err := n.Memory(); err != nil {
		t.Errorf("measuring memory: %v", err)
	} else {
		for k, v := range mem {
			t.Logf("e2e-figure: memory with 2 pods: %s %d MiB", k, v>>20)
		}
	}

	if err := client.CoreV1().Pods("default").Delete(ctx, "backend", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the pod: %v", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods("default").Get(ctx, "backend", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("waiting for the kubelet to remove the deleted pod: %v", err)
	}

	start = time.Now()
	if err := n.Close(ctx); err != nil {
		t.Fatalf("closing the node left something behind: %v", err)
	}
	t.Logf("e2e-figure: node close %v", time.Since(start).Round(time.Millisecond))
	// Close checked already; check again as a caller would, later.
	if err := n.Check(); err != nil {
		t.Fatalf("after Close: %v", err)
	}
}

// backendPod is a Pod of the backend image on the node, answering with
// its name.
func backendPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName, // no scheduler yet
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name: "backend", Image: backendImage, ImagePullPolicy: corev1.PullNever,
				Args:  []string{"--drain=0s"},
				Env:   []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				Ports: []corev1.ContainerPort{{ContainerPort: backendPort}},
			}},
		},
	}
}

// waitRunning waits for pod name to run and returns its IP.
func waitRunning(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) string {
	t.Helper()
	var podIP string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // transient: poll on
		}
		podIP = p.Status.PodIP
		return p.Status.Phase == corev1.PodRunning && podIP != "", nil
	}); err != nil {
		p, _ := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		t.Fatalf("waiting for pod %s to run: %v; status %+v", name, err, p.Status)
	}
	return podIP
}

// ask sends one line to addr from inside ns and returns the answer line.
func ask(ctx context.Context, tp *nstest.Topology, ns, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := dialIn(tp, ns)(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading the answer: %w", err)
	}
	return strings.TrimSpace(line), nil
}

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
