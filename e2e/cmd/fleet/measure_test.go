package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestSampleHeap checks what the heap sampler costs the control plane:
// nothing between phase ends with no interval, and otherwise scrapes
// that ask for no compression (the control plane would spend its CPU,
// counted in the phase, compressing a loopback read).
func TestSampleHeap(t *testing.T) {
	var mu sync.Mutex
	var scrapes int
	var encodings []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		scrapes++
		encodings = append(encodings, r.Header.Get("Accept-Encoding"))
		n := scrapes
		mu.Unlock()
		_, _ = fmt.Fprintf(w, "# TYPE go_memstats_heap_inuse_bytes gauge\ngo_memstats_heap_inuse_bytes %d\n", n<<20)
	}))
	defer srv.Close()
	cp := &controlPlane{metricsURL: srv.URL}
	count := func() int { mu.Lock(); defer mu.Unlock(); return scrapes }

	if peak := sampleHeap(context.Background(), cp, 0).stop(); peak != 0 || count() != 0 {
		t.Errorf("no interval: %d scrapes, peak %d; want none", count(), peak)
	}

	s := sampleHeap(context.Background(), cp, time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); count() < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // polling a condition, bounded
	}
	peak := s.stop()
	n := count()
	if n < 3 || peak < 2<<20 {
		t.Fatalf("sampling every 1ms: %d scrapes, peak %d", n, peak)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range encodings {
		if e != "identity" {
			t.Errorf("scrape asked for Accept-Encoding %q, want identity", e)
		}
	}
}
