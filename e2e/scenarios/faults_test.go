package scenarios

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
	"github.com/proxyplane/proxyplane/internal/failpoint"
)

// startNode2Probes starts steady probes to web from the client and from
// node-2's pod, the paths the fault scenarios break, and waits until each
// has dialled.
func startNode2Probes(ctx context.Context, t *testing.T, b *box.Box, web *corev1.Service) map[string]*box.Probe {
	t.Helper()
	tp := b.Topology()
	probes := map[string]*box.Probe{
		"client":                         b.StartProbe(tp.ClientNS(), box.ClusterAddr(web), probeInterval, probeTimeout, probeMaxDials),
		podName(podOn(b, 2)) + "@node-2": b.StartProbe(tp.PodNS(podOn(b, 2)), box.ClusterAddr(web), probeInterval, probeTimeout, probeMaxDials),
	}
	for _, p := range probes {
		if err := p.WaitDials(ctx, 5); err != nil {
			for _, p := range probes {
				p.Stop()
			}
			t.Fatal(err)
		}
	}
	return probes
}

// checkProbes stops probes, reports each as figure, and fails t for any
// connection that failed during what the scenario did.
func checkProbes(t *testing.T, probes map[string]*box.Probe, figureName, during string) {
	t.Helper()
	for name, p := range probes {
		r := p.Stop()
		figure(t, figureName, "from=%s dials=%d failed=%d over=%s", name, r.Dials, r.Failures, ms(r.Duration))
		if r.Failures != 0 {
			t.Errorf("probe from %s: %d of %d connections failed through %s; first: %v", name, r.Failures, r.Dials, during, r.Errors)
		}
	}
}

// testAgentKilledMidApply kills node-2's agent (SIGKILL, through its
// failpoints) at each step of applying a change: after the table is
// persisted, after it is programmed, and as the ACK is sent. Each time the
// agent is started again, as the kubelet would. Under steady probes
// through node-2 and the client no connection may fail, the change must
// reach node-2's pods, and afterwards the agent's table, its kernel rules
// and the control plane's record of what it acknowledged must agree.
func (e *env) testAgentKilledMidApply(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	web := webService(t, e)
	a := b.Agents[2]
	podNS := tp.PodNS(podOn(b, 2))
	probes := startNode2Probes(ctx, t, b, web)
	defer func() {
		checkProbes(t, probes, "agent-kill-probe", "the kills")
		if !a.Running() {
			_ = a.Start()
		}
	}()

	for i, point := range []string{failpoint.AfterPersist, failpoint.AfterProgram, failpoint.BeforeAck} {
		t.Run(point, func(t *testing.T) {
			if err := a.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.StartWith(failpoint.Env + "=" + point); err != nil {
				t.Fatal(err)
			}
			if err := a.WaitServing(ctx); err != nil {
				t.Fatal(err)
			}
			// Wait until it is current on its stream, so that the change
			// below is the response it dies applying.
			if _, err := b.WaitProgrammed(ctx, nil); err != nil {
				t.Fatal(err)
			}
			svc, _, err := b.CreateService(ctx, box.NewService(fmt.Sprintf("fault-%d", i)), podOn(b, 0))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-a.Exited():
			case <-time.After(30 * time.Second):
				t.Fatalf("%s never reached failpoint %s\n%s", a.Name(), point, a.LogTail(20))
			}
			if err := a.ExitError(); err == nil || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("%s exited with %v, want killed at %s", a.Name(), err, point)
			}
			killed := time.Now()
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			at, err := b.DialUntil(ctx, podNS, box.ClusterAddr(svc), "")
			if err != nil {
				t.Fatalf("the change never reached node-2 after the kill: %v\n%s", err, a.LogTail(20))
			}
			// The agent's version in force, what the control plane
			// computed for node-2 and what it records as acknowledged.
			if _, err := b.WaitProgrammed(ctx, nil); err != nil {
				t.Fatal(err)
			}
			figure(t, "agent-killed-mid-apply", "point=%s change-reached-after-restart=%s", point, ms(at.Sub(killed)))
		})
	}
}

// testControlPlaneKilledMidStream kills a control plane replica (SIGKILL,
// through its failpoint) just after it handed an agent a table response,
// before the ACK. Every agent is first moved onto that replica (the other
// one restarted), so that the change below goes out through it. Its agents
// fail over to the other replica; under steady probes no connection fails,
// the change reaches every node, and the surviving replica records each
// agent's version in force as acknowledged.
func (e *env) testControlPlaneKilledMidStream(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	web := webService(t, e)
	armed, other := b.ControlPlanes[0], b.ControlPlanes[1]
	probes := startNode2Probes(ctx, t, b, web)
	defer func() {
		checkProbes(t, probes, "cp-kill-probe", "the kill")
		// Leave the replica as it was: running, and unarmed.
		if armed.Running() {
			_ = armed.Stop(ctx)
		}
		if err := armed.StartReady(ctx); err != nil {
			t.Error(err)
		}
	}()

	if err := armed.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := armed.StartWith(failpoint.Env + "=" + failpoint.AfterSend); err != nil {
		t.Fatal(err)
	}
	if err := armed.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Restart(ctx); err != nil { // its agents move to armed
		t.Fatal(err)
	}
	var onArmed []string
	if err := box.Eventually(ctx, func() error {
		on, _, err := b.Connections(ctx)
		if err != nil {
			return err
		}
		onArmed = onArmed[:0]
		for node, c := range on {
			if c == armed {
				onArmed = append(onArmed, node)
			}
		}
		if len(onArmed) == 0 {
			return fmt.Errorf("no agent on %s: %v", armed.Name(), on)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	svc, _, err := b.CreateService(ctx, box.NewService("cp-killed"), podOn(b, 0))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-armed.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never reached failpoint %s\n%s", armed.Name(), failpoint.AfterSend, armed.LogTail(20))
	}
	if err := armed.ExitError(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("%s exited with %v, want killed at %s", armed.Name(), err, failpoint.AfterSend)
	}
	killed := time.Now()
	at, err := b.DialUntil(ctx, tp.PodNS(podOn(b, 2)), box.ClusterAddr(svc), "")
	if err != nil {
		t.Fatalf("the change never reached node-2 after the kill: %v", err)
	}
	versions, err := b.WaitProgrammed(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitResynced(ctx, t, b, versions)
	figure(t, "cp-killed-mid-stream", "moved=%s change-reached-node-2-after-kill=%s", strings.Join(onArmed, ","), ms(at.Sub(killed)))
}

// testCleanup runs `nodeagent --cleanup` in node-2, its agent stopped, as
// an operator leaving proxyplane (or going back to kube-proxy) would: no
// proxyplane rule is left in any mode, so node-2's pod no longer reaches
// web; the agent started again programs everything from its cache.
func (e *env) testCleanup(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	web := webService(t, e)
	a := b.Agents[2]
	podNS := tp.PodNS(podOn(b, 2))
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !a.Running() {
			_ = a.Start()
		}
	}()
	if out, err := tp.Exec(a.Node.NS(), a.Args()[0], "--cleanup"); err != nil {
		t.Fatalf("nodeagent --cleanup: %v\n%s", err, out)
	}
	for _, table := range []string{"nat", "filter"} {
		for _, save := range []string{"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save"} {
			if out, err := tp.Exec(a.Node.NS(), save, "-t", table); err == nil && strings.Contains(string(out), "PP-") {
				t.Errorf("%s -t %s still lists proxyplane's rules after cleanup:\n%s", save, table, out)
			}
		}
	}
	if out, err := tp.Exec(a.Node.NS(), "nft", "list", "tables"); err != nil || strings.Contains(string(out), "proxyplane") {
		t.Errorf("nft list tables after cleanup: %v\n%s", err, out)
	}
	if r, err := tp.DialTCP(podNS, box.ClusterAddr(web), probeTimeout); err == nil {
		t.Fatalf("node-2's pod reached web (%s) with every rule removed", r.Backend)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DialUntil(ctx, podNS, box.ClusterAddr(web), ""); err != nil {
		t.Fatalf("node-2 after its agent came back: %v\n%s", err, a.LogTail(20))
	}
}
