// Package watch feeds the table store from the API server: one informer
// each on Services, EndpointSlices, Nodes and ServiceCIDRs, whatever the
// number of nodes.
//
// Event handlers only record which Service or Node changed; one goroutine
// (Run's) recomputes those from the informer caches and publishes them, so
// a burst of events on one Service costs one computation, and a change to
// one Service or EndpointSlice recomputes that Service only. A change to
// any ServiceCIDR recomputes the cluster's set of service CIDRs, and a
// change to the control plane's own Service or its EndpointSlices the
// control plane's replica addresses (SetControlPlaneService), both of
// which every node's NodeInfo carries.
//
// An invalid Service is left out of every table, and an invalid endpoint
// or port of an EndpointSlice is left out of its Service; the rest of the
// table is unaffected. So is an external or load balancer IP that every
// agent would refuse (SetGuard): it is left out alone, and a change of
// the control plane's or the nodes' addresses (those Nodes list and
// those agents report, ReportNodeAddresses) rebuilds the Services it
// concerns. The same goroutine keeps one event per such object,
// logs each distinct problem once and publishes the events for ListEvents
// (see Events).
package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/capture"
)

const byService = "service"

// Watcher keeps a table.Store in step with the API server.
type Watcher struct {
	store  *table.Store
	log    *slog.Logger
	events *eventLog // Run's goroutine's; others call Events

	// factory filters Services and slices as kube-proxy does; nodeFactory
	// lists Nodes and ServiceCIDRs unfiltered.
	factory, nodeFactory informers.SharedInformerFactory
	services, slices     cache.SharedIndexInformer
	nodes, serviceCIDRs  cache.SharedIndexInformer

	mu         sync.Mutex // guards the dirty sets, dirtyCIDRs and the reports below
	dirtySvcs  map[string]bool
	dirtyNodes map[string]bool
	dirtyCIDRs bool
	// reported holds the node addresses each agent's hello reported
	// (ReportNodeAddresses), dirtyReported says it changed since the last
	// publish, and reportedApplied is closed by the publish that next
	// takes it in; all guarded by mu.
	reported        map[string][]netip.Addr
	dirtyReported   bool
	reportedApplied chan struct{}
	wake            chan struct{} // capacity 1
	handlerError    error         // first error registering handlers
	progress        progress      // how far the published world has followed the cluster
	health          *health
	// beat is when Run's loop last went round (UnixNano): a loop that
	// stops going round can no longer publish.
	beat atomic.Int64
	// controlPlane is the key of the control plane's own Service, whose
	// ready endpoints every NodeInfo carries; empty for none. Set before
	// Run.
	controlPlane string
	// guardSeeds, guardNodePorts and guardAnyPort are what SetGuard set;
	// learned are the control plane addresses last published, and
	// nodeAddrs each Node's addresses: with them, guard is what no
	// Service may capture (compute.Guard). exposed maps the key of each
	// Service the guard applies to to its external and load balancer
	// IPs, so that a change of the guard rebuilds only the Services whose
	// addresses it concerns. All Run's goroutine's.
	guardSeeds     []netip.AddrPort
	guardNodePorts capture.PortRange
	guardAnyPort   bool
	learned        []netip.AddrPort
	nodeAddrs      map[string][]netip.Addr
	agentAddrs     map[string][]netip.Addr // reported, as last published
	guard          *compute.Guard
	exposed        map[string][]netip.Addr
	// handlersSynced report when each handler has seen its informer's
	// initial list: an informer's own HasSynced does not cover its
	// handlers, and publishing before they caught up would send agents a
	// table missing Services.
	handlersSynced []cache.InformerSynced
}

// New sets up the informers. resync is the informers' resync period (0
// disables it; the store ignores resyncs that change nothing anyway).
func New(client kubernetes.Interface, store *table.Store, resync time.Duration, log *slog.Logger) (*Watcher, error) {
	w := &Watcher{
		store: store, log: log, events: newEventLog(maxEvents),
		dirtySvcs: map[string]bool{}, dirtyNodes: map[string]bool{},
		wake: make(chan struct{}, 1), health: newHealth(),
		nodeAddrs: map[string][]netip.Addr{}, exposed: map[string][]netip.Addr{},
		reported: map[string][]netip.Addr{},
	}
	// kube-proxy's filter, applied by the API server: Services handled by
	// another proxy, and slices of headless Services, never reach us.
	noProxyName, err := labels.NewRequirement(compute.LabelServiceProxyName, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("building label selector: %w", err)
	}
	noHeadless, err := labels.NewRequirement(corev1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("building label selector: %w", err)
	}
	selector := labels.NewSelector().Add(*noProxyName, *noHeadless).String()
	w.factory = informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	w.nodeFactory = informers.NewSharedInformerFactory(client, resync)

	w.services = w.factory.Core().V1().Services().Informer()
	w.slices = w.factory.Discovery().V1().EndpointSlices().Informer()
	w.nodes = w.nodeFactory.Core().V1().Nodes().Informer()
	// Upstream kube-proxy watches ServiceCIDRs whenever
	// MultiCIDRServiceAllocator is on, which it always is from 1.34: its
	// nftables mode drops traffic to their unallocated addresses.
	w.serviceCIDRs = w.nodeFactory.Networking().V1().ServiceCIDRs().Informer()
	for name, inf := range map[string]cache.SharedIndexInformer{
		"services": w.services, "endpointslices": w.slices, "nodes": w.nodes, "servicecidrs": w.serviceCIDRs,
	} {
		if err := inf.SetTransform(trim); err != nil {
			return nil, fmt.Errorf("setting transform: %w", err)
		}
		w.health.track(name, inf.LastSyncResourceVersion)
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			w.health.failed(name, err, time.Now())
			cache.DefaultWatchErrorHandler(ctx, r, err)
		}); err != nil {
			return nil, fmt.Errorf("setting watch error handler: %w", err)
		}
	}
	if err := w.slices.AddIndexers(cache.Indexers{byService: sliceService}); err != nil {
		return nil, fmt.Errorf("adding slice index: %w", err)
	}
	w.handle(w.services, func(obj any) (string, bool) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		return key, err == nil
	}, kindService)
	w.handle(w.slices, func(obj any) (string, bool) {
		keys, err := sliceService(obj)
		return firstOf(keys), err == nil && len(keys) == 1
	}, kindService)
	w.handle(w.nodes, func(obj any) (string, bool) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		return key, err == nil
	}, kindNode)
	w.handle(w.serviceCIDRs, func(any) (string, bool) { return "", true }, kindServiceCIDR)
	if w.handlerError != nil {
		return nil, w.handlerError
	}
	return w, nil
}

type kind int

const (
	kindService kind = iota
	kindNode
	kindServiceCIDR // the whole set is recomputed: no key
)

// handle registers handlers that only mark key(obj) dirty. They look the
// dirty set up on every event: publish replaces it with a fresh one.
func (w *Watcher) handle(inf cache.SharedIndexInformer, key func(any) (string, bool), k kind) {
	i := w.progress.add(inf.LastSyncResourceVersion)
	mark := func(obj any) {
		defer w.progress.handle(i, obj) // after the key is marked
		name, ok := key(obj)
		if !ok {
			return
		}
		w.mu.Lock()
		switch k {
		case kindNode:
			w.dirtyNodes[name] = true
		case kindServiceCIDR:
			w.dirtyCIDRs = true
		default:
			w.dirtySvcs[name] = true
		}
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, obj any) { mark(obj) },
		DeleteFunc: mark,
	})
	if err != nil {
		if w.handlerError == nil {
			w.handlerError = fmt.Errorf("adding event handler: %w", err)
		}
		return
	}
	w.handlersSynced = append(w.handlersSynced, reg.HasSynced)
}

// SetControlPlaneService names the control plane's own Service, whose
// ready endpoints on its port named compute.ControlPlanePortName every
// table then carries as the control plane's replica addresses, for agents
// to dial besides their configured ones. Call it before Run.
func (w *Watcher) SetControlPlaneService(namespace, name string) {
	w.controlPlane = compute.Key(namespace, name)
}

// SetGuard names the control plane addresses agents are configured
// with (their --control-plane), the API server's node port range and the
// agents' --allow-node-address-service-ports. With the replica addresses
// learned from the control plane's own Service and every node's
// addresses (its Node's and its agent's report), they make the
// compute.Guard that Services are built against: an external or load
// balancer IP that would make every agent refuse its table is left out
// alone, and reported as an InvalidValue event. Call it before Run.
func (w *Watcher) SetGuard(seeds []netip.AddrPort, nodePorts capture.PortRange, nodeAddressesAnyPort bool) {
	w.guardSeeds, w.guardNodePorts, w.guardAnyPort = seeds, nodePorts, nodeAddressesAnyPort
}

// Run starts the informers, waits for their caches, publishes the first
// complete world, then keeps publishing changes until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	w.factory.Start(ctx.Done())
	w.nodeFactory.Start(ctx.Done())
	defer w.factory.Shutdown()
	defer w.nodeFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), w.handlersSynced...) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return errors.New("informer caches did not sync")
	}
	w.log.Info("informer caches synced")
	w.progress.sample()
	w.publish() // the first publish makes a world even when the cluster is empty
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		w.beat.Store(time.Now().UnixNano())
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
			w.publish()
		case <-tick.C:
			w.advance()
		}
	}
}

// advance moves the world's resourceVersion on when the cluster is quiet:
// an informer without events still moves its reflector (bookmarks, a
// relist). Anything marked dirty is published instead, which moves it
// too.
func (w *Watcher) advance() {
	w.progress.sample()
	w.mu.Lock()
	idle := len(w.dirtySvcs) == 0 && len(w.dirtyNodes) == 0 && !w.dirtyCIDRs
	if idle {
		// Every key a handler marked before its event counted was
		// swapped, and so published, by this goroutine already.
		w.progress.swapped()
	}
	w.mu.Unlock()
	if !idle {
		w.publish()
		return
	}
	w.store.Apply(table.Update{ResourceVersion: w.progress.bound()})
}

// heartbeat is how often Run's loop goes round with nothing to publish,
// and so how long a reflector's position waits before it counts (see
// progress): an informer hands a queued event to its handler within
// microseconds, and a replica that starts or falls behind should catch
// up with its peers' worlds within about a second.
const heartbeat = time.Second

// Stale returns an error when a watch has been failing for longer than
// grace at now (the world may be behind the cluster), nil otherwise. Safe
// for concurrent use.
func (w *Watcher) Stale(now time.Time, grace time.Duration) error {
	return w.health.stale(now, grace)
}

// Stuck returns an error when Run's loop has not gone round for longer
// than limit at now, once it started: it can no longer publish, and only a
// restart helps. Safe for concurrent use.
func (w *Watcher) Stuck(now time.Time, limit time.Duration) error {
	beat := w.beat.Load()
	if beat == 0 {
		return nil
	}
	if since := now.Sub(time.Unix(0, beat)); since > limit {
		return fmt.Errorf("publish loop stuck for %s", since.Round(time.Second))
	}
	return nil
}

// Events returns the current events about invalid Services and
// EndpointSlices, sorted, as ListEvents serves them. It is safe to call
// from any goroutine and never blocks: it reads the snapshot that Run's
// goroutine last published. The response is shared; do not modify it.
func (w *Watcher) Events() *pb.ListEventsResponse { return w.events.snapshot() }

// publish recomputes everything marked dirty and publishes it.
func (w *Watcher) publish() {
	w.mu.Lock()
	svcKeys, nodeNames, cidrsChanged := w.dirtySvcs, w.dirtyNodes, w.dirtyCIDRs
	w.dirtySvcs, w.dirtyNodes, w.dirtyCIDRs = map[string]bool{}, map[string]bool{}, false
	reportedChanged, applied := w.dirtyReported, w.reportedApplied
	if reportedChanged {
		w.agentAddrs = maps.Clone(w.reported) // its slices are never modified
	}
	w.dirtyReported, w.reportedApplied = false, nil
	w.progress.swapped()
	w.mu.Unlock()
	if applied != nil {
		defer close(applied)
	}

	start := time.Now()
	// Nodes and the control plane's addresses first: the guard that
	// Services are built against depends on them.
	nodes := make(map[string]*compute.Node, len(nodeNames))
	guardChanged := w.guard == nil || reportedChanged
	for name := range nodeNames {
		obj, exists, err := w.nodes.GetStore().GetByKey(name)
		var addrs []netip.Addr
		switch {
		case err != nil:
			w.log.Error("reading node from cache", "node", name, "err", err)
			continue
		case exists:
			nodes[name] = compute.BuildNode(name, obj.(*corev1.Node))
			addrs = compute.NodeAddresses(obj.(*corev1.Node))
		default:
			nodes[name] = nil
		}
		if old, had := w.nodeAddrs[name]; had != exists || !slices.Equal(old, addrs) {
			guardChanged = true
		}
		if exists {
			w.nodeAddrs[name] = addrs
		} else {
			delete(w.nodeAddrs, name)
			w.forgetReported(name)
		}
	}
	update := table.Update{Nodes: nodes, ResourceVersion: w.progress.bound()}
	if cidrsChanged {
		update.ServiceCIDRs, update.SetServiceCIDRs = w.buildServiceCIDRs(), true
	}
	if w.controlPlane != "" && svcKeys[w.controlPlane] {
		if addrs, err := w.controlPlaneAddresses(); err != nil {
			w.log.Error("control plane addresses not updated, keeping the last ones", "service", w.controlPlane, "err", err)
		} else {
			update.ControlPlaneAddresses, update.SetControlPlaneAddresses = addrs, true
			w.learned = w.learned[:0]
			for _, a := range addrs.List() {
				if ap, err := netip.ParseAddrPort(a); err == nil {
					w.learned = append(w.learned, ap)
				}
			}
			guardChanged = true
		}
	}
	if guardChanged {
		w.updateGuard(svcKeys)
	}

	services := make(map[string]*compute.Service, len(svcKeys))
	for key := range svcKeys {
		svc, problems, err := w.service(key)
		if err != nil {
			// The cache failed us, not the Service: keep its last good
			// state by leaving the key out of the publish.
			metrics.ComputeErrorsTotal.Inc()
			w.log.Error("service not updated, keeping its last good state", "service", key, "err", err)
			continue
		}
		if svc == nil && len(problems) > 0 {
			metrics.ComputeErrorsTotal.Inc()
		}
		w.report(key, problems, start)
		services[key] = svc // nil removes a Service gone, skipped or invalid
	}
	update.Services = services
	ns, nn := w.store.Apply(update)
	w.events.publish()
	metrics.ComputeDurationSeconds.Observe(time.Since(start).Seconds())
	metrics.Services.Set(float64(w.store.Current().Len()))
	if ns+nn > 0 {
		w.log.Debug("published", "services", ns, "nodes", nn, "took", time.Since(start))
	}
}

// updateGuard computes the guard from the seeds, the learned control
// plane addresses and the nodes' addresses; when it changed, it marks in
// svcKeys the Services listing an address it now guards differently, to
// be built again against it.
func (w *Watcher) updateGuard(svcKeys map[string]bool) {
	cps := append(slices.Clone(w.guardSeeds), w.learned...)
	var nodes []netip.Addr
	for name, addrs := range w.nodeAddrs {
		// An agent's report counts while its Node exists: a name that
		// never was a Node guards nothing.
		nodes = append(nodes, addrs...)
		nodes = append(nodes, w.agentAddrs[name]...)
	}
	g := compute.NewGuard(cps, nodes, w.guardNodePorts, w.guardAnyPort)
	if g.Equal(w.guard) {
		return
	}
	old := w.guard
	w.guard = g
	for key, addrs := range w.exposed {
		if slices.ContainsFunc(addrs, func(a netip.Addr) bool { return g.Affects(old, a) }) {
			svcKeys[key] = true
		}
	}
}

// buildServiceCIDRs computes the cluster's service CIDRs from the cache.
func (w *Watcher) buildServiceCIDRs() *compute.ServiceCIDRs {
	objs := w.serviceCIDRs.GetStore().List()
	cidrs := make([]*networkingv1.ServiceCIDR, 0, len(objs))
	for _, o := range objs {
		if c, ok := o.(*networkingv1.ServiceCIDR); ok {
			cidrs = append(cidrs, c)
		}
	}
	c := compute.BuildServiceCIDRs(cidrs)
	w.log.Info("service CIDRs", "cidrs", c.List())
	return c
}

// controlPlaneAddresses computes the control plane's replica addresses
// from the caches.
func (w *Watcher) controlPlaneAddresses() (*compute.ControlPlaneAddresses, error) {
	obj, exists, err := w.services.GetStore().GetByKey(w.controlPlane)
	if err != nil {
		return nil, fmt.Errorf("reading service from cache: %w", err)
	}
	var svc *corev1.Service
	if exists {
		svc = obj.(*corev1.Service)
	}
	objs, err := w.slices.GetIndexer().ByIndex(byService, w.controlPlane)
	if err != nil {
		return nil, fmt.Errorf("reading slices from cache: %w", err)
	}
	slices := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		slices = append(slices, o.(*discoveryv1.EndpointSlice))
	}
	a := compute.BuildControlPlaneAddresses(svc, slices, compute.ControlPlanePortName)
	if cur := w.store.Current(); cur == nil || !cur.ControlPlaneAddresses().Equal(a) {
		w.log.Info("control plane addresses", "service", w.controlPlane, "addresses", a.List())
	}
	return a, nil
}

// report records the problems found computing the Service under key and
// logs those that are new or different, and those that went away: once
// each, however often a resync recomputes the Service.
func (w *Watcher) report(key string, problems []compute.Problem, now time.Time) {
	for _, c := range w.events.record(key, problems, now) {
		object := c.ref.namespace + "/" + c.ref.name
		switch {
		case c.cleared:
			w.log.Info("problem resolved", "service", key, "kind", c.ref.kind, "object", object)
		case c.ev.reason == compute.ReasonInvalidService:
			w.log.Error("service left out of every table", "service", key, "reason", c.ev.reason, "err", c.ev.message)
		case c.ev.reason == compute.ReasonInvalidValue:
			w.log.Warn("service values left out, the rest proxied", "service", key, "reason", c.ev.reason, "err", c.ev.message)
		default:
			w.log.Warn("endpoint slice elements left out", "service", key, "kind", c.ref.kind, "object", object,
				"reason", c.ev.reason, "err", c.ev.message)
		}
	}
}

// service computes the Service under key from the caches, with the
// problems found in it and its slices. A nil Service means it is gone,
// skipped or invalid (problems then say why); an error means the caches
// could not be read.
func (w *Watcher) service(key string) (*compute.Service, []compute.Problem, error) {
	obj, exists, err := w.services.GetStore().GetByKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("reading service from cache: %w", err)
	}
	if !exists {
		delete(w.exposed, key)
		return nil, nil, nil
	}
	svc := obj.(*corev1.Service)
	if reason := compute.SkipReason(svc); reason != "" {
		delete(w.exposed, key)
		w.log.Debug("skipping service", "service", key, "reason", reason)
		return nil, nil, nil
	}
	if addrs := compute.Exposed(svc); len(addrs) > 0 {
		w.exposed[key] = addrs
	} else {
		delete(w.exposed, key)
	}
	objs, err := w.slices.GetIndexer().ByIndex(byService, key)
	if err != nil {
		return nil, nil, fmt.Errorf("reading slices from cache: %w", err)
	}
	slices := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		slices = append(slices, o.(*discoveryv1.EndpointSlice))
	}
	s, problems := compute.BuildGuarded(svc, slices, w.guard)
	return s, problems, nil
}

// sliceService indexes a slice by its Service's key.
func sliceService(obj any) ([]string, error) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, fmt.Errorf("unexpected %T in the slice informer", obj)
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil // not owned by a Service: kube-proxy ignores it too
	}
	return []string{compute.Key(s.Namespace, name)}, nil
}

// trim drops what the control plane never reads, so that caches of
// thousands of Nodes and tens of thousands of Services and slices stay
// small: managed fields everywhere, all of a Node but its name, zone
// label, pod CIDRs, IP addresses and whether it is going away, all of a
// ServiceCIDR but its CIDRs, and of Services and EndpointSlices the
// metadata, the selector and the endpoints' fields that no table depends
// on.
func trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Node:
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: o.Name, ResourceVersion: o.ResourceVersion, UID: o.UID,
		}}
		if zone, ok := o.Labels[corev1.LabelTopologyZone]; ok {
			n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
		}
		n.Spec.PodCIDR, n.Spec.PodCIDRs = o.Spec.PodCIDR, o.Spec.PodCIDRs
		// Whether the node is going away (compute.BuildNode), and nothing
		// else of its deletion or taints.
		n.DeletionTimestamp = o.DeletionTimestamp
		for _, t := range o.Spec.Taints {
			if t.Key == compute.TaintToBeDeleted {
				n.Spec.Taints = []corev1.Taint{{Key: t.Key, Effect: t.Effect}}
				break
			}
		}
		// The addresses the node's primary IPs come from, in order, and
		// none of the hostnames and DNS names beside them.
		for _, a := range o.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				n.Status.Addresses = append(n.Status.Addresses, a)
			}
		}
		return n, nil
	case *networkingv1.ServiceCIDR:
		// compute.BuildServiceCIDRs reads the CIDRs alone, whatever
		// the status, as upstream.
		return &networkingv1.ServiceCIDR{
			ObjectMeta: metav1.ObjectMeta{Name: o.Name, ResourceVersion: o.ResourceVersion, UID: o.UID},
			Spec:       o.Spec,
		}, nil
	case *corev1.Service:
		// compute.Build and SkipReason read the spec, the load balancer
		// ingress and, of the metadata, the name, the namespace and one
		// label. The selector is for the EndpointSlice controller, and
		// annotations (kubectl's last-applied-configuration is a copy of
		// the whole object) are for others too.
		trimMeta(&o.ObjectMeta, compute.LabelServiceProxyName, "")
		o.Spec.Selector = nil
		o.Status.Conditions = nil
		return o, nil
	case *discoveryv1.EndpointSlice:
		// The slice's index (its Service's name label) and its trigger
		// time, and of its endpoints what compute.Build and
		// BuildControlPlaneAddresses read: addresses, conditions, node
		// name and hints; not the Pod each one is, its hostname or zone.
		trimMeta(&o.ObjectMeta, discoveryv1.LabelServiceName, corev1.EndpointsLastChangeTriggerTime)
		for i := range o.Endpoints {
			e := &o.Endpoints[i]
			e.TargetRef, e.Hostname, e.Zone, e.DeprecatedTopology = nil, nil, nil, nil
		}
		return o, nil
	case metav1.Object:
		o.SetManagedFields(nil)
	}
	return obj, nil
}

// trimMeta drops all of m but what the caches' keys, the handlers'
// progress and compute read: name, namespace, UID, resourceVersion, the
// label called label and the annotation called annotation ("" for none).
// Maps that hold nothing else are kept as they are.
func trimMeta(m *metav1.ObjectMeta, label, annotation string) {
	*m = metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: onlyKey(m.Labels, label), Annotations: onlyKey(m.Annotations, annotation),
	}
}

// onlyKey returns m if it holds no key but key, else a map of key alone (nil
// when m lacks it).
func onlyKey(m map[string]string, key string) map[string]string {
	v, ok := m[key]
	switch {
	case !ok:
		return nil
	case len(m) == 1:
		return m
	}
	return map[string]string{key: v}
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
