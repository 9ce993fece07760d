package scenarios

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/box"
)

const (
	// podsStartTimeout bounds the start of a box on real nodes: three
	// containerds and kubelets, the controllers, and deploy/'s pods.
	podsStartTimeout = 6 * time.Minute
	// rolloutTimeout bounds one scenario that rolls or drains a workload:
	// the DaemonSet's minReadySeconds (10 s) per node, one at a time.
	rolloutTimeout = 5 * time.Minute
	// nextTag is the tag the rolling updates move the images to.
	nextTag = "e2e-next"
)

// podsEnv is what the pod scenarios share: the box, and the prober pod
// that watches a ClusterIP and a NodePort from node-0 while they roll.
type podsEnv struct {
	b *box.Box
	// ns is deploy/'s namespace.
	ns string
	// probes is the prober pod's /probes URL, read from host-0.
	probes string
}

// TestPods runs proxyplane as it is installed: deploy/ applied to a
// cluster of real kubelets, its Deployment's and DaemonSet's pods made by
// the real controllers from the images `make images` built, on a fresh
// cluster (every agent up before any replica is Ready, every cache
// empty).
func TestPods(t *testing.T) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), podsStartTimeout)
	b, err := box.Start(ctx, t, box.Options{Kubelets: true, Nodes: 3})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	figure(t, "pods-box-start", "took=%s nodes=%d replicas=%d", ms(time.Since(start)), len(b.Agents), len(b.ControlPlanes))
	if mem, err := b.Memory(); err == nil {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(mem)) {
			parts = append(parts, fmt.Sprintf("%s=%dMiB", k, mem[k]>>20))
		}
		figure(t, "pods-box-memory", "%s", strings.Join(parts, " "))
	} else {
		t.Logf("box memory: %v", err)
	}
	e := &podsEnv{b: b, ns: b.Deployment().Namespace}
	// In order, each from what the one before left (Traffic starts the
	// prober the later ones read): the first failure ends the run.
	_ = t.Run("Installed", e.testInstalled) &&
		t.Run("AsShipped", e.testAsShipped) &&
		t.Run("Traffic", e.testTraffic) &&
		t.Run("DaemonSetRollingUpdate", e.testDaemonSetRollingUpdate) &&
		t.Run("BadImage", e.testBadImage) &&
		t.Run("DeploymentRollingUpdate", e.testDeploymentRollingUpdate) &&
		t.Run("Drain", e.testDrain) &&
		t.Run("NFTablesMode", e.testNFTablesMode)
	figure(t, "pods-total", "took=%s", ms(time.Since(start)))
}

// begin starts a pod scenario: its context, bounded by rolloutTimeout.
func begin(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), rolloutTimeout)
	t.Cleanup(cancel)
	return ctx
}

// pods lists the pods of deploy/'s workload name (its
// app.kubernetes.io/name).
func (e *podsEnv) pods(ctx context.Context, t *testing.T, name string) []corev1.Pod {
	t.Helper()
	list, err := e.b.Admin().CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// testInstalled checks what `kubectl apply --server-side -k` of deploy/
// (through the box's overlay) must end with: an agent Running
// and Ready on every node after its init container Completed, both
// replicas Ready, no container restarted; the agents started before any
// replica was Ready (a fresh install), and they hold tokens the kubelet
// projected, bound to their pods.
func (e *podsEnv) testInstalled(t *testing.T) {
	ctx := begin(t)
	// Every object `kubectl apply --server-side -k` rendered is there,
	// applied.
	if err := e.b.Deployment().Check(ctx, e.b.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	agents := e.pods(ctx, t, "proxyplane-nodeagent")
	replicas := e.pods(ctx, t, "proxyplane-controlplane")
	if len(agents) != len(e.b.Agents) || len(replicas) != len(e.b.ControlPlanes) {
		t.Fatalf("%d agent pods for %d nodes, %d replica pods for %d replicas", len(agents), len(e.b.Agents), len(replicas), len(e.b.ControlPlanes))
	}
	firstReady := time.Time{}
	for _, p := range replicas {
		requireReadyNoRestarts(t, &p)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && (firstReady.IsZero() || c.LastTransitionTime.Before(&metav1.Time{Time: firstReady})) {
				firstReady = c.LastTransitionTime.Time
			}
		}
	}
	nodes := map[string]bool{}
	for _, p := range agents {
		requireReadyNoRestarts(t, &p)
		nodes[p.Spec.NodeName] = true
		if len(p.Status.InitContainerStatuses) != 1 {
			t.Fatalf("%s: %d init container statuses, want 1", p.Name, len(p.Status.InitContainerStatuses))
		}
		if done := p.Status.InitContainerStatuses[0].State.Terminated; done == nil || done.Reason != "Completed" || done.ExitCode != 0 {
			t.Errorf("%s: init container %s did not complete: %+v", p.Name, p.Status.InitContainerStatuses[0].Name, p.Status.InitContainerStatuses[0].State)
		}
		started := p.Status.ContainerStatuses[0].State.Running.StartedAt.Time
		// Timestamps have a second's resolution.
		if !started.Before(firstReady.Add(-time.Second)) {
			t.Errorf("%s started at %s, after a replica was Ready at %s: this was no fresh install", p.Name, started, firstReady)
		}
		e.checkProjectedToken(t, &p)
		e.checkMemoryLimit(ctx, t, &p, "nodeagent")
	}
	for _, p := range replicas {
		e.checkMemoryLimit(ctx, t, &p, "controlplane")
	}
	if len(nodes) != len(e.b.Agents) {
		t.Errorf("agents on %d distinct nodes, want %d", len(nodes), len(e.b.Agents))
	}
}

// checkMemoryLimit checks, in pod p's log as `kubectl logs` reads it
// (from the kubelet through the API server), that container set its Go
// heap's soft limit from the memory limit deploy/ gives it: without one
// the collector lets the heap grow to twice the live data, past the
// container's limit at the table sizes docs/benchmarks.md measures.
func (e *podsEnv) checkMemoryLimit(ctx context.Context, t *testing.T, p *corev1.Pod, container string) {
	t.Helper()
	logs, err := e.b.Admin().CoreV1().Pods(e.ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil || len(logs) == 0 {
		t.Errorf("%s's log through the API server: %q, %v", p.Name, logs, err)
		return
	}
	var limit *resource.Quantity
	for _, c := range p.Spec.Containers {
		if c.Name == container {
			limit = c.Resources.Limits.Memory()
		}
	}
	want := strconv.FormatInt(int64(float64(limit.Value())*0.9), 10)
	if !strings.Contains(string(logs), "GOMEMLIMIT is updated") || !strings.Contains(string(logs), want) {
		t.Errorf("%s's %s log does not say it set GOMEMLIMIT to %s (90%% of its limit %s):\n%s", p.Name, container, want, limit, logs)
	}
}

// requireReadyNoRestarts fails t unless pod is Running and Ready and none
// of its containers restarted.
func requireReadyNoRestarts(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if p.Status.Phase != corev1.PodRunning {
		t.Fatalf("%s is %s", p.Name, p.Status.Phase)
	}
	if !box.PodReady(p) {
		t.Errorf("%s is not Ready: %+v", p.Name, p.Status.Conditions)
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if cs.RestartCount != 0 {
			t.Errorf("%s: container %s restarted %d times", p.Name, cs.Name, cs.RestartCount)
		}
	}
}

// checkProjectedToken checks that the token the kubelet projected into
// agent pod p (the box writes none) is for the control plane's audience
// and bound to p.
func (e *podsEnv) checkProjectedToken(t *testing.T, p *corev1.Pod) {
	t.Helper()
	_, claims := e.agentToken(t, p)
	if len(claims.Aud) != 1 || claims.Aud[0] != "proxyplane" || claims.K8s.Pod.UID != string(p.UID) {
		t.Errorf("%s's token: audiences %v, bound to pod %s (%s); want [proxyplane] and the pod itself", p.Name, claims.Aud, claims.K8s.Pod.Name, claims.K8s.Pod.UID)
	}
}

// testAsShipped checks that the agent runs as deploy/ ships it, in
// iptables mode: not privileged, with CAP_NET_ADMIN and CAP_NET_RAW
// only, a read-only root filesystem and a read-only /proc/sys; and that
// its rules are in force (every node programmed, which the box's start
// waited for).
func (e *podsEnv) testAsShipped(t *testing.T) {
	ctx := begin(t)
	e.requireAsShipped(t)
	for _, a := range e.b.Agents {
		if mode := dataplaneIn(ctx, t, a.Node.NS()); mode != "iptables" {
			t.Errorf("%s programs %s, want iptables (deploy/'s mode)", a.Node.Name(), mode)
		}
	}
}

// requireAsShipped fails t unless every agent's process runs as deploy/
// ships it: effective capabilities NET_ADMIN and NET_RAW only, / and
// /proc/sys read-only.
func (e *podsEnv) requireAsShipped(t *testing.T) {
	t.Helper()
	const capNetAdmin, capNetRaw = 12, 13
	for _, a := range e.b.Agents {
		pid, err := processIn(a.Node.NS(), "nodeagent")
		if err != nil {
			t.Fatal(err)
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		var capEff uint64
		for line := range strings.SplitSeq(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
				capEff, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			}
		}
		if want := uint64(1)<<capNetAdmin | 1<<capNetRaw; capEff != want {
			t.Errorf("%s's agent has capabilities %#x, want %#x (NET_ADMIN, NET_RAW)", a.Node.Name(), capEff, want)
		}
		mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, mp := range []string{"/", "/proc/sys"} {
			if opts, ok := mountOptions(string(mounts), mp); !ok || !strings.Contains(","+opts+",", ",ro,") {
				t.Errorf("%s's agent sees %s mounted %q, want read-only", a.Node.Name(), mp, opts)
			}
		}
	}
}

// processIn returns the pid of the process named comm whose network
// namespace is ns's.
func processIn(ns, comm string) (int, error) {
	want, err := os.Stat(filepath.Join("/run/netns", ns))
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		name, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue
		}
		if got, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && os.SameFile(got, want) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no %s process in %s", comm, ns)
}

// mountOptions returns the per-mount options of the last mount at point
// in a /proc/PID/mountinfo.
func mountOptions(mountinfo, point string) (string, bool) {
	opts, found := "", false
	for line := range strings.SplitSeq(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == point {
			opts, found = f[5], true
		}
	}
	return opts, found
}

// testTraffic runs two backend pods on node-2 behind a NodePort Service,
// and a prober pod on node-0 that connects every 100 ms through the
// ClusterIP and through node-1's NodePort: pod to pod across nodes,
// through the rules the agents programmed. The prober keeps probing for
// the scenarios after this one.
func (e *podsEnv) testTraffic(t *testing.T) {
	ctx := begin(t)
	admin := e.b.Admin()
	web := box.BackendDeployment("web", 2, "node-2")
	labels := web.Spec.Selector.MatchLabels
	if _, err := admin.AppsV1().Deployments(box.Namespace).Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: box.Namespace},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromInt32(box.BackendPort), Protocol: corev1.ProtocolTCP}},
		},
	}
	svc, err := admin.CoreV1().Services(box.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cluster := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	nodePort := net.JoinHostPort(e.b.Agents[1].Node.IP().String(), strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
	prober := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "prober", Namespace: box.Namespace},
		Spec:       box.BackendPodSpec("node-0", "--probe="+cluster, "--probe="+nodePort),
	}
	if _, err := admin.CoreV1().Pods(box.Namespace).Create(ctx, prober, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ip string
	if err := box.Eventually(ctx, func() error {
		p, err := admin.CoreV1().Pods(box.Namespace).Get(ctx, "prober", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !box.PodReady(p) {
			return fmt.Errorf("prober is %s", p.Status.Phase)
		}
		ip = p.Status.PodIP
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.probes = "http://" + net.JoinHostPort(ip, "8081") + "/probes"
	// The first probes may run before the Service's endpoints reach the
	// nodes: from the first success on, none may fail.
	start := time.Now()
	var base map[string]probeStats
	if err := box.Eventually(ctx, func() error {
		var err error
		if base, err = e.readProbes(ctx); err != nil {
			return err
		}
		for _, target := range []string{cluster, nodePort} {
			if base[target].OK == 0 {
				return fmt.Errorf("%s: no probe has succeeded yet: %+v", target, base[target])
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	figure(t, "pods-traffic", "first answers through ClusterIP and NodePort after %s", ms(time.Since(start)))
	e.watchProbes(ctx, t, base, 3*time.Second)
}

// probeStats are the prober's counts for one target (e2e/cmd/backend).
type probeStats struct {
	OK, Failed int64
	LastError  string
}

func (e *podsEnv) readProbes(ctx context.Context) (map[string]probeStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.probes, nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.b.HTTPClient(e.b.HostNS(), nil).Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	var out map[string]probeStats
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("reading %s: %w: %s", e.probes, err, body)
	}
	return out, nil
}

// watchProbes waits at least d and until every target has succeeded
// again, then fails t if any probe failed since base.
func (e *podsEnv) watchProbes(ctx context.Context, t *testing.T, base map[string]probeStats, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var now map[string]probeStats
	if err := box.Eventually(ctx, func() error {
		var err error
		if now, err = e.readProbes(ctx); err != nil {
			return err
		}
		if time.Now().Before(deadline) {
			return fmt.Errorf("watching for %s", d)
		}
		for target, s := range now {
			if s.OK <= base[target].OK {
				return fmt.Errorf("%s: no probe succeeded since", target)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for target, s := range now {
		ok, failed := s.OK-base[target].OK, s.Failed-base[target].Failed
		figure(t, "pods-probe", "%s %s ok=%d failed=%d", t.Name(), target, ok, failed)
		if failed != 0 {
			t.Errorf("%d of %d connections to %s failed, the last: %s", failed, ok+failed, target, s.LastError)
		}
	}
}

// underProbe runs change, waits for deploy/'s workloads to roll out, and
// fails t if any probe failed meanwhile.
func (e *podsEnv) underProbe(ctx context.Context, t *testing.T, change func()) {
	t.Helper()
	base, err := e.readProbes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	change()
	if err := e.b.WaitWorkloads(ctx); err != nil {
		t.Fatal(err)
	}
	figure(t, "pods-rollout", "%s took=%s", t.Name(), ms(time.Since(start)))
	e.watchProbes(ctx, t, base, 2*time.Second)
	if _, err := e.b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// tagEverywhere gives image repo:dev the tag nextTag on every node, as a
// push of a new tag to a registry would.
func (e *podsEnv) tagEverywhere(ctx context.Context, t *testing.T, repo string) {
	t.Helper()
	for _, n := range e.b.Nodes() {
		if err := n.TagImage(ctx, repo+":dev", repo+":"+nextTag); err != nil {
			t.Fatal(err)
		}
	}
}

// setImage sets every container of deploy/'s workload kind/name to
// image, as `kubectl set image` does.
func (e *podsEnv) setImage(ctx context.Context, t *testing.T, kind, name, image string) {
	t.Helper()
	var spec *corev1.PodSpec
	var update func() error
	apps := e.b.Admin().AppsV1()
	switch kind {
	case "DaemonSet":
		ds, err := apps.DaemonSets(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		spec = &ds.Spec.Template.Spec
		update = func() error { _, err := apps.DaemonSets(e.ns).Update(ctx, ds, metav1.UpdateOptions{}); return err }
	default:
		d, err := apps.Deployments(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		spec = &d.Spec.Template.Spec
		update = func() error { _, err := apps.Deployments(e.ns).Update(ctx, d, metav1.UpdateOptions{}); return err }
	}
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			cs[i].Image = image
		}
	}
	if err := update(); err != nil {
		t.Fatal(err)
	}
}

// testDaemonSetRollingUpdate rolls every agent to a new image tag, one
// node at a time as deploy/'s DaemonSet says, while the prober runs: an
// agent's rules stay in the kernel while it is replaced, so no
// connection fails.
func (e *podsEnv) testDaemonSetRollingUpdate(t *testing.T) {
	e.rollImage(begin(t), t, "DaemonSet", "proxyplane-nodeagent", "ghcr.io/proxyplane/nodeagent", len(e.b.Agents))
}

// rollImage moves deploy/'s workload kind/name from repo:dev to
// repo:nextTag under the probe, and checks its want pods all run it.
func (e *podsEnv) rollImage(ctx context.Context, t *testing.T, kind, name, repo string, want int) {
	t.Helper()
	e.tagEverywhere(ctx, t, repo)
	e.underProbe(ctx, t, func() { e.setImage(ctx, t, kind, name, repo+":"+nextTag) })
	e.requireImage(ctx, t, name, repo+":"+nextTag, want)
}

// testBadImage sets the agents' image to one that no node has and no
// registry serves, as a mistyped tag would: the first replaced agent's
// pod says why it cannot start, naming the image, the rollout stops
// there (maxUnavailable), the node goes on forwarding with the rules its
// agent left, and setting the image back heals it, all under the probe.
func (e *podsEnv) testBadImage(t *testing.T) {
	ctx := begin(t)
	const bad = "ghcr.io/proxyplane/nodeagent:no-such-tag"
	base, err := e.readProbes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.setImage(ctx, t, "DaemonSet", "proxyplane-nodeagent", bad)
	var stuck string
	if err := box.Eventually(ctx, func() error {
		for _, p := range e.pods(ctx, t, "proxyplane-nodeagent") {
			for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				if w := cs.State.Waiting; w != nil && strings.Contains(w.Reason, "Image") && strings.Contains(w.Message, bad) {
					stuck = fmt.Sprintf("%s on %s: %s: %s", p.Name, p.Spec.NodeName, w.Reason, w.Message)
					return nil
				}
			}
		}
		return fmt.Errorf("no agent pod says why %s cannot run yet", bad)
	}); err != nil {
		t.Fatal(err)
	}
	figure(t, "pods-bad-image", "%s", stuck)
	e.watchProbes(ctx, t, base, 3*time.Second)
	if n := len(e.pods(ctx, t, "proxyplane-nodeagent")); n != len(e.b.Agents) {
		t.Errorf("%d agent pods during the stuck rollout, want %d: maxUnavailable stops it at one node", n, len(e.b.Agents))
	}
	e.underProbe(ctx, t, func() {
		e.setImage(ctx, t, "DaemonSet", "proxyplane-nodeagent", "ghcr.io/proxyplane/nodeagent:"+nextTag)
	})
}

// requireImage fails t unless exactly want pods of deploy/'s workload
// name run, all Ready, all from image.
func (e *podsEnv) requireImage(ctx context.Context, t *testing.T, name, image string, want int) {
	t.Helper()
	pods := e.pods(ctx, t, name)
	if len(pods) != want {
		t.Fatalf("%d pods of %s, want %d", len(pods), name, want)
	}
	for _, p := range pods {
		if !box.PodReady(&p) || p.Spec.Containers[0].Image != image {
			t.Errorf("%s: Ready %t, image %s; want Ready, %s", p.Name, box.PodReady(&p), p.Spec.Containers[0].Image, image)
		}
	}
}

// testDeploymentRollingUpdate rolls both replicas to a new image tag, one
// at a time, while the prober runs: agents fail over and keep their
// rules.
func (e *podsEnv) testDeploymentRollingUpdate(t *testing.T) {
	e.rollImage(begin(t), t, "Deployment", "proxyplane-controlplane", "ghcr.io/proxyplane/controlplane", len(e.b.ControlPlanes))
}

// testDrain drains node-1, which holds a replica, as `kubectl drain
// --ignore-daemonsets` does (cordon, then evict every pod but the
// DaemonSet's through the eviction API, which the PodDisruptionBudget
// guards), while the prober runs through node-1's NodePort; then
// uncordons it.
func (e *podsEnv) testDrain(t *testing.T) {
	ctx := begin(t)
	core := e.b.Admin().CoreV1()
	const victim = "node-1"
	cordon := func(on bool) {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
		if _, err := core.Nodes().Patch(ctx, victim, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	base, err := e.readProbes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cordon(true)
	pods, err := core.Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + victim})
	if err != nil {
		t.Fatal(err)
	}
	evicted := 0
	for _, p := range pods.Items {
		if owner := metav1.GetControllerOf(&p); owner != nil && owner.Kind == "DaemonSet" {
			continue
		}
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}
		if err := box.Eventually(ctx, func() error {
			err := core.Pods(p.Namespace).EvictV1(ctx, ev)
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err // 429 while the budget forbids it: kubectl drain retries too
		}); err != nil {
			t.Fatalf("evicting %s: %v", p.Name, err)
		}
		evicted++
	}
	if err := box.Eventually(ctx, func() error {
		left, err := core.Pods(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + victim, LabelSelector: "app.kubernetes.io/name=proxyplane-controlplane"})
		if err != nil {
			return err
		}
		if len(left.Items) != 0 {
			return fmt.Errorf("%d replica pods still on %s", len(left.Items), victim)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	figure(t, "pods-drain", "evicted=%d", evicted)
	e.watchProbes(ctx, t, base, 3*time.Second)
	base, err = e.readProbes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.underProbe(ctx, t, func() { cordon(false) })
	e.watchProbes(ctx, t, base, time.Second)
}

// testNFTablesMode changes the agents' configuration to nftables mode as
// an operator would (a new generated ConfigMap, which rolls the
// DaemonSet), while the prober runs: each agent switches make-before-
// break, as the agent unprivileged and read-only as shipped.
func (e *podsEnv) testNFTablesMode(t *testing.T) {
	ctx := begin(t)
	apps, core := e.b.Admin().AppsV1(), e.b.Admin().CoreV1()
	ds, err := apps.DaemonSets(e.ns).Get(ctx, "proxyplane-nodeagent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var vol *corev1.ConfigMapVolumeSource
	for i := range ds.Spec.Template.Spec.Volumes {
		if v := ds.Spec.Template.Spec.Volumes[i]; v.Name == "config" {
			vol = v.ConfigMap
		}
	}
	if vol == nil {
		t.Fatal("the DaemonSet mounts no config volume")
	}
	cm, err := core.ConfigMaps(e.ns).Get(ctx, vol.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf := cm.Data["config.conf"]
	if !strings.Contains(conf, "\nmode: iptables\n") {
		t.Fatalf("deploy/'s kube-proxy.conf no longer says mode: iptables:\n%s", conf)
	}
	next := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: vol.Name + "-nft", Namespace: e.ns, Labels: cm.Labels},
		Data:       map[string]string{"config.conf": strings.Replace(conf, "\nmode: iptables\n", "\nmode: nftables\n", 1)},
	}
	if _, err := core.ConfigMaps(e.ns).Create(ctx, next, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.underProbe(ctx, t, func() {
		vol.Name = next.Name
		if _, err := apps.DaemonSets(e.ns).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	for _, a := range e.b.Agents {
		if mode := dataplaneIn(ctx, t, a.Node.NS()); mode != "nftables" {
			t.Errorf("%s programs %s after the switch, want nftables only", a.Node.Name(), mode)
		}
	}
	e.requireAsShipped(t)
}

// dataplaneIn says which of the agent's dataplanes has rules in
// namespace ns: "iptables", "nftables", both joined by "+", or "none".
func dataplaneIn(ctx context.Context, t *testing.T, ns string) string {
	t.Helper()
	var modes []string
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "iptables-nft-save", "-t", "nat").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-nft-save in %s: %v: %s", ns, err, out)
	}
	if strings.Contains(string(out), ":PP-SERVICES") {
		modes = append(modes, "iptables")
	}
	if exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "list", "table", "ip", "proxyplane").Run() == nil {
		modes = append(modes, "nftables")
	}
	if len(modes) == 0 {
		return "none"
	}
	return strings.Join(modes, "+")
}

// rotationTokenSeconds is the agents' token lifetime in
// TestPodsTokenRotation: the TokenRequest API's minimum, which the
// kubelet refreshes at 80% of its life (8 minutes).
const rotationTokenSeconds = 600

// TestPodsTokenRotation watches the kubelet rotate every agent's
// projected token: the rotation itself leaves the agent's stream alone
// (ListNodes' connected_at unchanged), and when the old token expires,
// which ends the stream it authenticated, the agent is back on the same
// replica with the rotated token within seconds, current, with no probe
// failed. It takes about 12 minutes (E2E_ROTATION=1; `make
// e2e-rotation`): the kubelet refreshes a token at 80% of its life, and
// the shortest life the API server grants is 10 minutes. The box's one
// change to deploy/: the token volume's expirationSeconds, 3600 there.
func TestPodsTokenRotation(t *testing.T) {
	if os.Getenv("E2E_ROTATION") == "" {
		t.Skip("waits 12 minutes for the kubelet to rotate tokens: set E2E_ROTATION=1, or run `make e2e-rotation`")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	b, err := box.Start(ctx, t, box.Options{Kubelets: true, Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	e := &podsEnv{b: b, ns: b.Deployment().Namespace}
	apps := b.Admin().AppsV1()
	ds, err := apps.DaemonSets(e.ns).Get(ctx, "proxyplane-nodeagent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					src.ServiceAccountToken.ExpirationSeconds = ptr.To[int64](rotationTokenSeconds)
				}
			}
		}
	}
	if _, err := apps.DaemonSets(e.ns).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitWorkloads(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}
	type stream struct {
		replica     string
		connectedAt time.Time
		token       []byte
		expires     time.Time
	}
	// streams reads every agent's token and stream; a node between two
	// streams is an error to poll on.
	streams := func() (map[string]stream, error) {
		on, statuses, err := b.Connections(ctx)
		if err != nil {
			return nil, err
		}
		out := map[string]stream{}
		for _, p := range e.pods(ctx, t, "proxyplane-nodeagent") {
			tok, claims := e.agentToken(t, &p)
			st, c := statuses[p.Spec.NodeName], on[p.Spec.NodeName]
			if st == nil || c == nil {
				return nil, fmt.Errorf("%s is connected to no replica", p.Spec.NodeName)
			}
			out[p.Spec.NodeName] = stream{c.GRPCAddr(), st.GetConnectedAt().AsTime(), tok, time.Unix(claims.Exp, 0)}
		}
		return out, nil
	}
	before, err := streams()
	if err != nil {
		t.Fatal(err)
	}
	last := time.Time{}
	for _, s := range before {
		if s.expires.After(last) {
			last = s.expires
		}
	}
	t.Logf("the agents' tokens expire by %v; waiting for the kubelet to rotate them", last)

	var rotated map[string]stream
	if err := wait(ctx, 10*time.Minute, 5*time.Second, func() error {
		var err error
		if rotated, err = streams(); err != nil {
			return err
		}
		for node, s := range rotated {
			if string(s.token) == string(before[node].token) {
				return fmt.Errorf("%s's token not rotated yet", node)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for node, s := range rotated {
		if s.replica != before[node].replica || !s.connectedAt.Equal(before[node].connectedAt) {
			t.Errorf("%s's stream changed at the rotation: %s since %v, was %s since %v", node, s.replica, s.connectedAt, before[node].replica, before[node].connectedAt)
		}
		figure(t, "pods-token-rotated", "%s after=%s of a %ds life", node, ms(time.Since(before[node].expires.Add(-rotationTokenSeconds*time.Second))), rotationTokenSeconds)
	}

	// Each old token's expiry ends the stream it opened; the agent comes
	// back with the rotated one.
	var after map[string]stream
	if err := wait(ctx, time.Until(last)+2*time.Minute, time.Second, func() error {
		var err error
		if after, err = streams(); err != nil {
			return err
		}
		for node, s := range after {
			if !s.connectedAt.After(before[node].expires.Add(-5 * time.Second)) {
				return fmt.Errorf("%s's stream is the one its old token opened", node)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for node, s := range after {
		figure(t, "pods-token-reconnect", "%s back %s after its old token expired, on %s", node, ms(s.connectedAt.Sub(before[node].expires)), s.replica)
		if s.replica != before[node].replica {
			t.Errorf("%s moved from %s to %s when its token expired; it should stay", node, before[node].replica, s.replica)
		}
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// tokenClaims are the claims of an agent's token the scenarios read.
type tokenClaims struct {
	Aud []string `json:"aud"`
	Exp int64    `json:"exp"`
	K8s struct {
		Pod struct {
			Name, UID string
		} `json:"pod"`
	} `json:"kubernetes.io"`
}

// agentToken reads the token the kubelet projected into agent pod p, as
// its container sees it, and decodes its claims.
func (e *podsEnv) agentToken(t *testing.T, p *corev1.Pod) ([]byte, tokenClaims) {
	t.Helper()
	ns := ""
	for _, a := range e.b.Agents {
		if a.Node.Name() == p.Spec.NodeName {
			ns = a.Node.NS()
		}
	}
	pid, err := processIn(ns, "nodeagent")
	if err != nil {
		t.Fatal(err)
	}
	// In its mount namespace: /proc/PID/root would resolve the image's
	// /var/run symlink against this process's root.
	const path = "/var/run/secrets/proxyplane/token"
	raw, err := exec.Command("nsenter", "--target", strconv.Itoa(pid), "--mount", "--", "cat", path).Output()
	if err != nil {
		t.Fatalf("%s: the kubelet projected no token: %v", p.Name, err)
	}
	parts := strings.Split(string(raw), ".")
	if len(parts) != 3 {
		t.Fatalf("%s: %s holds no JWT", p.Name, path)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims tokenClaims
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	return raw, claims
}

// wait polls cond every interval until it returns nil, for at most d.
func wait(ctx context.Context, d, interval time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last error
	for {
		if last = cond(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", d, last)
		case <-time.After(interval):
		}
	}
}
