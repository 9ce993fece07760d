package deploy

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// TestControlplaneToleratesBootstrapTaints checks that nothing evicts or
// keeps out a control plane replica while its node waits for a CNI: the
// node lifecycle controller puts node.kubernetes.io/not-ready on both as
// NoSchedule and as NoExecute, and a toleration of NoSchedule alone gives
// the replica the default 300 s before eviction, after which it is
// recreated and evicted again for as long as the CNI is not up (and the
// CNI may be waiting for Service rules only the control plane supplies).
func TestControlplaneToleratesBootstrapTaints(t *testing.T) {
	var d appsv1.Deployment
	readManifest(t, "controlplane.yaml", "Deployment", &d)
	tolerations := d.Spec.Template.Spec.Tolerations
	for _, key := range []string{
		corev1.TaintNodeNotReady,
		corev1.TaintNodeNetworkUnavailable,
		"node.cloudprovider.kubernetes.io/uninitialized",
	} {
		for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
			taint := &corev1.Taint{Key: key, Effect: effect}
			i := tolerating(tolerations, taint)
			switch {
			case i < 0:
				t.Errorf("the control plane does not tolerate %s:%s", key, effect)
			case effect == corev1.TaintEffectNoExecute && tolerations[i].TolerationSeconds != nil:
				t.Errorf("the control plane tolerates %s:%s for only %d s", key, effect, *tolerations[i].TolerationSeconds)
			}
		}
	}
}

// TestAgentToleratesEverything checks the DaemonSet's promise: an agent
// on every node, whatever its taints.
func TestAgentToleratesEverything(t *testing.T) {
	var ds appsv1.DaemonSet
	readManifest(t, "nodeagent.yaml", "DaemonSet", &ds)
	for _, taint := range []*corev1.Taint{
		{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute},
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
		{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule},
	} {
		if i := tolerating(ds.Spec.Template.Spec.Tolerations, taint); i < 0 || ds.Spec.Template.Spec.Tolerations[i].TolerationSeconds != nil {
			t.Errorf("the agent does not tolerate %s:%s for good", taint.Key, taint.Effect)
		}
	}
}

// tolerating returns the index of the first toleration of taint, or -1.
func tolerating(tolerations []corev1.Toleration, taint *corev1.Taint) int {
	for i := range tolerations {
		if tolerations[i].ToleratesTaint(klog.Background(), taint, false) {
			return i
		}
	}
	return -1
}
