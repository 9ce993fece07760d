package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// podGrace bounds the wait for a Pod this replica has not seen yet. The
// API server vouched for the Pod when it accepted the token, so a Pod
// missing here is either gone since (a cached review) or not yet seen by
// this replica's watch: it gets this long to appear before the token is
// refused. A kubelet starts an agent seconds after its Pod is created,
// far later than a watch event arrives, so legitimate agents never wait.
const podGrace = 2 * time.Second

// agentPods is what the control plane knows of the agent Pods: those of
// the agents' ServiceAccount in its namespace, watched by one informer.
// It checks an agent token's Pod binding, and ends the streams of Pods
// that are deleted or no longer qualify. Its methods are safe for
// concurrent use.
type agentPods struct {
	namespace, serviceAccount, daemonSet string
	// syncTimeout bounds the wait for the first list.
	syncTimeout time.Duration
	log         *slog.Logger

	informer cache.SharedIndexInformer // nil until watch
	indexer  cache.Indexer             // the informer's store
	lister   corelisters.PodNamespaceLister
	synced   chan struct{} // closed once the first list is in

	// mu guards changed and streams.
	mu sync.Mutex
	// changed is closed, and replaced, whenever a Pod is added or
	// updated: waiters for a Pod not yet seen look again.
	changed chan struct{}
	// streams are the guards of the streams open with a token bound to
	// each Pod, by the Pod's uid.
	streams map[types.UID]map[*guard]struct{}
}

func newAgentPods(namespace, serviceAccount, daemonSet string, syncTimeout time.Duration, log *slog.Logger) *agentPods {
	p := &agentPods{
		namespace: namespace, serviceAccount: serviceAccount, daemonSet: daemonSet, syncTimeout: syncTimeout, log: log,
		synced:  make(chan struct{}),
		changed: make(chan struct{}),
		streams: map[types.UID]map[*guard]struct{}{},
	}
	p.useIndexer(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))
	return p
}

func (p *agentPods) useIndexer(idx cache.Indexer) {
	p.indexer = idx
	p.lister = corelisters.NewPodLister(idx).Pods(p.namespace)
}

// watch makes the informer run will run: the Pods of the agents'
// ServiceAccount in its namespace, and nothing else. Only a Pod running
// as that ServiceAccount can have its tokens bound to it (TokenRequest
// refuses a binding to another's Pod), so the field selector selects
// exactly the Pods an agent token can name, without a label that a
// renamed overlay could drift from; the Role deploy/rbac.yaml grants is
// namespaced to match.
func (p *agentPods) watch(client kubernetes.Interface) {
	selector := fields.OneTermEqualSelector("spec.serviceAccountName", p.serviceAccount).String()
	inf := coreinformers.NewFilteredPodInformer(client, p.namespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = selector
	})
	// 5,000 agent Pods in full are tens of megabytes; what the checks
	// read is a few hundred bytes each.
	_ = inf.SetTransform(slimPod)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { p.notify() },
		// The streams are registered under the uid their tokens name:
		// the old object's. A relist after a gap in the watch may turn a
		// Pod deleted and created again under its name into an update.
		UpdateFunc: func(old, _ any) { p.notify(); p.changedPod(old) },
		DeleteFunc: p.changedPod,
	})
	p.informer = inf
	p.useIndexer(inf.GetIndexer())
}

// run runs the informer until ctx ends.
func (p *agentPods) run(ctx context.Context) error {
	if p.informer == nil {
		return errors.New("agent Pods: run without watch")
	}
	go p.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return nil // ctx ended
	}
	p.log.Info("watching agent Pods", "namespace", p.namespace, "serviceAccount", p.serviceAccount, "daemonSet", p.daemonSet)
	close(p.synced)
	<-ctx.Done()
	return nil
}

// slimPod keeps of a Pod what the checks read.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			OwnerReferences: pod.OwnerReferences, DeletionTimestamp: pod.DeletionTimestamp,
		},
		Spec:   corev1.PodSpec{NodeName: pod.Spec.NodeName, ServiceAccountName: pod.Spec.ServiceAccountName},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}

func (p *agentPods) notify() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.changed)
	p.changed = make(chan struct{})
}

// changedPod re-checks the streams bound to a Pod that changed or went:
// the store already holds the change, so a deleted Pod is not found.
func (p *agentPods) changedPod(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	guards := make([]*guard, 0, len(p.streams[pod.UID]))
	for g := range p.streams[pod.UID] {
		guards = append(guards, g)
	}
	p.mu.Unlock()
	for _, g := range guards {
		g.podChanged()
	}
}

// register has the streams of g's Pod re-checked when it changes, until
// unregister.
func (p *agentPods) register(uid types.UID, g *guard) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streams[uid] == nil {
		p.streams[uid] = map[*guard]struct{}{}
	}
	p.streams[uid][g] = struct{}{}
}

func (p *agentPods) unregister(uid types.UID, g *guard) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.streams[uid], g)
	if len(p.streams[uid]) == 0 {
		delete(p.streams, uid)
	}
}

// daemonSetKind is what an agent Pod's controller must be.
var daemonSetKind = schema.GroupKind{Group: "apps", Kind: "DaemonSet"}

// check returns the node of the agent Pod id's token is bound to, or why
// the binding does not hold: the Pod must exist with the token's uid, be
// controlled by the agents' DaemonSet, run on a node (the token's node,
// when the token names one) and not have terminated. wait waits up to
// podGrace for a Pod not seen yet, and for the first list; without it
// (a watch event re-checking a stream) a Pod not found is gone.
func (p *agentPods) check(ctx context.Context, id *Identity, wait bool) (string, error) {
	pod, err := p.get(ctx, id.Pod, wait)
	if err != nil {
		return "", err
	}
	ref := fmt.Sprintf("Pod %s/%s", p.namespace, id.Pod)
	if pod.UID != types.UID(id.PodUID) {
		return "", fmt.Errorf("%w: the token is bound to the %s of uid %s, which no longer exists (the Pod of that name has uid %s)", errDenied, ref, id.PodUID, pod.UID)
	}
	owner := metav1.GetControllerOfNoCopy(pod)
	if owner == nil || owner.Name != p.daemonSet || groupKind(owner) != daemonSetKind {
		return "", fmt.Errorf("%w: the token is bound to %s, which DaemonSet %s/%s does not control: only an agent Pod's token proves a node", errDenied, ref, p.namespace, p.daemonSet)
	}
	node := pod.Spec.NodeName
	switch {
	case node == "":
		return "", fmt.Errorf("%w: the token is bound to %s, which runs on no node", errDenied, ref)
	case id.Node != "" && id.Node != node:
		return "", fmt.Errorf("%w: the token names node %q, but its %s runs on %q", errDenied, id.Node, ref, node)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return "", fmt.Errorf("%w: the token is bound to %s, which has terminated (%s)", errDenied, ref, pod.Status.Phase)
	}
	return node, nil
}

func groupKind(ref *metav1.OwnerReference) schema.GroupKind {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return schema.GroupKind{}
	}
	return schema.GroupKind{Group: gv.Group, Kind: ref.Kind}
}

// get returns the agent Pod name, waiting (when wait) for the first list
// and up to podGrace for a Pod not seen yet.
func (p *agentPods) get(ctx context.Context, name string, wait bool) (*corev1.Pod, error) {
	if wait {
		t := time.NewTimer(p.syncTimeout)
		defer t.Stop()
		select {
		case <-p.synced:
		case <-t.C:
			return nil, errors.New("the agent Pods are not listed yet")
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the agent Pods to be listed: %w", ctx.Err())
		}
	}
	var deadline <-chan time.Time
	for {
		p.mu.Lock()
		changed := p.changed
		p.mu.Unlock()
		pod, err := p.lister.Get(name)
		switch {
		case err == nil:
			return pod, nil
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("looking up Pod %s/%s: %w", p.namespace, name, err)
		case !wait:
			return nil, fmt.Errorf("%w: the token is bound to Pod %s/%s, which has been deleted", errDenied, p.namespace, name)
		}
		if deadline == nil {
			t := time.NewTimer(podGrace)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-changed:
		case <-deadline:
			return nil, fmt.Errorf("%w: the token is bound to Pod %s/%s, which is not a Pod of ServiceAccount %s in this namespace (deleted?)",
				errDenied, p.namespace, name, p.serviceAccount)
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for Pod %s/%s: %w", p.namespace, name, ctx.Err())
		}
	}
}
