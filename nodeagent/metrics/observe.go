package metrics

import (
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// ObserveSync records one family's sync, as kube-proxy's proxier does at
// the end of syncProxyRules: its duration (full or partial, success or
// not), the iptables mode's rule counts, when it last succeeded, and its
// failures under the mode's names.
// It is a dataplane.Observer: each Driver calls it on its Sync caller's
// goroutine.
func ObserveSync(r dataplane.SyncResult) {
	family := r.Family.String()
	took := r.Took.Seconds()
	SyncProxyRulesDuration.WithLabelValues(family).Observe(took)
	// kube-proxy's IPVS mode has no partial syncs, nor these metrics.
	if r.Mode != "ipvs" {
		if r.Full {
			SyncFullProxyRulesDuration.WithLabelValues(family).Observe(took)
		} else {
			SyncPartialProxyRulesDuration.WithLabelValues(family).Observe(took)
		}
	}
	// Set whether or not the restore succeeded, as kube-proxy sets them
	// before restoring.
	if r.Mode == "iptables" {
		for _, t := range r.Rules {
			IPTablesRulesTotal.WithLabelValues(t.Table, family).Set(float64(t.Total))
			IPTablesRulesLastSync.WithLabelValues(t.Table, family).Set(float64(t.Written))
		}
	}
	if r.Err == nil {
		SyncProxyRulesLastTimestamp.WithLabelValues(family).SetToCurrentTime()
		if r.Drifted {
			DriftRepairsTotal.WithLabelValues(family).Inc()
		}
		return
	}
	switch r.Mode {
	case "iptables", "ipvs":
		if xtables.IsRestoreFailed(r.Err) {
			IPTablesRestoreFailuresTotal.WithLabelValues(family).Inc()
		}
		// kube-proxy counts every failed partial sync here, whatever
		// failed: its next sync is full, as the Driver's is.
		if r.Mode == "iptables" && !r.Full {
			IPTablesPartialRestoreFailuresTotal.WithLabelValues(family).Inc()
		}
	case "nftables":
		NFTablesSyncFailuresTotal.WithLabelValues(family).Inc()
	}
}

// ObserveQueued records that a table response was queued for programming
// in every family.
func ObserveQueued(families []dataplane.Family) {
	for _, f := range families {
		SyncProxyRulesLastQueuedTimestamp.WithLabelValues(f.String()).SetToCurrentTime()
	}
}
