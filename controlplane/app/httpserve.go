package app

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/proxyplane/proxyplane/controlplane/certs"
	"github.com/proxyplane/proxyplane/controlplane/limit"
)

// Bounds on what a client of --metrics-address can make the server hold.
// Its clients are the kubelet's probes and Prometheus: one short GET at a
// time, without a body, every few seconds. A stranger who opens
// connections and sends nothing, or a header a byte at a time, or never
// reads the answer, is cut off by these instead of holding a goroutine
// and buffers for as long as it likes.
const (
	// httpReadHeaderTimeout bounds the TLS handshake and the request
	// line and headers; httpReadTimeout the whole request.
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	// httpWriteTimeout bounds writing the answer: a scrape of the
	// control plane's metrics is tens of kilobytes.
	httpWriteTimeout = 30 * time.Second
	// httpIdleTimeout closes a kept-alive connection idle this long:
	// Prometheus scrapes every 15 to 60 s and reconnects when needed.
	httpIdleTimeout = 90 * time.Second
	// httpMaxHeaderBytes fits a bearer token (at most 16 KiB, as
	// auth.MaxTokenBytes) and the usual headers; net/http's default is
	// 1 MiB.
	httpMaxHeaderBytes = 32 << 10
	// httpMaxConns and httpMaxConnsPerPeer: probes and scrapes need a
	// connection or two each. A cap per address keeps one stranger from
	// taking the slots the kubelet's probes need, and the total bounds
	// everyone; past either a connection is closed as it is accepted.
	httpMaxConns        = 256
	httpMaxConnsPerPeer = 16
)

// httpConfig is what the HTTP server on --metrics-address serves.
type httpConfig struct {
	// Secure serves HTTPS and puts /metrics behind the API server's
	// authentication and authorization (secureMetrics decides).
	Secure bool
	// Namespace names the fallback certificate.
	Namespace string
	Registry  *prometheus.Registry
	Ready     Readiness
	Watches   Watches
	// GetCertificate is the serving certificate of 9640; until it has
	// one, a self-signed one is served, so that probes are answered (and
	// /readyz says why there is none) from the start.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Reviews sends the TokenReviews and SubjectAccessReviews of
	// /metrics (and /debug/pprof/) when Secure.
	Reviews kubernetes.Interface
	// Profiling serves net/http/pprof's handlers under /debug/pprof/
	// (--profiling), authorized as /metrics is, for the non-resource URL
	// /debug/pprof/.
	Profiling bool
}

// secureMetrics says whether --metrics-address is served over HTTPS with
// /metrics authorized by the API server, as kube-controller-manager
// serves its secure port: on any address another host can reach. On a
// loopback address (`make run`, a sidecar) only processes of the host can
// connect, and it is plaintext and open, as kube-proxy's 127.0.0.1:10249
// and etcd's metrics on kubeadm clusters; with --insecure nothing is
// secured anywhere (tests).
func secureMetrics(o *Options) bool {
	if o.Insecure {
		return false
	}
	host, _, err := net.SplitHostPort(o.MetricsAddress)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsLoopback()
}

// metricsReviewQPS and metricsReviewBurst pace the client of /metrics's
// reviews. It is a client of its own, so that tokens sent to /metrics,
// which anyone who reaches the port may send, never spend the budget of
// the informers, the CA's upkeep or the agents' reviews.
const (
	metricsReviewQPS   = 5
	metricsReviewBurst = 10
)

// metricsReviewClient returns the client /metrics's reviews go through.
func metricsReviewClient(cfg *rest.Config) (kubernetes.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = metricsReviewQPS, metricsReviewBurst
	client, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("creating kubernetes client: %w", err)
	}
	return client, nil
}

// metricsServer builds the server of --metrics-address on lis for Run,
// with reviews sent through a client built from cfg.
func metricsServer(lis net.Listener, o *Options, cfg *rest.Config, reg *prometheus.Registry, ready Readiness, watches Watches,
	sec *Security, log *slog.Logger,
) (*http.Server, net.Listener, error) {
	hc := httpConfig{
		Secure: secureMetrics(o), Namespace: o.Namespace, Registry: reg, Ready: ready, Watches: watches,
		GetCertificate: sec.GetCertificate, Profiling: o.Profiling,
	}
	if hc.Secure {
		client, err := metricsReviewClient(cfg)
		if err != nil {
			_ = lis.Close()
			return nil, nil, err
		}
		hc.Reviews = client
		log.Info("serving /metrics over HTTPS to callers the API server authorizes to get /metrics; /healthz, /livez and /readyz to anyone",
			"address", lis.Addr().String())
	} else {
		log.Info("serving /metrics, /healthz, /livez and /readyz in plaintext without authentication",
			"address", lis.Addr().String(), "why", map[bool]string{true: "--insecure", false: "a loopback address"}[o.Insecure])
	}
	hs, l, err := newHTTPServer(lis, hc, log)
	if err != nil {
		_ = lis.Close()
		return nil, nil, err
	}
	return hs, l, nil
}

// newHTTPServer returns the server of --metrics-address and the listener
// to serve it on (lis wrapped with the connection caps and, when
// cfg.Secure, TLS). It serves HTTP/1.1 only: its clients need nothing
// else, and HTTP/2 would only add ways to hold the server busy.
func newHTTPServer(lis net.Listener, cfg httpConfig, log *slog.Logger) (*http.Server, net.Listener, error) {
	mux := http.NewServeMux()
	healthHandlers(mux, cfg.Ready, cfg.Watches)
	metrics := promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry})
	lis = capConns(lis, log)
	if cfg.Secure {
		fallback, err := fallbackCertificate(cfg.Namespace)
		if err != nil {
			return nil, nil, err
		}
		getCert := cfg.GetCertificate
		lis = tls.NewListener(lis, &tls.Config{
			GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
				if getCert != nil {
					if c, err := getCert(hello); err == nil {
						return c, nil
					}
				}
				return fallback, nil
			},
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
		})
		metrics = newMetricsAuthorizer(cfg.Reviews, metricsPath, log).wrap(metrics)
	}
	mux.Handle("GET /metrics", metrics)
	if cfg.Profiling {
		prof := profilingHandler()
		if cfg.Secure {
			prof = newMetricsAuthorizer(cfg.Reviews, profilingPath, log).wrap(prof)
		}
		mux.Handle(profilingPath, prof)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
		// A TLSNextProto that is set but empty turns HTTP/2 off.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		// Failed handshakes and bad requests from strangers are not the
		// operator's business at the default level.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return srv, lis, nil
}

// profilingHandler serves net/http/pprof's handlers, as kube-proxy's
// and component-base's enableProfiling do: a CPU profile of the real
// binary under load is how its cost per response is found. Registered on
// a mux of its own, never on http.DefaultServeMux, so nothing else
// serves them.
func profilingHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(profilingPath, pprof.Index)
	mux.HandleFunc(profilingPath+"cmdline", pprof.Cmdline)
	mux.HandleFunc(profilingPath+"profile", pprof.Profile)
	mux.HandleFunc(profilingPath+"symbol", pprof.Symbol)
	mux.HandleFunc(profilingPath+"trace", pprof.Trace)
	return mux
}

// capConns closes, as they are accepted, connections past httpMaxConns
// in all or past httpMaxConnsPerPeer from one IP address, as the gRPC
// port's limiter does (with no rate: probes and scrapes are few).
func capConns(lis net.Listener, log *slog.Logger) net.Listener {
	return limit.New(limit.Config{
		MaxConnections: httpMaxConns, MaxConnectionsPerSource: httpMaxConnsPerPeer, PeerRate: -1,
	}, log.With("listener", "metrics")).Listener(lis)
}

// fallbackCertificate is served on the metrics port until the serving
// certificate exists: self-signed, in memory, never trusted by anyone.
// The kubelet does not verify a probe's certificate, so probes are
// answered; a Prometheus that verifies refuses it and sends no token.
func fallbackCertificate(ns string) (*tls.Certificate, error) {
	ca, err := certs.NewCA("proxyplane-controlplane-metrics-fallback")
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return ca.Issue(certs.DNSNames(ns), nil, now, ca.Cert.NotAfter.Sub(now))
}
