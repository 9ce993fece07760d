package metrics

import (
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// GRPCServer is the gRPC server's metrics, from go-grpc-middleware's
// Prometheus provider: grpc_server_started_total, grpc_server_handled_total
// (by code), grpc_server_msg_received_total, grpc_server_msg_sent_total,
// by service, method and type, and grpc_server_handling_seconds. Its
// interceptors go outermost, so that calls refused by limits or
// authentication are counted with their codes. For a Sync stream,
// handling time is the stream's life, observed when it ends.
var GRPCServer = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
	grpcprom.WithHistogramBuckets(prometheus.ExponentialBuckets(0.001, 4, 12)),
))
