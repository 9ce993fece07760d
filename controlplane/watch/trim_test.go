package watch

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// TestTrimServicesAndSlices checks that the caches hold no more of a
// Service and its EndpointSlices than the tables are computed from (the
// informers hold every one of them, 10,000 of each at scenario L), and
// that what they hold computes the same Service, trigger time, problems,
// slice index and control plane addresses as the objects as the API
// server sent them.
func TestTrimServicesAndSlices(t *testing.T) {
	meta := func(name string, labels, annotations map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Namespace: "default", Name: name, UID: types.UID("uid-" + name), ResourceVersion: "42",
			Labels: labels, Annotations: annotations, Finalizers: []string{"f"},
			CreationTimestamp: metav1.Time{Time: time.Unix(1, 0)}, Generation: 3,
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "web", UID: "uid-web"}},
		}
	}
	svc := &corev1.Service{
		ObjectMeta: meta("web", map[string]string{"app": "web"},
			map[string]string{corev1.LastAppliedConfigAnnotation: `{"a big":"copy of the object"}`}),
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Selector:              map[string]string{"app": "web"},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 30001,
			Ports: []corev1.ServicePort{
				{Name: compute.ControlPlanePortName, Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
			},
		},
		Status: corev1.ServiceStatus{
			LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "203.0.113.9"}}},
			Conditions:   []metav1.Condition{{Type: "x", Status: metav1.ConditionTrue}},
		},
	}
	endpoint := func(ip, node, zone string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To(node), Zone: ptr.To(zone), Hostname: ptr.To("h-" + ip),
			TargetRef:          &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web-" + ip, UID: "pod-uid"},
			DeprecatedTopology: map[string]string{corev1.LabelTopologyZone: zone},
			Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		}
	}
	slice := func(name, trigger string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: meta(name, map[string]string{
				discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io", "app": "web",
			}, map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger, "other": "annotation"}),
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To(compute.ControlPlanePortName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)},
			},
			Endpoints: eps,
		}
	}
	sls := []*discoveryv1.EndpointSlice{
		slice("web-1", "2026-11-27T10:00:00Z", endpoint("10.0.0.1", "node-a", "zone-a"), endpoint("10.0.0.2", "node-b", "zone-b")),
		slice("web-2", "2026-11-27T11:00:00Z", endpoint("10.0.0.3", "node-c", "zone-c")),
	}

	// As the API server sent them.
	sent := svc.DeepCopy()
	sentSlices := make([]*discoveryv1.EndpointSlice, len(sls))
	for i, s := range sls {
		sentSlices[i] = s.DeepCopy()
	}
	out, err := trim(svc)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Service)
	var gotSlices []*discoveryv1.EndpointSlice
	for _, s := range sls {
		out, err := trim(s)
		if err != nil {
			t.Fatal(err)
		}
		gotSlices = append(gotSlices, out.(*discoveryv1.EndpointSlice))
	}

	if got.Labels != nil || got.Annotations != nil || got.Spec.Selector != nil || got.ManagedFields != nil ||
		got.OwnerReferences != nil || got.Finalizers != nil || got.Status.Conditions != nil {
		t.Errorf("trimmed Service kept what no table uses: %+v", got)
	}
	for _, s := range gotSlices {
		if len(s.Labels) != 1 || len(s.Annotations) != 1 || s.OwnerReferences != nil || s.ManagedFields != nil {
			t.Errorf("trimmed slice %s kept metadata no table uses: %+v", s.Name, s.ObjectMeta)
		}
		for _, e := range s.Endpoints {
			if e.TargetRef != nil || e.Hostname != nil || e.Zone != nil || e.DeprecatedTopology != nil {
				t.Errorf("trimmed slice %s kept endpoint fields no table uses: %+v", s.Name, e)
			}
		}
	}

	want, wantProblems := compute.BuildReport(sent, sentSlices)
	have, haveProblems := compute.BuildReport(got, gotSlices)
	if want == nil || !have.Equal(want) || !have.TriggerTime.Equal(want.TriggerTime) || !slices.Equal(haveProblems, wantProblems) {
		t.Errorf("trimming changed the Service computed: %+v (%v), want %+v (%v)", have, haveProblems, want, wantProblems)
	}
	if compute.SkipReason(got) != compute.SkipReason(sent) {
		t.Errorf("trimming changed SkipReason")
	}
	for i := range gotSlices {
		k1, err1 := sliceService(gotSlices[i])
		k2, err2 := sliceService(sentSlices[i])
		if err1 != nil || err2 != nil || !slices.Equal(k1, k2) {
			t.Errorf("trimming changed slice %s's index: %v, want %v", gotSlices[i].Name, k1, k2)
		}
	}
	a1 := compute.BuildControlPlaneAddresses(got, gotSlices, compute.ControlPlanePortName)
	a2 := compute.BuildControlPlaneAddresses(sent, sentSlices, compute.ControlPlanePortName)
	if a2 == nil || !a1.Equal(a2) {
		t.Errorf("trimming changed the control plane addresses: %v, want %v", a1.List(), a2.List())
	}

	// A Service another proxy handles keeps the label that says so.
	other := sent.DeepCopy()
	other.Labels[compute.LabelServiceProxyName] = "other"
	if out, err = trim(other); err != nil || compute.SkipReason(out.(*corev1.Service)) == "" {
		t.Errorf("trimming lost %s (%v)", compute.LabelServiceProxyName, err)
	}
}
