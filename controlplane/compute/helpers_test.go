package compute

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Builders for the Kubernetes objects that tests feed to Build, and
// decoders for what it produces. Every test Service starts as newService
// makes it and every test slice serves port "http" (TCP 8080) unless told
// otherwise, so that a table case only spells out what it is about.

const (
	testNamespace = "default"
	testName      = "web"
	testClusterIP = "10.96.0.10"
)

func ptr[T any](v T) *T { return &v }

// svcOpt changes a test Service.
type svcOpt func(*corev1.Service)

// newService returns Service default/web of type ClusterIP with cluster IP
// 10.96.0.10 and one port "http" (TCP 80 -> 8080), changed by opts.
func newService(opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: testName},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  testClusterIP,
			ClusterIPs: []string{testClusterIP},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withType(t corev1.ServiceType) svcOpt {
	return func(s *corev1.Service) { s.Spec.Type = t }
}

// withClusterIPs sets spec.clusterIPs and, as the API server does,
// spec.clusterIP to the first of them.
func withClusterIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ""
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
	}
}

func withPorts(ports ...corev1.ServicePort) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports = ports }
}

func withExternalIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

func withIngress(ing ...corev1.LoadBalancerIngress) svcOpt {
	return func(s *corev1.Service) { s.Status.LoadBalancer.Ingress = ing }
}

func withExternalLocal() svcOpt {
	return func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
}

func withInternalLocal() svcOpt {
	return func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	}
}

// withAffinity turns on ClientIP affinity; timeout nil leaves the
// configuration out.
func withAffinity(timeout *int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		if timeout != nil {
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{
				ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: timeout},
			}
		}
	}
}

func withLabel(k, v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[k] = v
	}
}

// nodePortService is newService as type NodePort with "http" on node port
// 30080.
func nodePortService(opts ...svcOpt) *corev1.Service {
	return newService(append([]svcOpt{
		withType(corev1.ServiceTypeNodePort),
		withPorts(corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}),
	}, opts...)...)
}

// svcPort is a service port; nodePort 0 means none.
func svcPort(name string, proto corev1.Protocol, port, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, NodePort: nodePort}
}

// epOpt changes a test endpoint.
type epOpt func(*discoveryv1.Endpoint)

// ep is a ready endpoint at ip, changed by opts. Its conditions are
// explicit, as the EndpointSlice controller writes them.
func ep(ip string, opts ...epOpt) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses: []string{ip},
		Conditions: discoveryv1.EndpointConditions{
			Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false),
		},
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func onNode(name string) epOpt {
	return func(e *discoveryv1.Endpoint) { e.NodeName = ptr(name) }
}

func forZones(zones ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func forNodes(nodes ...string) epOpt {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

// notReady makes an endpoint neither ready, serving nor terminating (a pod
// that is starting or failing its readiness probe).
func notReady() epOpt {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false), Terminating: ptr(false)}
	}
}

// terminating makes an endpoint terminating, still serving or not.
func terminating(serving bool) epOpt {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(serving), Terminating: ptr(true)}
	}
}

// noConditions leaves every condition unset, which means ready and serving.
func noConditions() epOpt {
	return func(e *discoveryv1.Endpoint) { e.Conditions = discoveryv1.EndpointConditions{} }
}

// slicePort is an EndpointSlice port; a nil name or protocol stays unset.
func slicePort(name *string, proto *corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: name, Protocol: proto, Port: ptr(port)}
}

// httpPort is the slice port that newService's "http" port matches.
func httpPort() []discoveryv1.EndpointPort {
	return []discoveryv1.EndpointPort{slicePort(ptr("http"), ptr(corev1.ProtocolTCP), 8080)}
}

// newSlice is an EndpointSlice of default/web.
func newSlice(name string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: testNamespace,
			Name:      name,
			Labels:    map[string]string{discoveryv1.LabelServiceName: testName},
		},
		AddressType: family,
		Ports:       ports,
		Endpoints:   eps,
	}
}

// httpSlice is an IPv4 slice serving "http" on 8080.
func httpSlice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return newSlice(name, discoveryv1.AddressTypeIPv4, httpPort(), eps...)
}

// withTrigger sets the last-change-trigger-time annotation of s.
func withTrigger(s *discoveryv1.EndpointSlice, v string) *discoveryv1.EndpointSlice {
	s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: v}
	return s
}

// mustBuild builds svc from slices and fails the test on error.
func mustBuild(t *testing.T, svc *corev1.Service, slices ...*discoveryv1.EndpointSlice) *Service {
	t.Helper()
	s, err := Build(svc, slices)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return s
}

// testNode is a node called name in zone ("" for no zone label).
func testNode(name, zone string) *Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if zone != "" {
		n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
	}
	return BuildNode(name, n)
}

// decode returns the Service message that e encodes: its shared part
// followed by its local part.
func decode(t *testing.T, e Entry) *pb.Service {
	t.Helper()
	if e.Shared == nil || e.Local == nil {
		t.Fatalf("entry has a nil part: %+v", e)
	}
	// Copy: appending to a shared part's bytes could write into its spare
	// capacity, which other nodes' entries share.
	b := slices.Concat(e.Shared.Bytes, e.Local.Bytes)
	var out pb.Service
	if err := proto.Unmarshal(b, &out); err != nil {
		t.Fatalf("decoding entry: %v", err)
	}
	return &out
}

// viewFor is n's view of s, decoded.
func viewFor(t *testing.T, s *Service, n *Node) *pb.Service {
	t.Helper()
	return decode(t, s.EntryFor(n))
}

// checkProto fails the test when got and want differ, showing both.
func checkProto(t *testing.T, what string, got, want proto.Message) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Errorf("%s differs\ngot:\n%s\nwant:\n%s", what,
			prototext.MarshalOptions{Multiline: true}.Format(got),
			prototext.MarshalOptions{Multiline: true}.Format(want))
	}
}

// ready is the expected encoding of a ready endpoint.
func ready(ip string, port int32) *pb.Endpoint {
	return &pb.Endpoint{Ip: ip, Port: port, Ready: true, Serving: true}
}

// servingTerminating is the expected encoding of a serving, terminating
// endpoint.
func servingTerminating(ip string, port int32) *pb.Endpoint {
	return &pb.Endpoint{Ip: ip, Port: port, Serving: true, Terminating: true}
}

// wantPort is the expected endpoint list of one port.
func wantPort(name string, eps ...*pb.Endpoint) *pb.PortEndpoints {
	return &pb.PortEndpoints{PortName: name, Endpoints: eps}
}

// ipsOf lists the endpoint IPs of port name in lists, or nil when the port
// has no entry.
func ipsOf(lists []*pb.PortEndpoints, name string) []string {
	for _, pe := range lists {
		if pe.GetPortName() == name {
			var ips []string
			for _, e := range pe.GetEndpoints() {
				ips = append(ips, e.GetIp())
			}
			return ips
		}
	}
	return nil
}

// wantFrontend is the expected view of newService() without endpoints;
// change it with edit.
func wantFrontend(edit func(*pb.Service)) *pb.Service {
	s := &pb.Service{
		Namespace:             testNamespace,
		Name:                  testName,
		Type:                  pb.ServiceType_SERVICE_TYPE_CLUSTER_IP,
		ClusterIps:            []string{testClusterIP},
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		Ports: []*pb.ServicePort{{
			Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80,
		}},
	}
	if edit != nil {
		edit(s)
	}
	return s
}
