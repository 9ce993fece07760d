package agent

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

var dualStack = []dataplane.Family{dataplane.IPv4, dataplane.IPv6}

// TestHealth walks one tracker through kube-proxy's health semantics,
// with the time given (a fake clock): the timeout is kube-proxy's twice
// the sync period, here a minute.
func TestHealth(t *testing.T) {
	start := time.Unix(1000, 0)
	h := NewHealth(time.Minute, 10*time.Minute, dualStack, start)
	h.ControlPlane(true, start)
	steps := []struct {
		name                     string
		do                       func()
		at                       time.Duration
		live, healthy, el, ready bool
	}{
		// Upstream is healthy at start until an update it received goes
		// unapplied; an agent with no table yet does not know its node
		// (kube-proxy's nodeEligible is false without a Node).
		{"hours after start, no table yet", func() {}, 3 * time.Hour, true, false, false, false},
		{"a table arrives", func() { h.Queued(start.Add(3 * time.Hour)) }, 3*time.Hour + 59*time.Second, true, false, false, false},
		{"and waits past the timeout", func() {}, 3*time.Hour + time.Minute, false, false, false, false},
		{"it is programmed", func() { h.Updated(start.Add(3*time.Hour+70*time.Second), false) }, 3*time.Hour + 2*time.Minute, true, true, true, true},
		{"no control plane past the opt-in timeout: not healthy, still live and ready", func() { h.ControlPlane(false, start.Add(3*time.Hour)) }, 3*time.Hour + 10*time.Minute, true, false, true, true},
		{"a control plane answers", func() { h.ControlPlane(true, start.Add(4*time.Hour)) }, 4 * time.Hour, true, true, true, true},
		{"it goes away", func() { h.ControlPlane(false, start.Add(5*time.Hour)) }, 5*time.Hour + 9*time.Minute, true, true, true, true},
		{"and stays away past the timeout", func() { h.ControlPlane(false, start.Add(5*time.Hour+5*time.Minute)) }, 5*time.Hour + 10*time.Minute, true, false, true, true},
		{"back, and the node is being deleted", func() {
			h.ControlPlane(true, start.Add(6*time.Hour))
			h.Updated(start.Add(6*time.Hour), true)
		}, 6 * time.Hour, true, false, false, true},
		{"the oldest pending change counts", func() {
			h.Updated(start.Add(7*time.Hour), false)
			h.Queued(start.Add(7*time.Hour + time.Minute))
			h.Queued(start.Add(7*time.Hour + 2*time.Minute))
		}, 7*time.Hour + 2*time.Minute, false, false, true, false},
	}
	for _, s := range steps {
		s.do()
		st := h.Check(start.Add(s.at))
		if st.Live != s.live || st.Healthy != s.healthy || st.NodeEligible != s.el || st.Ready != s.ready {
			t.Errorf("%s: %+v, want live %v, healthy %v, eligible %v, ready %v", s.name, st, s.live, s.healthy, s.el, s.ready)
		}
	}
	if last := h.Check(start).LastUpdated; !last.Equal(start.Add(7 * time.Hour)) {
		t.Errorf("LastUpdated %v, want the last sync", last)
	}
}

// TestHealthWithoutControlPlaneTimeout: with the timeout 0 (the shipped
// default) no length of control plane absence fails /healthz, as no API
// server absence fails kube-proxy's.
func TestHealthWithoutControlPlaneTimeout(t *testing.T) {
	start := time.Unix(1000, 0)
	h := NewHealth(time.Minute, 0, dualStack, start)
	h.ControlPlane(true, start)
	h.Updated(start, false)
	h.ControlPlane(false, start.Add(time.Minute))
	for _, after := range []time.Duration{time.Hour, 24 * time.Hour, 30 * 24 * time.Hour} {
		if st := h.Check(start.Add(after)); !st.Healthy || st.ControlPlaneTimedOut || st.ControlPlaneLost != start.Add(time.Minute) {
			t.Errorf("%s without a control plane: %+v, want healthy, lost since %v", after, st, start.Add(time.Minute))
		}
	}
}

// TestHealthPerFamily: as kube-proxy's per-family proxiers, a family that
// programmed its change is healthy while the other, still waiting past
// the timeout, is not, and makes the whole unhealthy.
func TestHealthPerFamily(t *testing.T) {
	start := time.Unix(1000, 0)
	h := NewHealth(time.Minute, 0, dualStack, start)
	h.Updated(start, false)
	h.Queued(start.Add(time.Second))
	h.Synced(dataplane.IPv4, start.Add(2*time.Second))
	st := h.Check(start.Add(2 * time.Minute))
	want := map[dataplane.Family]FamilyHealth{
		dataplane.IPv4: {LastUpdated: start.Add(2 * time.Second), Healthy: true},
		dataplane.IPv6: {LastUpdated: start, Healthy: false},
	}
	for f, w := range want {
		if got := st.Families[f]; got != w {
			t.Errorf("%s: %+v, want %+v", f, got, w)
		}
	}
	if st.Live || st.Healthy || st.Ready || !st.LastUpdated.Equal(start.Add(2*time.Second)) {
		t.Errorf("%+v: want neither live, healthy nor ready, last updated by IPv4", st)
	}
	h.Synced(dataplane.IPv6, start.Add(3*time.Minute))
	if st := h.Check(start.Add(3 * time.Minute)); !st.Live || !st.Healthy {
		t.Errorf("after IPv6 synced: %+v, want healthy", st)
	}
}

// TestAgentWaitingForItsFirstTableStaysLive runs an agent without a
// cache and without any table for longer than its timeout: it must stay
// live (a liveness probe would otherwise kill it while the control plane
// starts) and not ready. A cached table, by contrast, is a change to
// program: a kernel refusing it fails /livez after the timeout.
func TestAgentWaitingForItsFirstTableStaysLive(t *testing.T) {
	r := newRecorder()
	cfg := Config{SyncPeriod: time.Hour, RetryMin: time.Hour, RetryMax: time.Hour, Families: dualStack}
	a := New(cfg, r, r, nil, slog.New(slog.DiscardHandler))
	run(t, a)
	<-a.Started()
	// Past the timeout (twice the sync period) on the tracker's clock:
	// Check takes the time.
	later := 3 * time.Hour
	if st := a.Health().Check(time.Now().Add(later)); !st.Live || st.Ready || st.NodeEligible {
		t.Errorf("hours without a table: %+v, want live, neither ready nor eligible", st)
	}

	cached, err := proxytable.FromSnapshot(snapshot(entry("a", 1, 80)).GetSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	refusing := newRecorder()
	refusing.failSyncs(errors.New("refused"))
	b := New(cfg, refusing, refusing, cached, slog.New(slog.DiscardHandler))
	run(t, b)
	<-b.Started()
	if st := b.Health().Check(time.Now().Add(later)); st.Live {
		t.Errorf("a cached table refused for hours: %+v, want not live", st)
	}
	refusing.failSyncs(nil)
	if _, err := b.Apply(context.Background(), snapshot(entry("b", 2, 80)), false); err != nil {
		t.Fatal(err)
	}
	if st := b.Health().Check(time.Now()); !st.Live || !st.Ready || !st.Healthy {
		t.Errorf("after a table was programmed: %+v, want live, ready and healthy", st)
	}
}

// TestUnregisteredNodeIsNotEligible: as kube-proxy, whose nodeEligible is
// false without its Node, a table for a node no Node object names
// (NodeInfo.unregistered) leaves /healthz's node ineligible, and the
// Node's registration makes it eligible.
func TestUnregisteredNodeIsNotEligible(t *testing.T) {
	r := newRecorder()
	a := newAgent(r, nil)
	run(t, a)
	for i, tc := range []struct {
		unregistered, eligible bool
	}{{true, false}, {false, true}} {
		n := &pb.NodeInfo{Name: "node-1", Hash: uint64(200 + i), Unregistered: tc.unregistered}
		resp := &pb.SyncResponse{Nonce: "n", Kind: &pb.SyncResponse_Snapshot{Snapshot: &pb.Snapshot{Version: version(n), Node: n}}}
		if _, err := a.Apply(context.Background(), resp, false); err != nil {
			t.Fatal(err)
		}
		if st := a.Health().Check(time.Now()); st.NodeEligible != tc.eligible || !st.Live {
			t.Errorf("unregistered=%v: %+v, want live and eligible=%v", tc.unregistered, st, tc.eligible)
		}
	}
}
