package scenarios

import (
	"context"
	"fmt"
	"strings"
	"testing"

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
