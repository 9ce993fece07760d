package agent

import (
	"sync"
	"time"
)

// Health tracks what /livez and /healthz report, with kube-proxy's meaning
// and one addition:
//
//   - the rules are fresh when no table change has waited longer than the
//     timeout to be programmed (an agent that has never synced is waiting
//     since it started): /livez, and /healthz, fail otherwise;
//   - the node is eligible unless its table says the node is being
//     deleted: /healthz fails for such a node (kube-proxy's nodeEligible),
//     so that load balancers drain it first;
//   - the agent is in touch with the control plane unless no control plane
//     has answered it for longer than the control plane timeout: /healthz
//     fails then, because the rules, however fresh, may no longer be the
//     cluster's. /livez does not: the rules in force keep forwarding, and a
//     liveness probe must not restart a forwarder for the control plane's
//     absence.
type Health struct {
	timeout, controlPlaneTimeout time.Duration

	mu            sync.Mutex // guards the fields below
	oldestPending time.Time  // zero when nothing waits
	lastUpdated   time.Time
	toBeDeleted   bool
	// lostControlPlane is when the agent was last without a control
	// plane; zero while one answers.
	lostControlPlane time.Time
}

// HealthStatus is one reading of Health.
type HealthStatus struct {
	// Live is /livez: the rules are fresh.
	Live bool
	// Healthy is /healthz: live, eligible and in touch with a control
	// plane.
	Healthy bool
	// NodeEligible is false while the node is being deleted.
	NodeEligible bool
	// LastUpdated is when rules were last synced.
	LastUpdated time.Time
	// ControlPlaneLost is since when no control plane has answered; zero
	// while one does.
	ControlPlaneLost time.Time
}

// NewHealth returns a tracker, pending and without a control plane from
// now. controlPlaneTimeout 0 never fails /healthz for the control plane's
// absence, as kube-proxy never does for the API server's.
func NewHealth(timeout, controlPlaneTimeout time.Duration) *Health {
	now := time.Now()
	return &Health{timeout: timeout, controlPlaneTimeout: controlPlaneTimeout, oldestPending: now, lostControlPlane: now}
}

// Queued records that a change arrived at now.
func (h *Health) Queued(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestPending.IsZero() {
		h.oldestPending = now
	}
}

// Updated records a successful sync at now of a table whose node is (or
// is not) being deleted.
func (h *Health) Updated(now time.Time, toBeDeleted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oldestPending, h.lastUpdated, h.toBeDeleted = time.Time{}, now, toBeDeleted
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
		Live:             h.oldestPending.IsZero() || now.Sub(h.oldestPending) < h.timeout,
		NodeEligible:     !h.toBeDeleted,
		LastUpdated:      h.lastUpdated,
		ControlPlaneLost: h.lostControlPlane,
	}
	inTouch := h.controlPlaneTimeout == 0 || h.lostControlPlane.IsZero() || now.Sub(h.lostControlPlane) < h.controlPlaneTimeout
	st.Healthy = st.Live && st.NodeEligible && inTouch
	return st
}
