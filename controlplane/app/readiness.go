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
// informers synced, a serving certificate exists, and no watch has failed
// for longer than staleGrace. Agents fail back to a replica only once its
// health service says it serves.
type Readiness struct {
	Synced, Certified <-chan struct{}
	// Watches is nil where nothing watches (tests of the server alone).
	Watches Watches
}

// Check returns why the replica is not ready at now, nil when it is.
func (r Readiness) Check(now time.Time) error {
	for _, c := range []struct {
		ready <-chan struct{}
		why   string
	}{{r.Synced, "informer caches not synced"}, {r.Certified, "no serving certificate yet"}} {
		select {
		case <-c.ready:
		default:
			return errors.New(c.why)
		}
	}
	if r.Watches != nil {
		return r.Watches.Stale(now, staleGrace)
	}
	return nil
}

// healthHandlers serves /readyz from ready and /healthz from the publish
// loop's heartbeat: a replica whose loop is stuck cannot publish, and a
// restart is what fixes it; an API server it cannot reach is not, so
// that only makes it unready.
func healthHandlers(mux *http.ServeMux, ready Readiness, watches Watches) {
	answer := func(w http.ResponseWriter, err error) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { answer(w, ready.Check(time.Now())) })
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		var err error
		if watches != nil {
			err = watches.Stuck(time.Now(), stuckLimit)
		}
		answer(w, err)
	})
}
