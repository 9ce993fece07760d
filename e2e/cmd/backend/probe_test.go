package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// TestProberCounts probes a server that answers and a port where nothing
// listens, and reads the counts from /probes.
func TestProberCounts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { serveTCP(ln, "pod-a", time.Second, &wg) })
	defer func() { _ = ln.Close(); wg.Wait() }()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	_ = closed.Close()

	p := newProber([]string{ln.Addr().String(), refused})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx, 10*time.Millisecond) }()
	srv := httptest.NewServer(handler("pod-a", p))
	defer srv.Close()

	var stats map[string]ProbeStats
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := srv.Client().Get(srv.URL + "/probes")
		if err != nil {
			t.Fatal(err)
		}
		stats = nil
		err = json.NewDecoder(resp.Body).Decode(&stats)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if stats[ln.Addr().String()].OK >= 3 && stats[refused].Failed >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %+v", stats)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if s := stats[ln.Addr().String()]; s.Failed != 0 {
		t.Errorf("the answering server failed %d probes: %s", s.Failed, s.LastError)
	}
	if s := stats[refused]; s.OK != 0 || s.LastError == "" {
		t.Errorf("the refusing port: %+v, want only failures with an error", s)
	}
}
