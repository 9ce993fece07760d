package agent

import (
	"sync"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// Health tracks what /livez, /healthz and /readyz report, with kube-proxy
// v1.36's meaning (pkg/proxy/healthcheck/proxy_health.go) per IP family:
//
//   - a family is healthy unless a table change it has been handed has
//     waited longer than the timeout (twice the sync period) to be
//     programmed in it. Nothing is pending at start: an agent waiting for
//     its first table is healthy, as kube-proxy is until an update it
//     received goes unapplied, so that a liveness probe never kills an
//     agent waiting for a control plane that is still starting. /livez
//     fails, and /healthz with it, once a family is not healthy;
//   - the node is eligible once a programmed table has named it, and
//     unless that table says the node is being deleted (a deletionTimestamp
//     or the autoscaler's taint): kube-proxy's nodeEligible, false too
//     while it has not seen its Node. /healthz fails for a node that is
//     not, so that load balancers send nothing to a node without rules
//     and drain one going away first; /livez does not;
//   - opt-in only (a control plane timeout above 0; the default is 0):
//     /healthz also fails once no control plane has answered for longer
//     than that timeout. kube-proxy never fails for the API server's
//     absence, and by default neither does the agent: one control plane
//     outage would otherwise take every node out of every load balancer
//     at the same moment, while the rules in force keep forwarding. The
//     staleness is a metric instead
//     (proxyplane_agent_control_plane_last_answered_timestamp_seconds);
//   - ready (/readyz, which kube-proxy does not serve) once a table is in
//     force, and while every family is healthy: what a readiness probe
//     and a rolling update need to know.
//
// Its methods take the time, so that tests need no clock; they are safe
// for concurrent use.
type Health struct {
	timeout, controlPlaneTimeout time.Duration
	families                     []dataplane.Family

	mu sync.Mutex // guards the fields below
	// lastUpdated is when each family was last programmed (or the
	// tracker created, as kube-proxy's SyncLoop marks it at start in case
	// no sync ever succeeds).
	lastUpdated map[dataplane.Family]time.Time
	// oldestPending is, per family, when the oldest change not yet
	// programmed in it was handed over; absent when nothing waits.
	oldestPending map[dataplane.Family]time.Time
	// holdsTable is true once a table has been programmed; ineligible
	// is what the last one said of the node.
	holdsTable, ineligible bool
	// lostControlPlane is when the agent was last without a control
	// plane (its start, until one answers); zero while one answers.
	lostControlPlane time.Time
}

// FamilyHealth is one IP family's health, kube-proxy's ProxierHealth.
type FamilyHealth struct {
	// LastUpdated is when the family's rules were last programmed.
	LastUpdated time.Time
	// Healthy is false while a change has waited past the timeout.
	Healthy bool
}

// HealthStatus is one reading of Health.
type HealthStatus struct {
	// Live is /livez, kube-proxy's "healthy": every family is.
	Live bool
	// Healthy is /healthz: live, the node eligible and, with the opt-in
	// control plane timeout, a control plane heard from within it.
	Healthy bool
	// Ready is /readyz: live and holding a table in force.
	Ready bool
	// NodeEligible is false until a table has named the node, and while
	// the node is being deleted.
	NodeEligible bool
	// HoldsTable is true once a table has been programmed.
	HoldsTable bool
	// LastUpdated is the latest of the families' LastUpdated.
	LastUpdated time.Time
	// Families is each family's health.
	Families map[dataplane.Family]FamilyHealth
	// ControlPlaneLost is since when no control plane has answered; zero
	// while one does.
	ControlPlaneLost time.Time
	// ControlPlaneTimedOut is true when the opt-in control plane timeout
	// has passed since ControlPlaneLost: /healthz fails for it.
	ControlPlaneTimedOut bool
}

// NewHealth returns a tracker of families, created at now: every family
// healthy and updated at now, no table held, and no control plane since
// now. timeout is how long a change may wait to be programmed (kube-proxy
// takes twice its sync period). controlPlaneTimeout 0 never fails
// /healthz for the control plane's absence, as kube-proxy never does for
// the API server's.
func NewHealth(timeout, controlPlaneTimeout time.Duration, families []dataplane.Family, now time.Time) *Health {
	h := &Health{
		timeout: timeout, controlPlaneTimeout: controlPlaneTimeout, families: families,
		lastUpdated: map[dataplane.Family]time.Time{}, oldestPending: map[dataplane.Family]time.Time{},
		lostControlPlane: now,
	}
	for _, f := range families {
		h.lastUpdated[f] = now
	}
	return h
}

// Queued records that a table change to program in every family arrived
// at now (kube-proxy's QueuedUpdate): the oldest one counts.
func (h *Health) Queued(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.families {
		if _, ok := h.oldestPending[f]; !ok {
			h.oldestPending[f] = now
		}
	}
}

// Synced records that family's rules were programmed at now (kube-proxy's
// Updated): whatever it was handed is in force in it.
func (h *Health) Synced(family dataplane.Family, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oldestPending, family)
	h.lastUpdated[family] = now
}

// Updated records that a table was programmed at now in every family;
// ineligible is kube-proxy's nodeEligible false: the table's node is
// being deleted or has no Node object.
func (h *Health) Updated(now time.Time, ineligible bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.families {
		delete(h.oldestPending, f)
		h.lastUpdated[f] = now
	}
	h.holdsTable, h.ineligible = true, ineligible
}

// ControlPlane records at now that a control plane answers (up) or that
// none does any longer.
func (h *Health) ControlPlane(up bool, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case up:
		h.lostControlPlane = time.Time{}
	case h.lostControlPlane.IsZero():
		h.lostControlPlane = now
	}
}

// Check reads the health at now.
func (h *Health) Check(now time.Time) HealthStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HealthStatus{
		Live:             true,
		NodeEligible:     h.holdsTable && !h.ineligible,
		HoldsTable:       h.holdsTable,
		Families:         make(map[dataplane.Family]FamilyHealth, len(h.families)),
		ControlPlaneLost: h.lostControlPlane,
	}
	for _, f := range h.families {
		fh := FamilyHealth{LastUpdated: h.lastUpdated[f], Healthy: true}
		if since, ok := h.oldestPending[f]; ok && now.Sub(since) >= h.timeout {
			fh.Healthy, st.Live = false, false
		}
		st.Families[f] = fh
		if fh.LastUpdated.After(st.LastUpdated) {
			st.LastUpdated = fh.LastUpdated
		}
	}
	st.ControlPlaneTimedOut = h.controlPlaneTimeout > 0 && !h.lostControlPlane.IsZero() && now.Sub(h.lostControlPlane) >= h.controlPlaneTimeout
	st.Healthy = st.Live && st.NodeEligible && !st.ControlPlaneTimedOut
	st.Ready = st.Live && st.HoldsTable
	return st
}
