package metrics

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// client-go's metrics, under the names and labels component-base gives
// them in every Kubernetes component (k8s.io/component-base/metrics/
// prometheus/restclient), so that the dashboards written for those work
// here. These small adapters, rather than component-base itself, because
// component-base registers into its own global legacyregistry (which would
// be a second registry to serve beside ours) and brings the
// component-base module and its dependencies into a binary that needs
// five hooks of it.
var (
	// RESTClientRequestDuration is client-go's request latency by verb
	// and host.
	RESTClientRequestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_request_duration_seconds",
		Help:    "Request latency in seconds. Broken down by verb, and host.",
		Buckets: restLatencyBuckets,
	}, []string{"verb", "host"})
	// RESTClientRateLimiterDuration is the time requests waited for
	// client-go's client-side rate limiter.
	RESTClientRateLimiterDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_rate_limiter_duration_seconds",
		Help:    "Client side rate limiter latency in seconds. Broken down by verb, and host.",
		Buckets: restLatencyBuckets,
	}, []string{"verb", "host"})
	// RESTClientRequestsTotal counts HTTP requests by status code, method
	// and host ("<error>" as the code when no response came).
	RESTClientRequestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: "Number of HTTP requests, partitioned by status code, method, and host.",
	}, []string{"code", "method", "host"})
	// RESTClientRequestRetriesTotal counts retried requests.
	RESTClientRequestRetriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_request_retries_total",
		Help: "Number of request retries, partitioned by status code, verb, and host.",
	}, []string{"code", "verb", "host"})
	// RESTClientResponseSize is the size of responses by verb and host.
	RESTClientResponseSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_response_size_bytes",
		Help:    "Response size in bytes. Broken down by verb and host.",
		Buckets: restSizeBuckets,
	}, []string{"verb", "host"})
)

// component-base's buckets: 5 ms to a minute; 64 bytes to 16 MiB.
var (
	restLatencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}
	restSizeBuckets    = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}
)

// hookClientGo installs the adapters in client-go, whose hooks are
// process-wide and take only the first registration; Register calls it.
var hookClientGo = sync.OnceFunc(func() {
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestLatency:     latency{RESTClientRequestDuration},
		RateLimiterLatency: latency{RESTClientRateLimiterDuration},
		RequestResult:      result{RESTClientRequestsTotal},
		RequestRetry:       retry{RESTClientRequestRetriesTotal},
		ResponseSize:       size{RESTClientResponseSize},
	})
})

type latency struct{ h *prometheus.HistogramVec }

func (l latency) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	l.h.WithLabelValues(verb, u.Host).Observe(d.Seconds())
}

type result struct{ c *prometheus.CounterVec }

func (r result) Increment(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}

type retry struct{ c *prometheus.CounterVec }

func (r retry) IncrementRetry(_ context.Context, code, verb, host string) {
	r.c.WithLabelValues(code, verb, host).Inc()
}

type size struct{ h *prometheus.HistogramVec }

func (s size) Observe(_ context.Context, verb, host string, n float64) {
	s.h.WithLabelValues(verb, host).Observe(n)
}
