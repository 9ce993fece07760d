// Package metrics defines the node agent's Prometheus metrics: kube-proxy's
// names, types, labels and buckets where kube-proxy has the same metric
// (k8s.io/kubernetes pkg/proxy/metrics), proxyplane_agent_* otherwise.
// docs/metrics.md maps every kube-proxy metric to what the agent does
// with it.
//
// As in kube-proxy, the per-family metrics carry ip_family ("IPv4" or
// "IPv6"): kube-proxy runs one proxier per family, the agent one
// dataplane Driver per family, and each reports its own syncs.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const subsystem = "kubeproxy"

// labelFamily is kube-proxy's label naming the IP family, "IPv4" or
// "IPv6" (dataplane.Family's String).
const labelFamily = "ip_family"

// Kube-proxy's buckets: sync and conntrack durations double from 1 ms;
// network programming latency is in steps a person reads (0.25 s, 0.5 s,
// every second to a minute, then coarser to five minutes).
var (
	syncBuckets                = prometheus.ExponentialBuckets(0.001, 2, 15)
	networkProgrammingBuckets  = mergeBuckets(prometheus.LinearBuckets(0.25, 0.25, 2), prometheus.LinearBuckets(1, 1, 59), prometheus.LinearBuckets(60, 5, 12), prometheus.LinearBuckets(120, 30, 7))
	conntrackReconcilerBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)
)

// mergeBuckets is component-base's MergeBuckets: the lists concatenated
// (each is ascending and starts above the previous one's end).
func mergeBuckets(lists ...[]float64) []float64 {
	var out []float64
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// kube-proxy's metrics that every mode registers.
var (
	// SyncProxyRulesDuration is the duration of one family's sync, full
	// or partial, failed or not, as kube-proxy observes it.
	SyncProxyRulesDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds",
		Buckets: syncBuckets,
	}, []string{labelFamily})
	// SyncProxyRulesLastTimestamp is when a family's rules were last
	// synced successfully.
	SyncProxyRulesLastTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_last_timestamp_seconds",
		Help: "The last time proxy rules were successfully synced",
	}, []string{labelFamily})
	// SyncProxyRulesLastQueuedTimestamp is when a table response was last
	// queued to be programmed. Much later than
	// sync_proxy_rules_last_timestamp_seconds, it shows a sync that is
	// overdue.
	SyncProxyRulesLastQueuedTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_last_queued_timestamp_seconds",
		Help: "The last time a sync of proxy rules was queued",
	}, []string{labelFamily})
	// NetworkProgrammingDuration is the time from an endpoints change (the
	// slice's last-change-trigger-time, carried by the control plane) to
	// its rules being in force, per family of the Service's cluster IPs.
	NetworkProgrammingDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "network_programming_duration_seconds",
		Help:    "In Cluster Network Programming Latency in seconds",
		Buckets: networkProgrammingBuckets,
	}, []string{labelFamily})
	// EndpointChangesPending is the number of Services whose endpoints
	// change in the table response being programmed; 0 between responses
	// (the agent's analogue of kube-proxy's endpoints change tracker,
	// docs/metrics.md).
	EndpointChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_pending",
		Help: "Pending proxy rules Endpoint changes",
	})
	// EndpointChangesTotal counts Services whose endpoints changed, over
	// every table response received.
	EndpointChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_endpoint_changes_total",
		Help: "Cumulative proxy rules Endpoint changes",
	})
	// ServiceChangesPending is the number of Services added, removed or
	// changed (other than in their endpoints) by the table response being
	// programmed; 0 between responses.
	ServiceChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_pending",
		Help: "Pending proxy rules Service changes",
	})
	// ServiceChangesTotal counts Services added, removed or changed (other
	// than in their endpoints), over every table response received.
	ServiceChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_service_changes_total",
		Help: "Cumulative proxy rules Service changes",
	})
	// SyncProxyRulesNoLocalEndpointsTotal is, after each successful sync,
	// the number of service ports whose Local traffic policy has no local
	// endpoint while the Service has endpoints (traffic_policy "internal"
	// or "external"): the ports whose traffic of that kind is dropped.
	SyncProxyRulesNoLocalEndpointsTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_no_local_endpoints_total",
		Help: "Number of services with a Local traffic policy and no endpoints",
	}, []string{"traffic_policy", labelFamily})
	// ProxyHealthzTotal is kube-proxy's count of /healthz answers, by HTTP
	// status code.
	ProxyHealthzTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "proxy_healthz_total",
		Help: "Cumulative proxy healthz HTTP status",
	}, []string{"code"})
	// ProxyLivezTotal is kube-proxy's count of /livez answers, by HTTP
	// status code.
	ProxyLivezTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "proxy_livez_total",
		Help: "Cumulative proxy livez HTTP status",
	}, []string{"code"})
)

// kube-proxy's metrics that only some modes register (see Register).
var (
	// SyncFullProxyRulesDuration covers full syncs only.
	SyncFullProxyRulesDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "sync_full_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds for full resyncs",
		Buckets: syncBuckets,
	}, []string{labelFamily})
	// SyncPartialProxyRulesDuration covers partial syncs only.
	SyncPartialProxyRulesDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "sync_partial_proxy_rules_duration_seconds",
		Help:    "SyncProxyRules latency in seconds for partial resyncs",
		Buckets: syncBuckets,
	}, []string{labelFamily})
	// IPTablesRestoreFailuresTotal counts syncs that iptables-restore
	// refused (iptables and IPVS modes).
	IPTablesRestoreFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_restore_failures_total",
		Help: "Cumulative proxy iptables restore failures",
	}, []string{labelFamily})
	// IPTablesPartialRestoreFailuresTotal counts failed partial syncs of
	// the iptables mode: each makes the next sync full.
	IPTablesPartialRestoreFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
		Help: "Cumulative proxy iptables partial restore failures",
	}, []string{labelFamily})
	// IPTablesRulesTotal is, per table, the rules the iptables mode owns
	// after its last sync, those of chains a partial sync left alone
	// included.
	IPTablesRulesTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_total",
		Help: "Total number of iptables rules owned by kube-proxy",
	}, []string{"table", labelFamily})
	// IPTablesRulesLastSync is, per table, the rules the iptables mode's
	// last sync wrote.
	IPTablesRulesLastSync = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_iptables_last",
		Help: "Number of iptables rules written by kube-proxy in last sync",
	}, []string{"table", labelFamily})
	// NFTablesSyncFailuresTotal counts failed nftables syncs.
	NFTablesSyncFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "sync_proxy_rules_nftables_sync_failures_total",
		Help: "Cumulative proxy nftables sync failures",
	}, []string{labelFamily})
	// ConntrackReconcilerSyncDuration is how long each family's
	// stale-conntrack cleanup after a sync took.
	ConntrackReconcilerSyncDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: subsystem, Name: "conntrack_reconciler_sync_duration_seconds",
		Help:    "ReconcileConntrackFlowsLatency latency in seconds",
		Buckets: conntrackReconcilerBuckets,
	}, []string{labelFamily})
	// ConntrackReconcilerDeletedEntriesTotal counts stale conntrack
	// entries deleted.
	ConntrackReconcilerDeletedEntriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: subsystem, Name: "conntrack_reconciler_deleted_entries_total",
		Help: "Cumulative conntrack flows deleted by conntrack reconciler",
	}, []string{labelFamily})
)

// The agent's own metrics: what kube-proxy has no counterpart for.
var (
	// Connected is 1 while the agent has a Sync stream to a control plane.
	Connected = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "proxyplane_agent", Name: "connected",
		Help: "1 while a Sync stream to a control plane is open.",
	})
	// ControlPlaneLastAnsweredTimestamp is when a control plane last
	// answered the agent: the time of the scrape while a Sync stream is
	// open, else when the last one ended (or when the agent started, if
	// none has opened since). time() minus it is how stale the table in
	// force may be: the cluster's changes since then have not reached the
	// node. It is how a control plane outage shows, since /healthz does
	// not fail for one unless --control-plane-timeout is set
	// (ObserveConnected sets it).
	ControlPlaneLastAnsweredTimestamp = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "proxyplane_agent", Name: "control_plane_last_answered_timestamp_seconds",
		Help: "When a control plane last answered: now while a Sync stream is open, else when the last one ended (or the agent started). time() minus this is the age of what the agent knows of the cluster.",
	}, lastAnswered.seconds)
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
	// DriftRepairsTotal counts the rules someone else changed on the node
	// (another proxy, a CNI, an operator) that a drift check found and a
	// full sync put back, per IP family. The agent reports them to the
	// control plane too (ListNodes, controlplane status).
	DriftRepairsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "proxyplane_agent", Name: "drift_repairs_total",
		Help: "Rules changed behind the agent's back (tables, chains, sets removed or added) that a drift check found and a full sync put back.",
	}, []string{labelFamily})
	// LeftoverObjectsRemovedTotal counts what the agent removed, after its
	// first successful sync, of the rules other modes and iptables
	// backends left on the node (chains, jumps, tables, virtual servers,
	// addresses, sets), by the mode that left them: a mode switch.
	LeftoverObjectsRemovedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "proxyplane_agent", Name: "leftover_objects_removed_total",
		Help: "Objects that other proxy modes or iptables backends left, removed once this mode's rules were in force.",
	}, []string{"mode"})
	// LeftoverCleanupErrorsTotal counts failed removals of other modes'
	// leftovers; each is retried after the next successful sync.
	LeftoverCleanupErrorsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "proxyplane_agent", Name: "leftover_cleanup_errors_total",
		Help: "Failed removals of what other proxy modes or iptables backends left; retried after the next sync.",
	})
)

// Modes are the --proxy-mode values Register knows.
var Modes = []string{"iptables", "ipvs", "nftables"}

// Register registers on r every metric the agent in mode (its
// --proxy-mode) serves: kube-proxy's core metrics, those kube-proxy
// registers in that mode, and the agent's own. Call it once per registry.
func Register(r prometheus.Registerer, mode string) {
	r.MustRegister(SyncProxyRulesDuration, SyncProxyRulesLastTimestamp, SyncProxyRulesLastQueuedTimestamp,
		NetworkProgrammingDuration, EndpointChangesPending, EndpointChangesTotal,
		ServiceChangesPending, ServiceChangesTotal, SyncProxyRulesNoLocalEndpointsTotal,
		ProxyHealthzTotal, ProxyLivezTotal)
	// As kube-proxy's RegisterMetrics: IPVS syncs are all alike to it, and
	// its restores are iptables'; the conntrack reconciler runs in every
	// Linux mode.
	switch mode {
	case "iptables":
		r.MustRegister(SyncFullProxyRulesDuration, SyncPartialProxyRulesDuration,
			IPTablesRestoreFailuresTotal, IPTablesPartialRestoreFailuresTotal,
			IPTablesRulesTotal, IPTablesRulesLastSync)
	case "ipvs":
		r.MustRegister(IPTablesRestoreFailuresTotal)
	case "nftables":
		r.MustRegister(SyncFullProxyRulesDuration, SyncPartialProxyRulesDuration, NFTablesSyncFailuresTotal)
	}
	r.MustRegister(ConntrackReconcilerSyncDuration, ConntrackReconcilerDeletedEntriesTotal)
	r.MustRegister(Connected, ControlPlaneLastAnsweredTimestamp, AppliedVersion, CacheSavedTimestamp, NacksTotal, HealthCheckErrorsTotal)
	r.MustRegister(LeftoverObjectsRemovedTotal, LeftoverCleanupErrorsTotal, DriftRepairsTotal)
}

// lastAnswered is what ControlPlaneLastAnsweredTimestamp reads.
var lastAnswered = &answered{now: time.Now}

// answered tracks whether a control plane answers, and since when none
// has.
type answered struct {
	now func() time.Time

	mu sync.Mutex // guards the fields below
	up bool
	// at is when the last stream ended, or the agent started; zero until
	// ObserveConnected is first called.
	at time.Time
}

// seconds is the gauge's value: now while up, else at (0 if unknown).
func (a *answered) seconds() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.up:
		return float64(a.now().UnixNano()) / 1e9
	case a.at.IsZero():
		return 0
	}
	return float64(a.at.UnixNano()) / 1e9
}

// observe records at now that a stream is (up) or is no longer open.
func (a *answered) observe(up bool, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !up && (a.up || a.at.IsZero()) {
		a.at = now
	}
	a.up = up
}

// ObserveConnected records at now that a Sync stream to a control plane
// opened (up) or that none is open: proxyplane_agent_connected and
// ControlPlaneLastAnsweredTimestamp. The agent calls it with false at
// start, from when the latter counts until a first stream opens.
func ObserveConnected(up bool, now time.Time) {
	Connected.Set(map[bool]float64{true: 1, false: 0}[up])
	lastAnswered.observe(up, now)
}
