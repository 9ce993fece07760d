// Package metrics defines the control plane's Prometheus metrics. They are
// registered once, by Register, on the registry the binary serves.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "proxyplane_controlplane"

var (
	// NodesConnected is the number of agents with an open Sync stream.
	NodesConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "nodes_connected",
		Help: "Node agents with an open Sync stream on this replica.",
	})
	// VersionsPendingAck is the number of table responses sent and not yet
	// acknowledged or rejected.
	VersionsPendingAck = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "versions_pending_ack",
		Help: "Table responses sent to agents and not yet ACKed or NACKed.",
	})
	// NacksTotal counts rejected table responses.
	NacksTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "nacks_total",
		Help: "Table responses rejected by agents.",
	})
	// ResponsesTotal counts table responses sent, by kind (snapshot, delta).
	ResponsesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "responses_total",
		Help: "Table responses sent to agents, by kind.",
	}, []string{"kind"})
	// SentBytesTotal counts table bytes sent, by kind (snapshot, delta).
	SentBytesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "sent_bytes_total",
		Help: "Encoded table response bytes sent to agents, by kind.",
	}, []string{"kind"})
	// LagResetsTotal counts agents reset with a snapshot after falling
	// behind by more than the pending-change limit.
	LagResetsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "lag_resets_total",
		Help: "Snapshots sent because an agent fell too far behind for a delta.",
	})
	// StreamsClosedTotal counts Sync streams closed, by reason.
	StreamsClosedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "streams_closed_total",
		Help: "Sync streams closed, by reason (eof, replaced, keepalive_timeout, write_timeout, ack_timeout, invalid, error, admission, stale, behind).",
	}, []string{"reason"})
	// ComputeDurationSeconds is the time to recompute changed Services and
	// Nodes and publish the resulting world.
	ComputeDurationSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: "compute_duration_seconds",
		Help:    "Time to recompute a batch of changed Services and Nodes and publish it.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
	})
	// ComputeErrorsTotal counts failed Service computations: an invalid
	// Service, left out of every table, or a cache read failure, which
	// keeps the Service's last good state.
	ComputeErrorsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "compute_errors_total",
		Help: "Service computations that failed: invalid Services (left out of every table) and cache read failures (last good state kept).",
	})
	// InvalidObjects is the number of Services and EndpointSlices with a
	// current problem: the entries ListEvents lists.
	InvalidObjects = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "invalid_objects",
		Help: "Services and EndpointSlices currently left out, wholly or in part, as invalid (the ListEvents entries).",
	})
	// EventsDroppedTotal counts events dropped to keep the ListEvents list
	// bounded.
	EventsDroppedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "events_dropped_total",
		Help: "Events about invalid objects dropped because the list was full.",
	})
	// Services is the number of proxied Services in the current world.
	Services = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "services",
		Help: "Proxied Services in the current world.",
	})
)

// The label values of the hottest counters, resolved once: a Sync stream
// counts every response it sends, and looking a label up each time is a
// map access and a lock per agent per change.
var (
	// SnapshotsSent is ResponsesTotal{kind="snapshot"}.
	SnapshotsSent = ResponsesTotal.WithLabelValues("snapshot")
	// DeltasSent is ResponsesTotal{kind="delta"}.
	DeltasSent = ResponsesTotal.WithLabelValues("delta")
	// SnapshotBytesSent is SentBytesTotal{kind="snapshot"}.
	SnapshotBytesSent = SentBytesTotal.WithLabelValues("snapshot")
	// DeltaBytesSent is SentBytesTotal{kind="delta"}.
	DeltaBytesSent = SentBytesTotal.WithLabelValues("delta")
)

// Register registers every metric on r: the control plane's own, the
// gRPC server's (GRPCServer) and client-go's, whose hooks it installs in
// client-go at the first call. Call it once per registry.
func Register(r prometheus.Registerer) {
	r.MustRegister(NodesConnected, VersionsPendingAck, NacksTotal, ResponsesTotal, SentBytesTotal,
		LagResetsTotal, StreamsClosedTotal, ComputeDurationSeconds, ComputeErrorsTotal, Services,
		InvalidObjects, EventsDroppedTotal)
	r.MustRegister(GRPCServer)
	r.MustRegister(RESTClientRequestDuration, RESTClientRateLimiterDuration, RESTClientRequestsTotal,
		RESTClientRequestRetriesTotal, RESTClientResponseSize)
	hookClientGo()
}
