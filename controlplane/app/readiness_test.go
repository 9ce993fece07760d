package app

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// fakeWatches answers as told.
type fakeWatches struct {
	mu           sync.Mutex
	stale, stuck error
}

func (f *fakeWatches) Stale(time.Time, time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stale
}

func (f *fakeWatches) Stuck(time.Time, time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stuck
}

func (f *fakeWatches) set(stale, stuck error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stale, f.stuck = stale, stuck
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func TestReadyzAndHealthz(t *testing.T) {
	w := &fakeWatches{}
	mux := http.NewServeMux()
	healthHandlers(mux, Readiness{Synced: closed(), Certified: closed(), Watches: w}, w)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	code := func(path string) int {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name           string
		stale, stuck   error
		readyz, health int
	}{
		{"well", nil, nil, 200, 200},
		{"a watch failing past the grace: not ready, still live", errors.New("[services] watch failing"), nil, 503, 200},
		{"the publish loop stuck: not live", nil, errors.New("stuck"), 200, 503},
	} {
		w.set(tc.stale, tc.stuck)
		if got := code("/readyz"); got != tc.readyz {
			t.Errorf("%s: /readyz %d, want %d", tc.name, got, tc.readyz)
		}
		if got := code("/healthz"); got != tc.health {
			t.Errorf("%s: /healthz %d, want %d", tc.name, got, tc.health)
		}
	}
	notSynced := Readiness{Synced: make(chan struct{}), Certified: closed()}
	if err := notSynced.Check(time.Now()); err == nil {
		t.Error("ready before the informers synced")
	}
	podsNotListed := Readiness{Synced: closed(), Certified: closed(), AgentPods: make(chan struct{})}
	if err := podsNotListed.Check(time.Now()); err == nil {
		t.Error("ready before the agent Pods were listed")
	}
	podsListed := Readiness{Synced: closed(), Certified: closed(), AgentPods: closed()}
	if err := podsListed.Check(time.Now()); err != nil {
		t.Errorf("not ready with the agent Pods listed: %v", err)
	}
}

// TestHealthServiceFollowsReadiness checks that the gRPC health service,
// which agents consult before failing back, stops serving while a watch
// is stale and serves again once it recovers.
func TestHealthServiceFollowsReadiness(t *testing.T) {
	w := &fakeWatches{}
	hs := health.NewServer()
	done := make(chan struct{})
	defer close(done)
	go followReadiness(hs, Readiness{Synced: closed(), Certified: closed(), Watches: w}, done, slog.New(slog.DiscardHandler))
	wait := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{})
			if err == nil && resp.GetStatus() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("health status %v (%v), want %v", resp.GetStatus(), err, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait(healthpb.HealthCheckResponse_SERVING)
	w.set(errors.New("[endpointslices] watch failing"), nil)
	wait(healthpb.HealthCheckResponse_NOT_SERVING)
	w.set(nil, nil)
	wait(healthpb.HealthCheckResponse_SERVING)
}
