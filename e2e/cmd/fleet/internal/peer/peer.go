// Package peer runs the fleet harness's peer: N kube-proxy-style informer
// sets against the API server, in a process of their own, each with its
// own client and TCP connection as N kube-proxies on N nodes would have.
//
// Each set starts the informers that upstream kube-proxy v1.36 starts
// (cmd/kube-proxy/app/server.go, pkg/proxy/node.go), with its filters,
// client settings and resync period:
//
//   - Services without the service.kubernetes.io/service-proxy-name label
//     and with spec.clusterIP != None;
//   - EndpointSlices without the service.kubernetes.io/headless label;
//   - its own Node, by the field selector metadata.name=<node>;
//   - ServiceCIDRs, unfiltered (MultiCIDRServiceAllocator is GA and locked
//     on in 1.34+);
//
// over protobuf, at kube-proxy's default QPS 5 and burst 10, with its
// 15-minute resync, an event handler counting events. What differs is
// only on the client: objects are trimmed to their metadata before the
// informers store them (SetTransform), so that hundreds of sets fit in
// one process; the API server sends exactly what it sends kube-proxy.
package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// Options configures the peer's process.
type Options struct {
	// Kubeconfig is the API server's kubeconfig.
	Kubeconfig string
	// Sets is the number of informer sets; set i watches node
	// contract.NodeName(NodePrefix, i).
	Sets       int
	NodePrefix string
	// Spread starts the sets evenly over this time.
	Spread time.Duration
	// Lifetime bounds the process.
	Lifetime time.Duration
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{NodePrefix: "fleet-node-", Spread: time.Second, Lifetime: 2 * time.Hour}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "The API server's kubeconfig.")
	fs.IntVar(&o.Sets, "sets", o.Sets, "Number of informer sets.")
	fs.StringVar(&o.NodePrefix, "node-prefix", o.NodePrefix, "Node name prefix.")
	fs.DurationVar(&o.Spread, "spread", o.Spread, "Start the sets evenly over this time.")
	fs.DurationVar(&o.Lifetime, "lifetime", o.Lifetime, "Exit after this long in any case.")
}

// Limits implements contract.ChildOptions: one connection per informer set.
func (o *Options) Limits() (int, time.Duration) { return o.Sets, o.Lifetime }

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Kubeconfig == "" {
		errs = append(errs, errors.New("--kubeconfig is required"))
	}
	if o.Sets < 1 || o.Sets > 100000 {
		errs = append(errs, fmt.Errorf("--sets %d: between 1 and 100000", o.Sets))
	}
	if o.Spread < 0 || o.Lifetime <= 0 {
		errs = append(errs, errors.New("--spread must not be negative, --lifetime must be positive"))
	}
	return errors.Join(errs...)
}

// kube-proxy's defaults (pkg/proxy/apis/config/v1alpha1/defaults.go).
const (
	configSyncPeriod = 15 * time.Minute
	clientQPS        = 5
	clientBurst      = 10
	contentType      = "application/vnd.kubernetes.protobuf"
)

// peer is the process's state.
type peer struct {
	opts    *Options
	base    *rest.Config
	started atomic.Int64
	sets    []*set

	wire, body, events atomic.Uint64
	mu                 sync.Mutex // guards errors
	errors             []string
}

// set is one kube-proxy's informers.
type set struct {
	node         string
	synced       atomic.Int64 // when all four informers synced
	sliceUpdates atomic.Uint64
}

func newPeer(o *Options) (*peer, error) {
	base, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", o.Kubeconfig, err)
	}
	p := &peer{opts: o, base: base, sets: make([]*set, o.Sets)}
	for i := range p.sets {
		p.sets[i] = &set{node: contract.NodeName(o.NodePrefix, i)}
	}
	return p, nil
}

// run starts set s's informers and waits for them to sync.
func (p *peer) run(ctx context.Context, s *set) error {
	cfg := rest.CopyConfig(p.base)
	cfg.ContentType, cfg.AcceptContentTypes = contentType, ""
	cfg.QPS, cfg.Burst = clientQPS, clientBurst
	cfg.UserAgent = "fleet-peer/" + s.node
	// A dialer of its own gives the set its own transport (client-go
	// caches transports by dialer), hence its own connection, and counts
	// what the API server sends on it.
	d := &countingDialer{n: &p.wire}
	cfg.Dial = d.dial
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &bodyCounter{rt: rt, n: &p.body} })
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}

	noProxyName, err := labels.NewRequirement("service.kubernetes.io/service-proxy-name", selection.DoesNotExist, nil)
	if err != nil {
		return fmt.Errorf("building selector: %w", err)
	}
	noHeadless, err := labels.NewRequirement(corev1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		return fmt.Errorf("building selector: %w", err)
	}
	plain := informers.NewSharedInformerFactoryWithOptions(client, configSyncPeriod)
	sliceFactory := informers.NewSharedInformerFactoryWithOptions(client, configSyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.NewSelector().Add(*noHeadless).String()
		}))
	svcFactory := informers.NewSharedInformerFactoryWithOptions(client, configSyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.NewSelector().Add(*noProxyName).String()
			o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
		}))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, configSyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.node).String()
		}))
	infs := []cache.SharedIndexInformer{
		svcFactory.Core().V1().Services().Informer(),
		sliceFactory.Discovery().V1().EndpointSlices().Informer(),
		nodeFactory.Core().V1().Nodes().Informer(),
		plain.Networking().V1().ServiceCIDRs().Informer(),
	}
	for i, inf := range infs {
		if err := inf.SetTransform(trim); err != nil {
			return fmt.Errorf("setting transform: %w", err)
		}
		isSlices := i == 1
		_, err := inf.AddEventHandlerWithResyncPeriod(cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { p.events.Add(1) },
			UpdateFunc: func(any, any) {
				p.events.Add(1)
				if isSlices {
					s.sliceUpdates.Add(1)
				}
			},
			DeleteFunc: func(any) { p.events.Add(1) },
		}, configSyncPeriod)
		if err != nil {
			return fmt.Errorf("adding handler: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			p.noteError(err)
		}); err != nil {
			return fmt.Errorf("setting watch error handler: %w", err)
		}
	}
	for _, f := range []informers.SharedInformerFactory{plain, sliceFactory, svcFactory, nodeFactory} {
		f.Start(ctx.Done())
	}
	synced := make([]cache.InformerSynced, len(infs))
	for i, inf := range infs {
		synced[i] = inf.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("set %s: caches did not sync: %w", s.node, context.Cause(ctx))
	}
	s.synced.Store(time.Now().UnixNano())
	return nil
}

// trim keeps only what an informer needs to key and version an object.
func trim(obj any) (any, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return obj, nil // a tombstone
	}
	meta := metav1.ObjectMeta{Name: m.GetName(), Namespace: m.GetNamespace(), ResourceVersion: m.GetResourceVersion(), UID: m.GetUID()}
	switch obj.(type) {
	case *corev1.Service:
		return &corev1.Service{ObjectMeta: meta}, nil
	case *corev1.Node:
		return &corev1.Node{ObjectMeta: meta}, nil
	case *discoveryv1.EndpointSlice:
		return &discoveryv1.EndpointSlice{ObjectMeta: meta}, nil
	case *networkingv1.ServiceCIDR:
		return &networkingv1.ServiceCIDR{ObjectMeta: meta}, nil
	default:
		return obj, nil
	}
}

const maxErrors = 10

func (p *peer) noteError(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errors) < maxErrors {
		p.errors = append(p.errors, err.Error())
	}
}

// countingDialer dials TCP, counting bytes read.
type countingDialer struct {
	d net.Dialer
	n *atomic.Uint64
}

func (d *countingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := d.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", addr, err)
	}
	return &countingConn{Conn: c, n: d.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Uint64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(uint64(n))
	return n, err
}

// bodyCounter counts response body bytes as the client reads them.
type bodyCounter struct {
	rt http.RoundTripper
	n  *atomic.Uint64
}

func (b *bodyCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(r)
	if err != nil {
		return nil, err //nolint:wrapcheck // a RoundTripper passes its transport's errors on
	}
	resp.Body = &countingBody{ReadCloser: resp.Body, n: b.n}
	return resp, nil
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Uint64
}

func (c *countingBody) Read(b []byte) (int, error) {
	n, err := c.ReadCloser.Read(b)
	c.n.Add(uint64(n))
	return n, err
}
