package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// clients returns n clientsets, each on its own connection (a transport
// per config), with client-side rate limiting out of the way.
func clients(base *rest.Config, n int) ([]kubernetes.Interface, error) {
	out := make([]kubernetes.Interface, n)
	for i := range out {
		cfg := rest.CopyConfig(base)
		cfg.QPS, cfg.Burst = 10000, 20000
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		// The API server warns that PreferClose is deprecated (for
		// PreferSameZone) on every hinted Service; the world uses
		// PreferClose, which means the same.
		cfg.WarningHandler = rest.NoWarnings{}
		// A distinct (if plain) dialer makes client-go build this config
		// its own transport, hence its own connection.
		cfg.Dial = (&net.Dialer{}).DialContext
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("creating client: %w", err)
		}
		out[i] = cs
	}
	return out, nil
}

// createWorld creates the namespace, the Nodes and the Services with
// their slices, in parallel.
func createWorld(ctx context.Context, css []kubernetes.Interface, w *world, workers int, created time.Time) error {
	start := time.Now()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := css[0].CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace: %w", err)
	}
	if err := parallel(ctx, workers, w.nodes, func(ctx context.Context, worker, i int) error {
		_, err := css[worker%len(css)].CoreV1().Nodes().Create(ctx, apiNode(i), metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating node %d: %w", i, err)
		}
		return nil
	}); err != nil {
		return err
	}
	log.Printf("created %d Nodes in %v", w.nodes, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	var done atomic.Int64
	err := parallel(ctx, workers, len(w.services), func(ctx context.Context, worker, i int) error {
		if err := createService(ctx, css[worker%len(css)], w.services[i], created); err != nil {
			return err
		}
		if n := done.Add(1); n%5000 == 0 {
			log.Printf("  %d Services", n)
		}
		return nil
	})
	if err != nil {
		return err
	}
	log.Printf("created %d Services with their EndpointSlices in %v", len(w.services), time.Since(start).Round(time.Millisecond))
	return nil
}

func createService(ctx context.Context, cs kubernetes.Interface, s *service, created time.Time) error {
	svc, err := cs.CoreV1().Services(namespace).Create(ctx, apiService(s), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating Service %s: %w", s.name, err)
	}
	if s.lb {
		// No cloud controller runs: write the ingress it would, so the
		// Service has an external address (a VIP).
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: loadBalancerIP(s.idx), IPMode: ptrTo(corev1.LoadBalancerIPModeVIP)}}
		if svc, err = cs.CoreV1().Services(namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting Service %s's load balancer: %w", s.name, err)
		}
	}
	sl, err := cs.DiscoveryV1().EndpointSlices(namespace).Create(ctx, apiSlice(s, svc, created), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating EndpointSlice of %s: %w", s.name, err)
	}
	s.slice = sl
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// parallel runs f(i) for i in [0, n) on workers goroutines, stopping at
// the first error.
func parallel(ctx context.Context, workers, n int, f func(ctx context.Context, worker, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for worker := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, worker, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
feed:
	for i := range n {
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
	return nil
}
