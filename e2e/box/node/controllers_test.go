package node_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// startInHost runs bin in host-0 (where the API server's 127.0.0.1 is)
// with args, logging to dir/name.log, and stops it when the test ends. It
// returns the process id (`ip netns exec` execs bin).
func startInHost(t *testing.T, e *env, dir, name, bin string, args ...string) int {
	t.Helper()
	log := filepath.Join(dir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", e.tp.HostNS(0), bin}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	_ = f.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, logTail(log))
		}
	})
	return cmd.Process.Pid
}

// rssMiB returns the resident memory of process pid, in MiB.
func rssMiB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb >> 10
		}
	}
	return -1
}

// kubeconfig writes a kubeconfig for user's token against the API
// server's own URL (127.0.0.1 in host-0).
func kubeconfig(t *testing.T, e *env, dir, user string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: e.api.URL(), CertificateAuthorityData: e.admin.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: e.tokens[user]}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "u"}
	kc.CurrentContext = "e2e"
	path := filepath.Join(dir, filepath.Base(user)+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestControllersPlacePods runs upstream kube-controller-manager and
// kube-scheduler beside the API server, as the identities RBAC's default
// bindings are for (system:kube-controller-manager, system:kube-scheduler),
// and checks that they do a real cluster's part for the node: the
// ServiceAccount controller makes the default ServiceAccount, node IPAM
// assigns the Node a pod CIDR, the Deployment and ReplicaSet controllers
// create pods that the scheduler places on the node, where they run.
func TestControllersPlacePods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const kcmUser, schedUser = "system:kube-controller-manager", "system:kube-scheduler"
	bin := os.Getenv("E2E_BIN_DIR") // startEnv skips when unset
	for _, b := range []string{"kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(bin, b)); bin != "" && err != nil {
			t.Skipf("needs %s: run `make e2e-node`", b)
		}
	}
	var kcm, sched int
	var start time.Time
	// The controllers start before the node: its pod range is the one
	// node IPAM assigns, and its CNI configuration waits for it.
	e := startEnv(ctx, t, netip.Prefix{}, func(e *env) {
		dir := t.TempDir()
		ca := filepath.Join(dir, "ca.crt")
		if err := os.WriteFile(ca, e.admin.CAData, 0o600); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		kcm = startInHost(t, e, dir, "kube-controller-manager", filepath.Join(bin, "kube-controller-manager"),
			"--kubeconfig="+kubeconfig(t, e, dir, kcmUser),
			"--leader-elect=false",
			// Each controller with a ServiceAccount of its own, as kubeadm
			// runs it; tokens signed with the API server's key, and the CA
			// published in every namespace's kube-root-ca.crt.
			"--use-service-account-credentials=true",
			"--service-account-private-key-file="+filepath.Join(e.api.Dir(), "service-account.key"),
			"--root-ca-file="+ca,
			"--allocate-node-cidrs=true", "--cluster-cidr=10.246.0.0/16", "--node-cidr-mask-size=24",
			"--secure-port=0",
			// Its default, /usr/libexec/kubernetes/..., is created on the
			// host (the node's teardown check caught it).
			"--flex-volume-plugin-dir="+filepath.Join(dir, "flexvolume"),
		)
		sched = startInHost(t, e, dir, "kube-scheduler", filepath.Join(bin, "kube-scheduler"),
			"--kubeconfig="+kubeconfig(t, e, dir, schedUser),
			"--leader-elect=false",
			"--secure-port=0",
		)
	}, kcmUser, schedUser)

	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := e.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("waiting for the default ServiceAccount: %v", err)
	}
	var podCIDR string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := e.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // transient: poll on
		}
		podCIDR = n.Spec.PodCIDR
		return podCIDR != "", nil
	}); err != nil {
		t.Fatalf("waiting for the Node's pod CIDR: %v", err)
	}
	if podCIDR != e.node.PodCIDR().String() {
		t.Fatalf("the node's pods get addresses from %v, its Node's pod CIDR is %s", e.node.PodCIDR(), podCIDR)
	}
	t.Logf("e2e-figure: controllers start to default ServiceAccount, pod CIDR %s and Node Ready: %v", podCIDR, time.Since(start).Round(time.Millisecond))

	labels := map[string]string{"app": "backend"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "backend", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       backendPod("").Spec,
			},
		},
	}
	d.Spec.Template.Spec.NodeName = "" // the scheduler places them
	start = time.Now()
	if _, err := e.client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the Deployment: %v", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := e.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=backend"})
		if err != nil {
			return false, nil //nolint:nilerr // transient: poll on
		}
		running := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName == nodeName && p.Status.Phase == corev1.PodRunning {
				running++
				if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !e.node.PodCIDR().Contains(ip) {
					return false, fmt.Errorf("pod %s has IP %q, outside the Node's pod CIDR %v", p.Name, p.Status.PodIP, e.node.PodCIDR())
				}
			}
		}
		return running == 2, nil
	}); err != nil {
		pods, _ := e.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		t.Fatalf("waiting for the Deployment's 2 pods to run on %s: %v; pods: %+v", nodeName, err, pods)
	}
	t.Logf("e2e-figure: Deployment create to 2 pods Running %v", time.Since(start).Round(time.Millisecond))
	t.Logf("e2e-figure: memory kube-controller-manager %d MiB, kube-scheduler %d MiB", rssMiB(kcm), rssMiB(sched))
	if err := e.client.AppsV1().Deployments("default").Delete(ctx, "backend", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := e.client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=backend"})
		return err == nil && len(pods.Items) == 0, nil
	}); err != nil {
		t.Fatalf("waiting for the garbage collector and the kubelet to remove the pods: %v", err)
	}
	if err := e.node.Close(ctx); err != nil {
		t.Fatalf("closing the node left something behind: %v", err)
	}
}
