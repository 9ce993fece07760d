package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyplane/proxyplane/e2e/box"
)

// testNodeBeingDeleted checks kube-proxy's nodeEligible end to end: the
// cluster autoscaler's taint on a Node reaches its agent through the
// control plane, and the agent's /healthz answers 503 saying
// "nodeEligible":false, so that load balancers drain the node; without the
// taint it is healthy again. Forwarding is not affected: the table is the
// same but for the node's flag.
func (e *env) testNodeBeingDeleted(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	a := b.Agents[0]
	node := a.Node.Name()
	taint := func(on bool) {
		t.Helper()
		taints := "[]"
		if on {
			taints = `[{"key":"ToBeDeletedByClusterAutoscaler","value":"1700000000","effect":"NoSchedule"}]`
		}
		patch := fmt.Sprintf(`{"spec":{"taints":%s}}`, taints)
		if _, err := b.Admin().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	healthz := func(ctx context.Context, wantOK bool) error {
		body, err := a.Healthz(ctx)
		switch {
		case wantOK && err != nil:
			return fmt.Errorf("/healthz: %w", err)
		case !wantOK && err == nil:
			return fmt.Errorf("/healthz answers 200 (%s)", strings.TrimSpace(body))
		case !wantOK && !strings.Contains(err.Error(), `"nodeEligible":false`):
			return fmt.Errorf("/healthz fails without saying the node is not eligible: %w", err)
		}
		return nil
	}

	taint(true)
	defer func() {
		if n, err := b.Admin().CoreV1().Nodes().Get(context.WithoutCancel(ctx), node, metav1.GetOptions{}); err == nil && len(n.Spec.Taints) > 0 {
			n.Spec.Taints = []corev1.Taint{}
			_, _ = b.Admin().CoreV1().Nodes().Update(context.WithoutCancel(ctx), n, metav1.UpdateOptions{})
		}
	}()
	if err := box.Eventually(ctx, func() error { return healthz(ctx, false) }); err != nil {
		t.Fatalf("tainted %s: %v", node, err)
	}
	taint(false)
	if err := box.Eventually(ctx, func() error { return healthz(ctx, true) }); err != nil {
		t.Fatalf("untainted %s: %v", node, err)
	}
}

// healthBody is the part of kube-proxy's /healthz body the scenarios read.
type healthBody struct {
	Healthy          bool       `json:"healthy"`
	NodeEligible     *bool      `json:"nodeEligible"`
	ControlPlaneLost *time.Time `json:"controlPlaneLost"`
}

// testControlPlaneAwayHealthy stops every control plane replica with the
// agents run as deploy/ ships them (no --control-plane-timeout): while no
// replica answers, /healthz stays 200 on every node (kube-proxy never
// fails it for the API server's absence; a timeout would take every node
// out of every load balancer at once), its body saying since when the
// control plane is lost, so the agents did notice; the table's age grows
// in proxyplane_agent_control_plane_last_answered_timestamp_seconds
// instead; and traffic keeps flowing. An agent that starts meanwhile
// without a cache, as on a fresh install before any replica is ready, is
// live (no restart loop) but neither ready nor eligible until its first
// table arrives. The outage lasts a bounded number of probe dials: the
// default has no timer to wait for, only wiring to prove.
func (e *env) testControlPlaneAwayHealthy(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	web := webService(t, e)
	probe := b.StartProbe(tp.ClientNS(), box.ClusterAddr(web), probeInterval, probeTimeout, probeMaxDials)
	stopped := false
	defer func() {
		if !stopped {
			probe.Stop()
		}
	}()
	if err := probe.WaitDials(ctx, 5); err != nil {
		t.Fatal(err)
	}

	if err := b.StopControlPlanes(ctx); err != nil {
		t.Fatal(err)
	}
	// The next scenarios need the replicas whatever happens here.
	t.Cleanup(func() {
		if err := b.StartControlPlanes(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("restarting the replicas: %v", err)
		}
	})
	lastAnswered := map[string]float64{}
	err := box.Eventually(ctx, func() error {
		for _, a := range b.Agents {
			m, err := a.Metrics(ctx)
			if err != nil {
				return err
			}
			if m.Value("proxyplane_agent_connected") != 0 {
				return fmt.Errorf("%s still reports a control plane stream", a.Name())
			}
			lastAnswered[a.Name()] = m.Value("proxyplane_agent_control_plane_last_answered_timestamp_seconds")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// An agent starting without a cache while no replica answers.
	fresh := b.Agents[len(b.Agents)-1]
	if err := fresh.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fresh.ResetState(); err != nil {
		t.Fatal(err)
	}
	if err := fresh.Start(); err != nil {
		t.Fatal(err)
	}
	if err := fresh.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}

	// Every node, once every few probe dials for outageDials dials:
	// /healthz 200 and healthy on the others, the fresh agent live, not
	// ready, not eligible.
	const dialsPerRound = 5
	rounds := 0
	for ; rounds < outageDials/dialsPerRound; rounds++ {
		if err := probe.WaitDials(ctx, dialsPerRound); err != nil {
			t.Fatal(err)
		}
		for _, a := range b.Agents {
			if a == fresh {
				checkWaitingForFirstTable(ctx, t, a)
				continue
			}
			raw, err := a.Healthz(ctx)
			if err != nil {
				t.Fatalf("%s: /healthz with every replica down and shipped defaults: %v", a.Name(), err)
			}
			var body healthBody
			if err := json.Unmarshal([]byte(raw), &body); err != nil {
				t.Fatalf("%s: /healthz body %q: %v", a.Name(), raw, err)
			}
			if !body.Healthy || body.NodeEligible == nil || !*body.NodeEligible || body.ControlPlaneLost == nil {
				t.Fatalf("%s: /healthz body %s: want healthy, eligible, and since when the control plane is lost", a.Name(), raw)
			}
		}
	}
	for _, a := range b.Agents {
		if a == fresh {
			continue
		}
		m, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Value("proxyplane_agent_control_plane_last_answered_timestamp_seconds"); got != lastAnswered[a.Name()] || got == 0 {
			t.Errorf("%s: the control plane's last answer moved from %v to %v while none answered", a.Name(), lastAnswered[a.Name()], got)
		}
	}

	if err := b.StartControlPlanes(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, a := range b.Agents {
		for _, path := range []string{"/healthz", "/livez", "/readyz"} {
			if err := box.Eventually(ctx, func() error { _, err := a.HealthPath(ctx, path); return err }); err != nil {
				t.Errorf("%s once the replicas are back: %v", a.Name(), err)
			}
		}
	}
	r := probe.Stop()
	stopped = true
	figure(t, "cp-away-healthz", "nodes=%d rounds=%d dials=%d failed=%d", len(b.Agents), rounds, r.Dials, r.Failures)
	if r.Failures > 0 {
		t.Errorf("%d of %d connections failed while the control plane was away: %v", r.Failures, r.Dials, r.Errors)
	}
}

// checkWaitingForFirstTable fails t unless a, started without a cache
// and without a control plane, is live, not ready, and not eligible.
func checkWaitingForFirstTable(ctx context.Context, t *testing.T, a *box.Agent) {
	t.Helper()
	if _, err := a.HealthPath(ctx, "/livez"); err != nil {
		t.Fatalf("%s waiting for its first table: /livez %v, want 200 (a liveness probe would restart it)", a.Name(), err)
	}
	if _, err := a.HealthPath(ctx, "/readyz"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("%s waiting for its first table: /readyz %v, want 503", a.Name(), err)
	}
	if _, err := a.Healthz(ctx); err == nil || !strings.Contains(err.Error(), `"nodeEligible":false`) {
		t.Fatalf("%s waiting for its first table: /healthz %v, want 503 with nodeEligible false", a.Name(), err)
	}
}
