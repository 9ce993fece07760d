package watch

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// health follows each informer's watch from its error handler: a watch
// fails from its first error after it last made progress, and has
// recovered once the informer's resourceVersion moved on (an event or a
// bookmark arrived, or a relist completed). A replica whose watch fails
// serves a world that may be behind the cluster; that is what readiness
// says.
type health struct {
	// progress returns an informer's last synced resourceVersion.
	progress map[string]func() string

	mu      sync.Mutex // guards failing
	failing map[string]failure
}

// failure is a watch failing since a time, at a resourceVersion.
type failure struct {
	since time.Time
	rv    string
	err   error
}

func newHealth() *health {
	return &health{progress: map[string]func() string{}, failing: map[string]failure{}}
}

// track adds the informer called name, whose progress lastRV reports.
func (h *health) track(name string, lastRV func() string) { h.progress[name] = lastRV }

// failed records a watch error of name at now. Safe for concurrent use.
func (h *health) failed(name string, err error, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.failing[name]
	if !ok {
		f = failure{since: now, rv: h.progress[name]()}
	}
	f.err = err
	h.failing[name] = f
}

// stale returns an error naming every watch failing for longer than
// grace at now, and forgets those that have made progress since. Safe
// for concurrent use.
func (h *health) stale(now time.Time, grace time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var names []string
	for name, f := range h.failing {
		switch {
		case h.progress[name]() != f.rv:
			delete(h.failing, name)
		case now.Sub(f.since) > grace:
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	f := h.failing[names[0]]
	return fmt.Errorf("%v watch failing for %s: %w", names, now.Sub(f.since).Round(time.Second), f.err)
}
