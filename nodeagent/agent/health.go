package agent

import (
	"sync"
	"time"
)

// Health tracks sync health as kube-proxy's healthz does: the agent is
// unhealthy when a table change has been waiting to be programmed for
// longer than the timeout. An agent that has never synced is waiting
// since it started.
type Health struct {
	timeout time.Duration

	mu            sync.Mutex // guards the fields below
	oldestPending time.Time  // zero when nothing waits
	lastUpdated   time.Time
}

// NewHealth returns a tracker with the given timeout, pending from now.
func NewHealth(timeout time.Duration) *Health {
	return &Health{timeout: timeout, oldestPending: time.Now()}
}

// Queued records that a change arrived at now.
func (h *Health) Queued(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.oldestPending.IsZero() {
		h.oldestPending = now
	}
}

// Updated records a successful sync at now.
func (h *Health) Updated(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.oldestPending, h.lastUpdated = time.Time{}, now
}

// Healthy reports whether nothing has waited longer than the timeout, and
// when rules were last synced.
func (h *Health) Healthy(now time.Time) (bool, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.oldestPending.IsZero() || now.Sub(h.oldestPending) < h.timeout, h.lastUpdated
}
