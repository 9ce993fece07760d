package watch

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func svc(name, clusterIP string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
}

func slice(name, service string, addrs ...string) *discoveryv1.EndpointSlice {
	port, portName := int32(8080), "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return s
}

// waitWorld waits until the store's world satisfies cond.
func waitWorld(t *testing.T, store *table.Store, what string, cond func(*table.World) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if w := store.Current(); w != nil && cond(w) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func endpointsOf(w *table.World, key string) int {
	s := w.Service(key)
	if s == nil {
		return -1
	}
	n := compute.BuildNode("node-1", nil)
	return s.EntryFor(n).Size()
}

// start runs a Watcher on a fake clientset holding objs, logging to log,
// and waits for the first world and for all four watches.
func start(ctx context.Context, t *testing.T, log *slog.Logger, objs ...runtime.Object) (*fake.Clientset, *table.Store, *Watcher, <-chan error) {
	t.Helper()
	return startWith(ctx, t, log, nil, objs...)
}

// startWith is start with configure, when not nil, called on the Watcher
// before Run.
func startWith(ctx context.Context, t *testing.T, log *slog.Logger, configure func(*Watcher), objs ...runtime.Object) (*fake.Clientset, *table.Store, *Watcher, <-chan error) {
	t.Helper()
	client := fake.NewClientset(objs...)
	// The fake clientset drops events made before a watch is established
	// (it has no resource versions), so wait for all four watches.
	watching := make(chan struct{}, 4)
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		gvr := action.GetResource()
		ns := action.GetNamespace()
		w, err := client.Tracker().Watch(gvr, ns)
		if err != nil {
			return false, nil, err
		}
		watching <- struct{}{}
		return true, w, nil
	})
	store := table.NewStore(100)
	w, err := New(client, store, 0, log)
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(w)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	select {
	case <-store.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("store never became ready")
	}
	for range 4 {
		select {
		case <-watching:
		case <-time.After(10 * time.Second):
			t.Fatal("informers never started watching")
		}
	}
	return client, store, w, done
}

func TestWatcher(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, store, _, done := start(ctx, t, slog.New(slog.DiscardHandler),
		svc("web", "10.96.0.10", nil),
		slice("web-1", "web", "10.244.0.5"),
		// Handled by another proxy, and headless: the informers' label
		// selector and compute.SkipReason keep both out of every table.
		svc("other", "10.96.0.11", map[string]string{compute.LabelServiceProxyName: "foo"}),
		svc("headless", corev1.ClusterIPNone, nil),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{corev1.LabelTopologyZone: "z1"}}},
	)
	world := store.Current()
	if world.Len() != 1 || world.Service("default/web") == nil {
		t.Fatalf("first world has %d services (%v); want only default/web", world.Len(), world.Keys())
	}
	if !world.Known("node-1") || world.Node("node-1").Zone != "z1" {
		t.Errorf("node-1 not known with its zone: %+v", world.Node("node-1"))
	}

	// A slice change recomputes the Service.
	before := endpointsOf(world, "default/web")
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("web-1", "web", "10.244.0.5", "10.244.0.6"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "the second endpoint", func(w *table.World) bool { return endpointsOf(w, "default/web") > before })

	// Deleting a Service removes it; deleting a Node forgets it.
	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "node-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "web and node-1 gone", func(w *table.World) bool {
		return w.Service("default/web") == nil && !w.Known("node-1")
	})

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// endpointIPs decodes the Service under key as node-1 sees it and lists
// its endpoint addresses.
func endpointIPs(t *testing.T, w *table.World, key string) []string {
	t.Helper()
	e := w.Service(key).EntryFor(compute.BuildNode("node-1", nil))
	var s pb.Service
	if err := proto.Unmarshal(slices.Concat(e.Shared.Bytes, e.Local.Bytes), &s); err != nil {
		t.Fatalf("decoding %s: %v", key, err)
	}
	var ips []string
	for _, pe := range s.GetClusterEndpoints() {
		for _, ep := range pe.GetEndpoints() {
			ips = append(ips, ep.GetIp())
		}
	}
	return ips
}

// waitEvents waits until the watcher's events satisfy cond.
func waitEvents(t *testing.T, w *Watcher, what string, cond func([]*pb.Event) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond(w.Events().GetEvents()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; events: %v", what, w.Events().GetEvents())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// eventsAre reports whether events name exactly these objects, in order,
// each as "Kind namespace/name reason".
func eventsAre(events []*pb.Event, want ...string) bool {
	got := make([]string, 0, len(events))
	for _, e := range events {
		got = append(got, e.GetKind()+" "+e.GetNamespace()+"/"+e.GetName()+" "+e.GetReason())
	}
	return slices.Equal(got, want)
}

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex // guards records
	records []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

// count counts the records at level with message msg whose attribute key
// has value v.
func (r *logRecorder) count(level slog.Level, msg, key, v string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		if rec.Level != level || rec.Message != msg {
			continue
		}
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == key && a.Value.String() == v {
				n++
				return false
			}
			return true
		})
	}
	return n
}

// gaugeValue reads g through a registry of its own.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(g)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gathering %v: %d families, %v", g.Desc(), len(mfs), err)
	}
	return mfs[0].GetMetric()[0].GetGauge().GetValue()
}

// TestWatcherDroppedValue checks that a Service with an invalid external
// IP is published without it, as upstream proxies it, and that the value
// is listed as an InvalidValue event and logged once.
func TestWatcherDroppedValue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	web := svc("web", "10.96.0.10", nil)
	web.Spec.ExternalIPs = []string{"192.0.2.1", "192.0.2.300"}
	logs := &logRecorder{}
	_, store, w, done := start(ctx, t, slog.New(logs), web, slice("web-1", "web", "10.244.0.5"))
	e := store.Current().Service("default/web")
	if e == nil {
		t.Fatalf("default/web left out; want it published without its bad external IP")
	}
	var got pb.Service
	entry := e.EntryFor(compute.BuildNode("node-1", nil))
	if err := proto.Unmarshal(slices.Concat(entry.Shared.Bytes, entry.Local.Bytes), &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.GetExternalIps(), []string{"192.0.2.1"}) {
		t.Errorf("external IPs = %v, want the valid one", got.GetExternalIps())
	}
	waitEvents(t, w, "the dropped value listed", func(ev []*pb.Event) bool {
		return eventsAre(ev, "Service default/web "+compute.ReasonInvalidValue)
	})
	if m := w.Events().GetEvents()[0].GetMessage(); !strings.Contains(m, `"192.0.2.300"`) {
		t.Errorf("event message %q does not name the bad value", m)
	}
	if n := logs.count(slog.LevelWarn, "service values left out, the rest proxied", "service", "default/web"); n != 1 {
		t.Errorf("the dropped value was logged %d times, want once", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestWatcherInvalidObjects checks that an invalid Service is left out and
// an invalid slice endpoint dropped, each listed as an event and logged
// once, that the valid Service next to them is untouched, and that the
// events clear when the objects are fixed or deleted.
func TestWatcherInvalidObjects(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bad := func(labels map[string]string) *corev1.Service {
		s := svc("bad", "10.96.0.13", labels)
		s.Spec.Ports[0].Protocol = "BOGUS"
		return s
	}
	logs := &logRecorder{}
	client, store, w, done := start(ctx, t, slog.New(logs),
		svc("web", "10.96.0.10", nil), slice("web-1", "web", "10.244.0.5"),
		bad(nil), slice("bad-1", "bad", "10.244.0.6"),
		svc("api", "10.96.0.12", nil), slice("api-1", "api", "10.244.0.7", "10.244.0.300"),
	)
	world := store.Current()
	web := world.Service("default/web")
	if web == nil || world.Service("default/api") == nil || world.Service("default/bad") != nil {
		t.Fatalf("first world has %v; want default/api and default/web, without default/bad", world.Keys())
	}
	if got := endpointIPs(t, world, "default/api"); !slices.Equal(got, []string{"10.244.0.7"}) {
		t.Errorf("default/api endpoints = %v, want the good one only", got)
	}
	waitEvents(t, w, "both problems listed", func(ev []*pb.Event) bool {
		return eventsAre(ev, "EndpointSlice default/api-1 InvalidEndpoint", "Service default/bad InvalidService")
	})
	if e := w.Events().GetEvents()[0]; e.GetService() != "default/api" || !strings.Contains(e.GetMessage(), `"10.244.0.300"`) || e.GetCount() != 1 {
		t.Errorf("slice event = %v; want one sighting of 10.244.0.300 for default/api", e)
	}
	if got := gaugeValue(t, metrics.InvalidObjects); got != 2 {
		t.Errorf("invalid_objects = %v, want 2", got)
	}

	// Recomputing the bad Service finds the same problem again: it counts,
	// and logs nothing more.
	if _, err := client.CoreV1().Services("default").Update(ctx, bad(map[string]string{"touched": "yes"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, w, "the bad Service seen twice", func(ev []*pb.Event) bool {
		return len(ev) == 2 && ev[1].GetCount() == 2
	})
	if n := logs.count(slog.LevelError, "service left out of every table", "service", "default/bad"); n != 1 {
		t.Errorf("the bad Service was logged %d times, want once", n)
	}
	if n := logs.count(slog.LevelWarn, "endpoint slice elements left out", "object", "default/api-1"); n != 1 {
		t.Errorf("the bad slice was logged %d times, want once", n)
	}

	// Fixing the Service publishes it and clears its event.
	if _, err := client.CoreV1().Services("default").Update(ctx, svc("bad", "10.96.0.13", nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, store, "default/bad published", func(w *table.World) bool { return w.Service("default/bad") != nil })
	waitEvents(t, w, "the Service's event cleared", func(ev []*pb.Event) bool {
		return eventsAre(ev, "EndpointSlice default/api-1 InvalidEndpoint")
	})

	// Deleting the bad slice clears its event too.
	if err := client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "api-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, w, "no events", func(ev []*pb.Event) bool { return len(ev) == 0 })
	if got := gaugeValue(t, metrics.InvalidObjects); got != 0 {
		t.Errorf("invalid_objects = %v, want 0", got)
	}
	if n := logs.count(slog.LevelInfo, "problem resolved", "object", "default/api-1"); n != 1 {
		t.Errorf("the slice's recovery was logged %d times, want once", n)
	}
	if store.Current().Service("default/web") != web {
		t.Errorf("the valid Service was recomputed by its neighbours' problems")
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestTrimKeepsOnlyWhatTablesUse(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "n", Labels: map[string]string{corev1.LabelTopologyZone: "z", "big": "label"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}, Taints: []corev1.Taint{
			{Key: "dedicated", Effect: corev1.TaintEffectNoSchedule},
			{Key: compute.TaintToBeDeleted, Value: "1700000000", Effect: corev1.TaintEffectNoSchedule},
		}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"x"}}}, Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.7"},
			{Type: corev1.NodeInternalIP, Address: "192.168.0.7"},
		}},
	}
	out, err := trim(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Node)
	if len(got.Labels) != 1 || got.Labels[corev1.LabelTopologyZone] != "z" || len(got.Status.Images) != 0 || len(got.ManagedFields) != 0 {
		t.Errorf("trimmed node kept too much or too little: %+v", got)
	}
	if len(got.Spec.Taints) != 1 {
		t.Errorf("trimmed node kept taints %v, want only the autoscaler's", got.Spec.Taints)
	}
	if len(got.Status.Addresses) != 2 {
		t.Errorf("trimmed node kept addresses %v, want its two IPs", got.Status.Addresses)
	}
	if !compute.BuildNode("n", got).Equal(compute.BuildNode("n", n)) {
		t.Errorf("trimming changed what the table sees of the node")
	}
	n.Spec.Taints = nil
	n.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	if out, err = trim(n); err != nil || !compute.BuildNode("n", out.(*corev1.Node)).Equal(compute.BuildNode("n", n)) {
		t.Errorf("trimming lost the node's deletion (%v)", err)
	}
}
