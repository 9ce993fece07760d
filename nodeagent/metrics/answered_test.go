package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestControlPlaneLastAnswered follows the gauge through a start, a
// stream, an outage and a reconnection, on a fake clock: it is the
// scrape's time while a stream is open and stands still at the moment
// the stream ended, so that time() minus it grows with the outage.
func TestControlPlaneLastAnswered(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	now := start
	a := &answered{now: func() time.Time { return now }}
	steps := []struct {
		name    string
		do      func()
		at      time.Duration
		seconds time.Duration // after start; -1 for 0
	}{
		{"never observed", func() {}, time.Minute, -1},
		{"started without a stream", func() { a.observe(false, start) }, time.Minute, 0},
		{"stream open: the scrape's time", func() { a.observe(true, start.Add(2*time.Minute)) }, 3 * time.Minute, 3 * time.Minute},
		{"still open later", func() {}, time.Hour, time.Hour},
		{"it ends", func() { a.observe(false, start.Add(2*time.Hour)) }, 5 * time.Hour, 2 * time.Hour},
		{"a failed reconnect does not move it", func() { a.observe(false, start.Add(3*time.Hour)) }, 6 * time.Hour, 2 * time.Hour},
		{"a stream again", func() { a.observe(true, start.Add(7*time.Hour)) }, 7 * time.Hour, 7 * time.Hour},
	}
	for _, s := range steps {
		s.do()
		now = start.Add(s.at)
		want := float64(start.Add(s.seconds).Unix())
		if s.seconds < 0 {
			want = 0
		}
		if got := a.seconds(); got != want {
			t.Errorf("%s: %v, want %v", s.name, got, want)
		}
	}
}

// TestObserveConnected checks that the agent's hook moves both gauges.
func TestObserveConnected(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	ObserveConnected(true, at)
	if testutil.ToFloat64(Connected) != 1 {
		t.Error("proxyplane_agent_connected is not 1 with a stream open")
	}
	ObserveConnected(false, at)
	if testutil.ToFloat64(Connected) != 0 {
		t.Error("proxyplane_agent_connected is not 0 without a stream")
	}
	if got := testutil.ToFloat64(ControlPlaneLastAnsweredTimestamp); got != float64(at.Unix()) {
		t.Errorf("proxyplane_agent_control_plane_last_answered_timestamp_seconds %v, want %v, when the stream ended", got, at.Unix())
	}
}
