package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/server"
	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/watch"
)

// shutdownGrace bounds a graceful stop: agent streams never end on their
// own, so after this they are cut and the agents reconnect elsewhere.
const shutdownGrace = 5 * time.Second

// Run runs the control plane until ctx ends. o must be valid.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating kubernetes client: %w", err)
	}
	store := table.NewStore(o.MaxPendingChanges)
	watcher, err := watch.New(client, store, o.ResyncPeriod, log.With("component", "watch"))
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics.Register(reg)

	gs, stopStreams := NewGRPCServer(store, watcher, o, log.With("component", "server"))
	grpcLis, err := net.Listen("tcp", o.GRPCAddress)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.GRPCAddress, err)
	}
	metricsLis, err := net.Listen("tcp", o.MetricsAddress)
	if err != nil {
		_ = grpcLis.Close()
		return fmt.Errorf("listening on %s: %w", o.MetricsAddress, err)
	}
	hs := &http.Server{Handler: httpHandler(reg, store), ReadHeaderTimeout: 10 * time.Second}
	log.Info("control plane starting", "grpc", grpcLis.Addr().String(), "metrics", metricsLis.Addr().String())

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return watcher.Run(ctx) })
	g.Go(func() error { return gs.Serve(grpcLis) })
	g.Go(func() error {
		if err := hs.Serve(metricsLis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving metrics: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		log.Info("control plane stopping")
		// Agents learn at once (Unavailable) and move to another replica.
		stopStreams()
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(shutdownGrace):
			gs.Stop()
		}
		// ctx is done by now; the shutdown needs a deadline of its own.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		defer cancel()
		return hs.Shutdown(sctx)
	})
	return g.Wait()
}

// NewGRPCServer builds the gRPC server: the TableService (its ListEvents
// reports what events supplies), the standard health service (SERVING
// once the first world is published) and server reflection, so that
// grpcurl can list, describe and stream. The returned stop ends every
// stream and reports NOT_SERVING; call it before GracefulStop, or that
// waits for agents' streams, which never end on their own.
func NewGRPCServer(store *table.Store, events server.EventSource, o *Options, log *slog.Logger) (gs *grpc.Server, stop func()) {
	opts := append(server.GRPCOptions(),
		grpc.MaxSendMsgSize(o.MaxSendMessageBytes),
		grpc.MaxRecvMsgSize(o.MaxRecvMessageBytes),
		grpc.MaxConcurrentStreams(o.MaxStreamsPerConnection),
		// Transport keepalives find dead TCP connections; the Sync stream's
		// own keepalives find agents that are connected but stuck.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	gs = grpc.NewServer(opts...)
	srv := server.New(store, server.Options{
		KeepaliveInterval: o.KeepaliveInterval, KeepaliveTimeout: o.KeepaliveTimeout,
		WriteTimeout: o.WriteTimeout, AckTimeout: o.AckTimeout,
		Events: events,
	}, log)
	srv.Register(gs)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	go func() {
		<-store.Ready()
		hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs, func() { hs.Shutdown(); srv.Shutdown() }
}

func httpHandler(reg *prometheus.Registry, store *table.Store) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-store.Ready():
			_, _ = w.Write([]byte("ok\n"))
		default:
			http.Error(w, "informer caches not synced", http.StatusServiceUnavailable)
		}
	})
	return mux
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("loading kubernetes client configuration: %w", err)
	}
	cfg.UserAgent = "proxyplane-controlplane"
	return cfg, nil
}
