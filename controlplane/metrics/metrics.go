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
	// ConvergenceSeconds is the convergence SLI (docs/metrics.md): for
	// each change to the Services, the time from its start until the
	// share quantile_reached of the agents connected to this replica that
	// must receive it had acknowledged a table containing it.
	ConvergenceSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "convergence_seconds",
		Help:    "Per change to the Services: seconds from its trigger time (or publication) until the share quantile_reached (0.5, 0.9, 0.99, 1) of this replica's agents whose table it alters had acknowledged it.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
	}, []string{"quantile_reached"})
	// ConvergenceIncompleteTotal counts changes evicted from the bounded
	// bookkeeping before reaching a share: missing observations of
	// ConvergenceSeconds, each slower than any it holds.
	ConvergenceIncompleteTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "convergence_incomplete_total",
		Help: "Changes dropped from the convergence bookkeeping (the latest 64 are kept) before the share quantile_reached of their agents had acknowledged them.",
	}, []string{"quantile_reached"})
	// ConvergenceOpen is the number of kept changes that some agent that
	// must receive them has not acknowledged.
	ConvergenceOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "convergence_open_changes",
		Help: "Changes that some agent connected to this replica, whose table they alter, has not yet acknowledged.",
	})
	// DriftRepairsTotal counts the drift repairs agents reported: rules
	// someone else changed on a node that its agent put back.
	DriftRepairsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "drift_repairs_total",
		Help: "Drift repairs reported by agents on this replica: rules changed behind an agent's back that it put back. ListNodes names the nodes.",
	})
	// DriftReportsTrimmedTotal counts the drift reports beyond the bounds
	// that the control plane trimmed instead of refusing.
	DriftReportsTrimmedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "drift_reports_trimmed_total",
		Help: "Drift reports from agents that exceeded the bounds (8 repairs, 256-byte details) and were trimmed.",
	})
	// ConvergenceLeftTotal counts, over the changes, the agents that left
	// this replica before converging to one: they stop counting in it.
	ConvergenceLeftTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "convergence_left_total",
		Help: "Agents that disconnected from this replica, or moved to another, before acknowledging a change that altered their table; summed over changes. They no longer count in its convergence.",
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
		InvalidObjects, EventsDroppedTotal, ConvergenceSeconds, ConvergenceIncompleteTotal, ConvergenceOpen,
		DriftRepairsTotal, DriftReportsTrimmedTotal, ConvergenceLeftTotal)
	r.MustRegister(GRPCServer)
	r.MustRegister(RESTClientRequestDuration, RESTClientRateLimiterDuration, RESTClientRequestsTotal,
		RESTClientRequestRetriesTotal, RESTClientResponseSize)
	hookClientGo()
}
