package watch

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWatchHealth(t *testing.T) {
	rv := map[string]string{"services": "10", "nodes": "7"}
	h := newHealth()
	for name := range rv {
		h.track(name, func() string { return rv[name] })
	}
	start := time.Unix(1000, 0)
	const grace = 45 * time.Second
	if err := h.stale(start, grace); err != nil {
		t.Fatalf("stale with no failure: %v", err)
	}
	h.failed("services", errors.New("connection refused"), start)
	h.failed("services", errors.New("connection refused again"), start.Add(10*time.Second))
	if err := h.stale(start.Add(44*time.Second), grace); err != nil {
		t.Errorf("stale within the grace: %v", err)
	}
	err := h.stale(start.Add(46*time.Second), grace)
	if err == nil || !strings.Contains(err.Error(), "services") || !strings.Contains(err.Error(), "again") || !strings.Contains(err.Error(), "46s") {
		t.Errorf("stale past the grace = %v, want the watch, its last error and how long since the first", err)
	}
	rv["services"] = "11" // a relist or an event: progress
	if err := h.stale(start.Add(47*time.Second), grace); err != nil {
		t.Errorf("stale after progress: %v", err)
	}
	// A new failure starts a new count.
	h.failed("services", errors.New("gone"), start.Add(50*time.Second))
	if err := h.stale(start.Add(90*time.Second), grace); err != nil {
		t.Errorf("stale 40 s into a new failure: %v", err)
	}
}

func TestStuck(t *testing.T) {
	w := &Watcher{}
	now := time.Unix(1000, 0)
	if err := w.Stuck(now, time.Minute); err != nil {
		t.Errorf("Stuck before Run started: %v", err)
	}
	w.beat.Store(now.UnixNano())
	if err := w.Stuck(now.Add(59*time.Second), time.Minute); err != nil {
		t.Errorf("Stuck within the limit: %v", err)
	}
	if err := w.Stuck(now.Add(61*time.Second), time.Minute); err == nil {
		t.Error("not Stuck past the limit")
	}
}
