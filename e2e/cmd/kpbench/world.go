package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"log"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// The world both proxies program: n NodePort Services (so each also has
// an external chain) with one TCP port and a number of ready endpoints
// (3 in the --sizes worlds, as BenchmarkSync's scaleServices; 50 or 25 in
// the endpoint-heavy ones) on another node, Cluster traffic policies, no
// affinity, except that NodePorts are all distinct (the API server
// allocates them).
const (
	namespace    = "kpbench"
	nodeName     = "kpbench-node"
	endpointNode = "kpbench-worker"
	portName     = "http"
	servicePort  = 80
	targetPort   = 8080
	firstNode    = 30000
	// clusterCIDR is kube-proxy's --cluster-cidr and the Dataplane's
	// ClusterCIDRs: traffic from it is not masqueraded.
	clusterCIDR = "10.0.0.0/8"
	// firstClusterIP leaves 10.96.0.1 (the kubernetes Service) and the
	// low addresses of the API server's 10.96.0.0/16 alone.
	firstClusterIP = "10.96.0.16"
	firstEndpoint  = "10.128.0.1"
	// changedEndpoint is where the changed Service's first endpoint goes
	// back and forth in one-Service updates: .1, .2, .1, ...
	changedEndpoint = "10.64.0.1"
)

// defaultEndpoints is the endpoints per Service of the --sizes worlds.
const defaultEndpoints = 3

// world is a number of Services with as many endpoints each.
type world struct {
	Services, Endpoints int
}

// String is "5,000 x 50".
func (w world) String() string { return thousands(w.Services) + " x " + strconv.Itoa(w.Endpoints) }

// parseWorld parses "SxE", as 5000x50: S Services of E endpoints.
func parseWorld(s string) (world, error) {
	a, b, ok := strings.Cut(s, "x")
	if !ok {
		return world{}, fmt.Errorf("world %q: want SERVICESxENDPOINTS, as 5000x50", s)
	}
	n, err1 := strconv.Atoi(a)
	e, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil {
		return world{}, fmt.Errorf("world %q: want SERVICESxENDPOINTS, as 5000x50", s)
	}
	return world{Services: n, Endpoints: e}, nil
}

func serviceName(i int) string { return "svc-" + strconv.Itoa(i) }

// changedService is the Service whose endpoint changes in a world of n.
func changedService(n int) int { return n / 2 }

// addrAdd returns a + off, IPv4.
func addrAdd(a string, off int) netip.Addr {
	b := netip.MustParseAddr(a).As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func clusterIP(i int) netip.Addr { return addrAdd(firstClusterIP, i) }

func nodePort(i int) int32 { return int32(firstNode + i) }

// endpoints returns the per endpoint addresses of Service i (in a world
// of per endpoints per Service); change >= 0 replaces the first with the
// change'th alternate address. 10.128.0.0/9 holds 8 million.
func endpoints(i, per, change int) []netip.Addr {
	out := make([]netip.Addr, per)
	for j := range out {
		out[j] = addrAdd(firstEndpoint, i*per+j)
	}
	if change >= 0 {
		out[0] = addrAdd(changedEndpoint, change%2)
	}
	return out
}

// nodePortRange is the API server's --service-node-port-range for worlds
// of up to n Services and the one added (addedService; the default range
// holds 2,768).
func nodePortRange(n int) string {
	return fmt.Sprintf("%d-%d", firstNode, max(firstNode+n, 32767))
}

// addedService is the Service added to a world of n, and removed again.
func addedService(n int) int { return n }

// ---- Kubernetes objects ----------------------------------------------------

func apiService(i int) *corev1.Service {
	ip := clusterIP(i).String()
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName(i), Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeNodePort,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{
				Name: portName, Protocol: corev1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(targetPort), NodePort: nodePort(i),
			}},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
			InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyCluster),
			SessionAffinity:       corev1.ServiceAffinityNone,
		},
	}
}

func apiSlice(i, per, change int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: serviceName(i), Namespace: namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: serviceName(i),
				discoveryv1.LabelManagedBy:   "kpbench",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To(portName), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](targetPort),
		}},
	}
	for _, a := range endpoints(i, per, change) {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(endpointNode),
		})
	}
	return s
}

// setupCluster creates the namespace and the Node kube-proxy runs as, with
// nodeIP as its InternalIP (kube-proxy's primary node IP, which its
// nftables mode serves NodePorts on).
func setupCluster(ctx context.Context, cs kubernetes.Interface, nodeIP netip.Addr) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace: %w", err)
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelHostname: nodeName}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node: %w", err)
	}
	created.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: nodeIP.String()},
		{Type: corev1.NodeHostName, Address: nodeName},
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting node addresses: %w", err)
	}
	return nil
}

// createServices creates Services [from, to) and their EndpointSlices of
// per endpoints with workers in parallel.
func createServices(ctx context.Context, cs kubernetes.Interface, from, to, per, workers int) error {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := createOne(ctx, cs, i, per); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
feed:
	for i := from; i < to; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	log.Printf("created Services %d to %d with their EndpointSlices in %v", from, to-1, time.Since(start).Round(time.Millisecond))
	return nil
}

func createOne(ctx context.Context, cs kubernetes.Interface, i, per int) error {
	if _, err := cs.CoreV1().Services(namespace).Create(ctx, apiService(i), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Service %d: %w", i, err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(namespace).Create(ctx, apiSlice(i, per, -1), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating EndpointSlice %d: %w", i, err)
	}
	return nil
}

// deleteService deletes Service i and its EndpointSlice.
func deleteService(ctx context.Context, cs kubernetes.Interface, i int) error {
	if err := cs.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, serviceName(i), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting EndpointSlice %d: %w", i, err)
	}
	if err := cs.CoreV1().Services(namespace).Delete(ctx, serviceName(i), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Service %d: %w", i, err)
	}
	return nil
}

// setEndpoints rewrites Service i's EndpointSlice with endpoints(i, per,
// change).
func setEndpoints(ctx context.Context, cs kubernetes.Interface, i, per, change int) error {
	slices := cs.DiscoveryV1().EndpointSlices(namespace)
	cur, err := slices.Get(ctx, serviceName(i), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting EndpointSlice %d: %w", i, err)
	}
	want := apiSlice(i, per, change)
	cur.Endpoints = want.Endpoints
	if _, err := slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating EndpointSlice %d: %w", i, err)
	}
	return nil
}

// ---- proxyplane's table ------------------------------------------------------

// pbService is Service i as the control plane sends it to every node.
func pbService(i, per, change int) *pb.Service {
	pe := &pb.PortEndpoints{PortName: portName}
	for _, a := range endpoints(i, per, change) {
		pe.Endpoints = append(pe.Endpoints, &pb.Endpoint{Ip: a.String(), Port: targetPort, Ready: true, Serving: true})
	}
	return &pb.Service{
		Namespace: namespace, Name: serviceName(i),
		Type:                  pb.ServiceType_SERVICE_TYPE_NODE_PORT,
		ClusterIps:            []string{clusterIP(i).String()},
		ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		InternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
		Ports:                 []*pb.ServicePort{{Name: portName, Protocol: pb.Protocol_PROTOCOL_TCP, Port: servicePort, NodePort: nodePort(i), HasEndpoints: true}},
		ClusterEndpoints:      []*pb.PortEndpoints{pe},
	}
}

// entry wraps s with its key and a content hash, as the control plane does
// (with another hash function: the agent only adds them up).
func entry(s *pb.Service) *pb.ServiceEntry {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	if err != nil {
		panic(err)
	}
	h := fnv.New64a()
	_, _ = h.Write(b)
	return &pb.ServiceEntry{Key: s.Namespace + "/" + s.Name, Hash: h.Sum64(), Service: s}
}

func version(sum uint64) string { return fmt.Sprintf("%016x", sum) }

// ppTable returns the node's table of world w.
func ppTable(node *pb.NodeInfo, w world) (*proxytable.Table, error) {
	entries := make([]*pb.ServiceEntry, w.Services)
	sum := node.GetHash()
	for i := range w.Services {
		entries[i] = entry(pbService(i, w.Endpoints, -1))
		sum += entries[i].GetHash()
	}
	return proxytable.FromEntries(version(sum), node, entries)
}

// ppChange applies Service i's change'th endpoint change to t (a world of
// per endpoints per Service), as a delta from the control plane, and
// returns the new table and the changed keys.
func ppChange(t *proxytable.Table, i, per, change int) (*proxytable.Table, []string, error) {
	return ppUpsert(t, entry(pbService(i, per, change)), true)
}

// ppAdd adds Service i (of per endpoints) to t, as a delta from the
// control plane.
func ppAdd(t *proxytable.Table, i, per int) (*proxytable.Table, []string, error) {
	return ppUpsert(t, entry(pbService(i, per, -1)), false)
}

// ppUpsert applies a delta upserting e; replace says e's Service must be
// in t already, and must not be otherwise.
func ppUpsert(t *proxytable.Table, e *pb.ServiceEntry, replace bool) (*proxytable.Table, []string, error) {
	sum, err := strconv.ParseUint(t.Version, 16, 64)
	if err != nil {
		return nil, nil, err
	}
	old, ok := t.Entries[e.GetKey()]
	if ok != replace {
		return nil, nil, fmt.Errorf("upserting %s: in the table %v, want %v", e.GetKey(), ok, replace)
	}
	if ok {
		sum -= old.GetHash()
	}
	sum += e.GetHash()
	return t.Apply(&pb.Delta{BaseVersion: t.Version, Version: version(sum), Upserts: []*pb.ServiceEntry{e}})
}
