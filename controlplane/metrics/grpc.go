package metrics

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// GRPCServer is the gRPC server's metrics, under the names and labels of
// go-grpc-middleware's Prometheus provider (and grpc-prometheus before
// it), so that its dashboards work unchanged: grpc_server_started_total,
// grpc_server_handled_total (by code), grpc_server_msg_received_total,
// grpc_server_msg_sent_total, by grpc_type, grpc_service and
// grpc_method, and grpc_server_handling_seconds. Its interceptors go
// outermost, so that calls refused by limits or authentication are
// counted with their codes. For a Sync stream, handling time is the
// stream's life, observed when it ends.
//
// It is not the provider itself because of what that costs per message:
// its stream wrapper looks each message's counter up by its label values
// (a hash and a map read under a lock), reads the clock twice and
// allocates the label slice, on every message of every agent's stream:
// 3.6% of the control plane's CPU per response at 1,000 agents
// (docs/benchmarks.md). Here a stream resolves its two counters once, and
// a message costs an atomic add.
var GRPCServer = NewGRPCServerMetrics()

// GRPCServerMetrics is a collector of a gRPC server's metrics with the
// interceptors that record them.
type GRPCServerMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	handling                         *prometheus.HistogramVec
}

// NewGRPCServerMetrics returns unregistered metrics.
func NewGRPCServerMetrics() *GRPCServerMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	return &GRPCServerMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total", Help: "Total number of RPCs started on the server.",
		}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total", Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, append(labels[:3:3], "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total", Help: "Total number of RPC stream messages received on the server.",
		}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total", Help: "Total number of gRPC stream messages sent by the server.",
		}, labels),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "grpc_server_handling_seconds",
			Help: "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			// From a millisecond (a unary call) to about 49 days (an
			// agent's stream).
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12),
		}, labels),
	}
}

// Describe implements prometheus.Collector.
func (m *GRPCServerMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.started.Describe(ch)
	m.handled.Describe(ch)
	m.received.Describe(ch)
	m.sent.Describe(ch)
	m.handling.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *GRPCServerMetrics) Collect(ch chan<- prometheus.Metric) {
	m.started.Collect(ch)
	m.handled.Collect(ch)
	m.received.Collect(ch)
	m.sent.Collect(ch)
	m.handling.Collect(ch)
}

// The values of grpc_type.
const (
	typeUnary        = "unary"
	typeClientStream = "client_stream"
	typeServerStream = "server_stream"
	typeBidiStream   = "bidi_stream"
)

func streamType(clientStreams, serverStreams bool) string {
	switch {
	case !clientStreams && !serverStreams:
		return typeUnary
	case clientStreams && !serverStreams:
		return typeClientStream
	case !clientStreams:
		return typeServerStream
	}
	return typeBidiStream
}

// call is one call's series, resolved once when it starts.
type call struct {
	m              *GRPCServerMetrics
	labels         [3]string
	received, sent prometheus.Counter
	start          time.Time
}

func (m *GRPCServerMetrics) begin(typ, fullMethod string) *call {
	service, method := splitMethod(fullMethod)
	c := &call{m: m, labels: [3]string{typ, service, method}, start: time.Now()}
	m.started.WithLabelValues(c.labels[:]...).Inc()
	c.received = m.received.WithLabelValues(c.labels[:]...)
	c.sent = m.sent.WithLabelValues(c.labels[:]...)
	return c
}

// end records the call's outcome: its code and handling time.
func (c *call) end(err error) {
	c.m.handled.WithLabelValues(c.labels[0], c.labels[1], c.labels[2], status.Code(err).String()).Inc()
	c.m.handling.WithLabelValues(c.labels[:]...).Observe(time.Since(c.start).Seconds())
}

// splitMethod splits "/package.Service/Method".
func splitMethod(full string) (string, string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.Index(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", "unknown"
}

// UnaryServerInterceptor records unary calls: a request received, and a
// response sent when the call succeeds.
func (m *GRPCServerMetrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		c := m.begin(typeUnary, info.FullMethod)
		c.received.Inc()
		resp, err := handler(ctx, req)
		if err == nil {
			c.sent.Inc()
		}
		c.end(err)
		return resp, err
	}
}

// StreamServerInterceptor records streams and every message each sends
// and receives.
func (m *GRPCServerMetrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		c := m.begin(streamType(info.IsClientStream, info.IsServerStream), info.FullMethod)
		err := handler(srv, &countedStream{ServerStream: ss, received: c.received, sent: c.sent})
		c.end(err)
		return err
	}
}

// countedStream counts the messages a stream sends and receives.
type countedStream struct {
	grpc.ServerStream
	received, sent prometheus.Counter
}

// SendMsg implements grpc.ServerStream.
func (s *countedStream) SendMsg(m any) error {
	err := s.ServerStream.SendMsg(m)
	if err == nil {
		s.sent.Inc()
	}
	return err
}

// RecvMsg implements grpc.ServerStream.
func (s *countedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.received.Inc()
	}
	return err
}

// InitializeMetrics creates every method's series at zero, so that they
// exist from the start.
func (m *GRPCServerMetrics) InitializeMetrics(s interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
},
) {
	for service, info := range s.GetServiceInfo() {
		for _, mi := range info.Methods {
			l := []string{streamType(mi.IsClientStream, mi.IsServerStream), service, mi.Name}
			m.started.WithLabelValues(l...)
			m.received.WithLabelValues(l...)
			m.sent.WithLabelValues(l...)
			m.handling.WithLabelValues(l...)
		}
	}
}
