package app

import (
	"errors"
	"net/http"
	"time"
)

// Watches is what readiness and liveness need of the watcher.
type Watches interface {
	// Stale returns an error when a watch has failed for longer than grace.
	Stale(now time.Time, grace time.Duration) error
	// Stuck returns an error when the publish loop stopped going round for
	// longer than limit.
	Stuck(now time.Time, limit time.Duration) error
}

const (
	// staleGrace is how long a watch may fail before the replica stops
	// being ready: a reflector relists within seconds of an error and
	// backs off to 30 s at most, so a longer failure is an API server the
	// replica cannot reach, and its world is falling behind.
	staleGrace = 45 * time.Second
	// stuckLimit is how long the publish loop may not go round before the
	// replica is not live: it goes round every heartbeat, and a publish of
	// every Service of a large cluster takes seconds.
	stuckLimit = 2 * time.Minute
)

// Readiness is what /readyz and the gRPC health service report: the
// informers synced, a serving certificate valid now exists, and no watch
// has failed for longer than staleGrace. Agents fail back to a replica
// only once its health service says it serves.
type Readiness struct {
	Synced, Certified <-chan struct{}
	// CertProblem, when set, says why there is no serving certificate
	// valid at now, "" when there is one (certs.Bootstrapper.Problem): a
	// replica that cannot keep its CA says why. Unset, Certified alone
	// counts.
	CertProblem func(now time.Time) string
	// Watches is nil where nothing watches (tests of the server alone).
	Watches Watches
	// AgentPods, when set, is closed once the agent Pods an agent token
	// must be bound to are listed (auth.Authenticator.Listed): until then
	// no agent is admitted, and a replica whose Role lacks them (an
	// upgrade that skipped rbac.yaml) never becomes ready, so its rollout
	// stops while the old replicas serve.
	AgentPods <-chan struct{}
}

// probeError is why a probe fails. Public is all /readyz and /healthz
// say, to anyone who can reach them: the probes need only the status,
// and an operator reading the body a name for the failing check; the
// wrapped error, with the API server's answers, goes to the log.
type probeError struct {
	public string
	err    error
}

func (e *probeError) Error() string {
	if e.err == nil {
		return e.public
	}
	return e.public + ": " + e.err.Error()
}

func (e *probeError) Unwrap() error { return e.err }

// publicReason is what a probe endpoint may say about err.
func publicReason(err error) string {
	var pe *probeError
	if errors.As(err, &pe) {
		return pe.public
	}
	return "not ready"
}

// Check returns why the replica is not ready at now, nil when it is.
func (r Readiness) Check(now time.Time) error {
	select {
	case <-r.Synced:
	default:
		return &probeError{public: "informer caches not synced"}
	}
	if r.AgentPods != nil {
		select {
		case <-r.AgentPods:
		default:
			return &probeError{public: "agent Pods not listed"}
		}
	}
	if r.CertProblem != nil {
		if p := r.CertProblem(now); p != "" {
			return &probeError{public: p}
		}
	} else {
		select {
		case <-r.Certified:
		default:
			return &probeError{public: "no serving certificate yet"}
		}
	}
	if r.Watches != nil {
		if err := r.Watches.Stale(now, staleGrace); err != nil {
			return &probeError{public: "a watch of the API server has failed for over " + staleGrace.String(), err: err}
		}
	}
	return nil
}

// healthHandlers serves /readyz from ready, and /healthz and /livez from
// the publish loop's heartbeat: a replica whose loop is stuck cannot
// publish, and a restart is what fixes it; an API server it cannot reach
// is not, so that only makes it unready. They are open to anyone who
// reaches the port, as the kube components' are
// (--authorization-always-allow-paths), and so say only "ok" or the
// failing check's public reason.
func healthHandlers(mux *http.ServeMux, ready Readiness, watches Watches) {
	answer := func(w http.ResponseWriter, err error) {
		w.Header().Set("Cache-Control", "no-store")
		if err != nil {
			http.Error(w, publicReason(err), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { answer(w, ready.Check(time.Now())) })
	live := func(w http.ResponseWriter, _ *http.Request) {
		var err error
		if watches != nil {
			if err = watches.Stuck(time.Now(), stuckLimit); err != nil {
				err = &probeError{public: "the publish loop is stuck", err: err}
			}
		}
		answer(w, err)
	}
	mux.HandleFunc("GET /healthz", live)
	mux.HandleFunc("GET /livez", live)
}
