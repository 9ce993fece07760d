// Package metrics defines the node agent's Prometheus metrics: kube-proxy's
// names where kube-proxy has the same metric, proxyplane_agent_* otherwise.
package metrics

import "github.com/prometheus/client_golang/prometheus"

var (
	// SyncProxyRulesDuration is kube-proxy's sync duration histogram.
	SyncProxyRulesDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "sync_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	// SyncFullProxyRulesDuration covers full syncs only.
	SyncFullProxyRulesDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "sync_full_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds for full resyncs",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	// SyncPartialProxyRulesDuration covers partial syncs only.
	SyncPartialProxyRulesDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "sync_partial_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds for partial resyncs",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	// SyncProxyRulesLastTimestamp is when rules were last synced.
	SyncProxyRulesLastTimestamp = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: "kubeproxy", Name: "sync_proxy_rules_last_timestamp_seconds",
		Help: "The last time proxy rules were successfully synced",
	})
	// NetworkProgrammingDuration is the time from an endpoints change (the
	// slice's last-change-trigger-time) to its rules being in force.
	NetworkProgrammingDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "network_programming_duration_seconds",
		Help:    "In Cluster Network Programming Latency in seconds",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
	})
	// IPTablesRestoreFailuresTotal counts failed iptables-restore runs.
	IPTablesRestoreFailuresTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: "kubeproxy", Name: "sync_proxy_rules_iptables_restore_failures_total",
		Help: "Cumulative proxy iptables restore failures",
	})
	// Connected is 1 while the agent has a Sync stream to a control plane.
	Connected = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "proxyplane_agent", Name: "connected",
		Help: "1 while a Sync stream to a control plane is open.",
	})
	// AppliedVersion carries the version in force as a label, value 1.
	AppliedVersion = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "proxyplane_agent", Name: "applied_version_info",
		Help: "The table version in force (label version), value 1.",
	}, []string{"version"})
	// CacheSavedTimestamp is when the table cache was last written.
	CacheSavedTimestamp = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "proxyplane_agent", Name: "cache_saved_timestamp_seconds",
		Help: "When the table cache was last written; its age is time() minus this.",
	})
	// NFTablesSyncFailuresTotal is kube-proxy's
	// sync_proxy_rules_nftables_sync_failures_total: nftables
	// transactions the kernel refused.
	NFTablesSyncFailuresTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: "kubeproxy", Name: "sync_proxy_rules_nftables_sync_failures_total",
		Help: "nftables transactions that failed.",
	})
	// NacksTotal counts table responses the agent rejected.
	NacksTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "proxyplane_agent", Name: "nacks_total",
		Help: "Table responses rejected (invalid, or failed to persist or program).",
	})
	// HealthCheckErrorsTotal counts health check server updates that left
	// some healthCheckNodePort unserved (a port taken by another process).
	HealthCheckErrorsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "proxyplane_agent", Name: "healthcheck_errors_total",
		Help: "Health check server updates that could not serve every healthCheckNodePort.",
	})
	// ConntrackReconcilerSyncDuration is kube-proxy's metric of the same
	// name: how long each stale-conntrack cleanup took.
	ConntrackReconcilerSyncDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: "kubeproxy", Name: "conntrack_reconciler_sync_duration_seconds",
		Help:    "Time taken to delete stale UDP conntrack entries after a sync.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	// ConntrackReconcilerDeletedEntriesTotal is kube-proxy's metric of the
	// same name: stale conntrack entries deleted.
	ConntrackReconcilerDeletedEntriesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: "kubeproxy", Name: "conntrack_reconciler_deleted_entries_total",
		Help: "Stale UDP conntrack entries deleted after syncs.",
	})
	// SyncProxyRulesLastQueuedTimestamp is kube-proxy's metric of the same
	// name: when a change was last queued to be programmed. With
	// sync_proxy_rules_last_timestamp_seconds it shows a sync that is
	// overdue.
	SyncProxyRulesLastQueuedTimestamp = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: "kubeproxy", Name: "sync_proxy_rules_last_queued_timestamp_seconds",
		Help: "The last time a sync of proxy rules was queued",
	})
	// ProxyHealthzTotal is kube-proxy's count of /healthz answers, by HTTP
	// status code.
	ProxyHealthzTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "kubeproxy", Name: "proxy_healthz_total",
		Help: "Cumulative proxy healthz HTTP status",
	}, []string{"code"})
	// ProxyLivezTotal is kube-proxy's count of /livez answers, by HTTP
	// status code.
	ProxyLivezTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "kubeproxy", Name: "proxy_livez_total",
		Help: "Cumulative proxy livez HTTP status",
	}, []string{"code"})
)

// Register registers every metric on r. Call it once per registry.
func Register(r prometheus.Registerer) {
	r.MustRegister(SyncProxyRulesDuration, SyncFullProxyRulesDuration, SyncPartialProxyRulesDuration,
		SyncProxyRulesLastTimestamp, NetworkProgrammingDuration, IPTablesRestoreFailuresTotal,
		Connected, AppliedVersion, CacheSavedTimestamp, NacksTotal, HealthCheckErrorsTotal, NFTablesSyncFailuresTotal,
		ConntrackReconcilerSyncDuration, ConntrackReconcilerDeletedEntriesTotal,
		SyncProxyRulesLastQueuedTimestamp, ProxyHealthzTotal, ProxyLivezTotal)
}
