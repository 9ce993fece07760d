package box

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/internal/nstest"
)

// Where the box's Services live and what they forward to.
const (
	// Namespace holds the Services that the box's helpers create.
	Namespace = "e2e"
	// ServicePort is the port of every helper-made Service, TCP and UDP.
	ServicePort = 80
	// BackendPort is where every pod serves TCP and UDP (nstest's servers,
	// answering with the pod's name).
	BackendPort = 8080
)

// dialIn returns a dial function that opens connections from inside
// network namespace ns: the test process lives in the root namespace, and
// the API server and the control planes listen in host-0's. Sockets keep
// the namespace they were created in, so only the dial needs to enter it.
func dialIn(tp *nstest.Topology, ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := tp.Do(ns, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("dialing %s from namespace %s: %w", addr, ns, err)
		}
		return c, nil
	}
}

// inNamespace returns a copy of cfg that reaches the API server from
// inside ns, without client-side rate limiting: client-go's default, 5
// requests a second, would pace a test's writes (a Get and an Update per
// EndpointSlice) at 200 ms each, and every latency measured from a
// trigger time would include that queueing.
func inNamespace(cfg *rest.Config, tp *nstest.Topology, ns string) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Dial = dialIn(tp, ns)
	cfg.QPS = -1
	return cfg
}

// zoneName returns node k's zone: zone-a, zone-b, ...
func zoneName(k int) string { return "zone-" + string(rune('a'+k)) }

// nodeObject returns the Node object for n, in zone zone, with its pod
// CIDRs, as the kubelet and the node IPAM controller would leave it.
func nodeObject(n *nstest.Node, zone string) *corev1.Node {
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name(),
			Labels: map[string]string{
				corev1.LabelTopologyZone: zone,
				corev1.LabelHostname:     n.Name(),
				corev1.LabelOSStable:     "linux",
			},
		},
	}
	for _, p := range n.PodCIDRs() {
		obj.Spec.PodCIDRs = append(obj.Spec.PodCIDRs, p.String())
	}
	obj.Spec.PodCIDR = obj.Spec.PodCIDRs[0]
	return obj
}

// NewService returns a ClusterIP Service named name in Namespace with a
// TCP and a UDP port, ServicePort, to BackendPort, named "tcp" and "udp".
// It asks for both families where the cluster has them.
func NewService(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeClusterIP,
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack),
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: ServicePort, TargetPort: intstr.FromInt32(BackendPort)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: ServicePort, TargetPort: intstr.FromInt32(BackendPort)},
			},
		},
	}
}

// CreateService creates svc (see NewService) and its EndpointSlices
// listing pods as ready endpoints, as the EndpointSlice controller would
// (none runs in the box). It returns the Service as created, with its
// ClusterIPs, and the trigger time stamped on the slices.
func (b *Box) CreateService(ctx context.Context, svc *corev1.Service, pods ...int) (*corev1.Service, time.Time, error) {
	created, err := b.admin.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: FieldManager})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("creating Service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	trigger := time.Now()
	for _, s := range b.EndpointSlices(created, trigger, pods...) {
		if _, err := b.admin.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
			return nil, time.Time{}, fmt.Errorf("creating EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return created, trigger, nil
}

// SetEndpoints replaces the endpoints of svc (made by CreateService) with
// pods, stamping endpoints.kubernetes.io/last-change-trigger-time with the
// time just before the write, which it returns: the start of the
// network-programming latency, as upstream's controller defines it.
func (b *Box) SetEndpoints(ctx context.Context, svc *corev1.Service, pods ...int) (time.Time, error) {
	trigger := time.Now()
	for _, s := range b.EndpointSlices(svc, trigger, pods...) {
		cur, err := b.admin.DiscoveryV1().EndpointSlices(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = b.admin.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: FieldManager})
		case err == nil:
			s.ResourceVersion = cur.ResourceVersion
			_, err = b.admin.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{FieldManager: FieldManager})
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("writing EndpointSlice %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return trigger, nil
}

// EndpointSlices returns, for each family of svc, one slice named
// "<service>-ipv4" or "<service>-ipv6" listing pods as ready endpoints on their nodes and
// zones, with the ports NewService's ports target and trigger as the
// last-change-trigger-time.
func (b *Box) EndpointSlices(svc *corev1.Service, trigger time.Time, pods ...int) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range svc.Spec.IPFamilies {
		at := discoveryv1.AddressTypeIPv4
		if fam == corev1.IPv6Protocol {
			at = discoveryv1.AddressTypeIPv6
		}
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Namespace:   svc.Namespace,
				Name:        svc.Name + "-" + strings.ToLower(string(at)),
				Labels:      map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: FieldManager},
				Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)},
			},
			AddressType: at,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](BackendPort)},
				{Name: ptr.To("udp"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](BackendPort)},
			},
			// Never nil: an empty list is how a Service without endpoints
			// looks, and the API server requires the field.
			Endpoints: []discoveryv1.Endpoint{},
		}
		for _, i := range pods {
			addr := b.tp.PodIP(i)
			if at == discoveryv1.AddressTypeIPv6 {
				addr = b.tp.PodIPv6(i)
			}
			node := b.tp.PodNode(i)
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{addr.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
				NodeName:   ptr.To(node.Name()),
				Zone:       ptr.To(b.zones[node.Name()]),
			})
		}
		out = append(out, s)
	}
	return out
}

// ClusterAddr returns "ClusterIP:ServicePort" of svc's first ClusterIP
// (IPv4 when it has one), for DialTCP and DialUDP.
func ClusterAddr(svc *corev1.Service) string {
	return net.JoinHostPort(svc.Spec.ClusterIPs[0], strconv.Itoa(ServicePort))
}

// restConfigFrom loads a kubeconfig file.
func restConfigFrom(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", path, err)
	}
	return cfg, nil
}
