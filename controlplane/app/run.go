package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyplane/proxyplane/controlplane/certs"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/server"
	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/watch"
	"github.com/proxyplane/proxyplane/internal/capture"
)

// Client-side rate limit of the client that sends TokenReviews and
// SubjectAccessReviews. client-go's default of 5 a second would take 17
// minutes to admit 5,000 agents after a failover, and a restarted replica
// starts with an empty cache. It matches the server's default admission
// rate, so that authentication is not what paces a reconnect of every
// agent (5,000 in 5 s); the Authenticator's bound on reviews in flight is
// what protects the API server, and this only a backstop.
const (
	reviewQPS   = server.DefaultAdmissionRate
	reviewBurst = server.DefaultAdmissionRate
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
	// The Service the serving certificate names: its ready endpoints are
	// the replicas' addresses, which every table carries to the agents.
	watcher.SetControlPlaneService(o.Namespace, certs.ServiceName)
	nodePorts, _ := capture.ParsePortRange(o.NodePortRange) // Validate parsed it
	watcher.SetGuard(capture.Resolve(ctx, o.AgentControlPlane, log), nodePorts, o.NodeAddressServicePorts)

	rcfg := rest.CopyConfig(cfg)
	rcfg.QPS, rcfg.Burst = reviewQPS, reviewBurst
	reviewClient, err := kubernetes.NewForConfig(rcfg)
	if err != nil {
		return fmt.Errorf("creating kubernetes client: %w", err)
	}
	sec, err := NewSecurity(client, reviewClient, o, log)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics.Register(reg)

	// Each call runs in its own stream's context, not Run's.
	ready := Readiness{Synced: store.Ready(), Certified: sec.Ready, CertProblem: sec.CertProblem, Watches: watcher}
	if sec.Auth != nil {
		ready.AgentPods = sec.Auth.Listed()
	}
	gs, stopStreams := NewGRPCServer(store, watcher, o, sec, ready, log.With("component", "server")) //nolint:contextcheck // see above
	grpcLis, err := net.Listen("tcp", o.GRPCAddress)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.GRPCAddress, err)
	}
	grpcLis = sec.Limits.Listener(grpcLis)
	metricsLis, err := net.Listen("tcp", o.MetricsAddress)
	if err != nil {
		_ = grpcLis.Close()
		return fmt.Errorf("listening on %s: %w", o.MetricsAddress, err)
	}
	hs, metricsLis, err := metricsServer(metricsLis, o, cfg, reg, ready, watcher, sec, log.With("component", "http"))
	if err != nil {
		_ = grpcLis.Close()
		return err
	}
	log.Info("control plane starting", "grpc", grpcLis.Addr().String(), "metrics", metricsLis.Addr().String(),
		"tls", !o.Insecure, "namespace", o.Namespace)

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return watcher.Run(ctx) })
	g.Go(func() error { return sec.Run(ctx) })
	if sec.Auth != nil {
		// The agent Pods an agent token must be bound to.
		g.Go(func() error { return sec.Auth.Run(ctx) })
	}
	g.Go(func() error {
		// No handshake can succeed before there is a certificate; agents
		// meanwhile find the port closed and try another replica.
		select {
		case <-sec.Ready:
		case <-ctx.Done():
			_ = grpcLis.Close()
			return nil
		}
		if err := gs.Serve(grpcLis); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
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

// nodeAddressReporter guards the node addresses agents' hellos report
// (server.Options.NodeAddresses).
type nodeAddressReporter interface {
	ReportNodeAddresses(ctx context.Context, node string, addrs []netip.Addr) error
}

var _ nodeAddressReporter = (*watch.Watcher)(nil)

// NewGRPCServer builds the gRPC server: the TableService (its ListEvents
// reports what events supplies), the standard health service (SERVING
// once the first world is published and a certificate exists) and server
// reflection, so that grpcurl can list, describe and stream; sec supplies
// TLS, authentication and limits. The returned stop ends every stream and
// reports NOT_SERVING; call it before GracefulStop, or that waits for
// agents' streams, which never end on their own.
func NewGRPCServer(store *table.Store, events server.EventSource, o *Options, sec *Security, ready Readiness, log *slog.Logger) (gs *grpc.Server, stop func()) {
	secOpts, hooks := sec.serverOptions()
	opts := append(server.GRPCOptions(),
		// Before secOpts' interceptors, so outside them: calls that
		// limits or authentication refuse are counted, with their codes.
		grpc.ChainUnaryInterceptor(metrics.GRPCServer.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(metrics.GRPCServer.StreamServerInterceptor()),
		grpc.MaxSendMsgSize(o.MaxSendMessageBytes),
		// grpc-go has one receive limit per server, and an agent's hello
		// needs it; it reads that much only of a Sync stream that has
		// authenticated, or of one of the few calls the limits admit
		// unverified. Every message but the agents' is refused past
		// server.MaxSmallMessageBytes before it is decoded.
		grpc.MaxRecvMsgSize(o.MaxRecvMessageBytes),
		grpc.MaxConcurrentStreams(o.MaxStreamsPerConnection),
		// A token is at most 16 KiB (auth.MaxTokenBytes); grpc-go would
		// otherwise accept 16 MiB of headers on every stream.
		grpc.MaxHeaderListSize(maxHeaderListBytes),
		// A client must finish its TLS and HTTP/2 handshakes in this time
		// (grpc-go's default is two minutes), so half-open connections do
		// not hold connection slots.
		grpc.ConnectionTimeout(handshakeTimeout),
		// Transport keepalives find dead TCP connections; the Sync stream's
		// own keepalives find agents that are connected but stuck. A
		// connection without streams (a grpcurl done, a client that never
		// opens one) is closed once idle, so idle connections cannot pile
		// up toward --max-connections; agents always hold a stream.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: 5 * time.Minute}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	gs = grpc.NewServer(append(opts, secOpts...)...)
	// The watcher, which supplies the events, also guards the node
	// addresses agents report; tests' fixed event sources do not.
	var nodeAddresses func(context.Context, string, []netip.Addr) error
	if r, ok := events.(nodeAddressReporter); ok {
		nodeAddresses = r.ReportNodeAddresses
	}
	srv := server.New(store, server.Options{
		KeepaliveInterval: o.KeepaliveInterval, KeepaliveTimeout: o.KeepaliveTimeout,
		WriteTimeout: o.WriteTimeout, AckTimeout: o.AckTimeout,
		AdmissionRate: o.AdmissionRate, AdmissionBurst: o.AdmissionBurst,
		Authorize: hooks.Authorize, AuthorizeRead: hooks.AuthorizeRead,
		Events: events, DisableConvergence: !o.ConvergenceTracking,
		NodeAddresses: nodeAddresses,
		Stale: func() error {
			if ready.Watches == nil {
				return nil
			}
			return ready.Watches.Stale(time.Now(), staleGrace)
		},
	}, log)
	srv.Register(gs)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	done := make(chan struct{})
	go followReadiness(hs, ready, done, log)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	// Every method's series exist from the start, at zero.
	metrics.GRPCServer.InitializeMetrics(gs)
	return gs, func() { close(done); hs.Shutdown(); srv.Shutdown() }
}

// followReadiness sets the health service's status from ready until done
// is closed, checking every readinessPeriod.
func followReadiness(hs *health.Server, ready Readiness, done <-chan struct{}, log *slog.Logger) {
	t := time.NewTicker(readinessPeriod)
	defer t.Stop()
	was := errors.New("not checked yet")
	for {
		err := ready.Check(time.Now())
		switch {
		case err == nil && was != nil:
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			log.Info("serving")
		case err != nil && (was == nil || err.Error() != was.Error()):
			hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
			log.Warn("not ready", "why", err)
		}
		was = err
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

// readinessPeriod is how often the health service follows readiness.
const readinessPeriod = time.Second

// Bounds on what a client can make the server hold before any call.
const (
	maxHeaderListBytes = 64 << 10
	handshakeTimeout   = 20 * time.Second
)

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
