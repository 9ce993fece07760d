package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"time"
)

// probeTimeout bounds one probe: dial, request line and answer.
const probeTimeout = time.Second

// ProbeStats are one target's counts, as GET /probes reports them.
type ProbeStats struct {
	OK     int64 `json:"ok"`
	Failed int64 `json:"failed"`
	// LastError is the last failure's error and when it happened.
	LastError string    `json:"lastError,omitempty"`
	LastFail  time.Time `json:"lastFailure,omitzero"`
}

// prober opens a new TCP connection to each target every interval,
// sends a line and reads the answer: a steady probe of a Service from
// inside a pod, that tests read while they roll or drain what carries it.
// One goroutine per target writes its stats; mu guards them for readers.
type prober struct {
	mu    sync.Mutex
	stats map[string]*ProbeStats
}

func newProber(targets []string) *prober {
	p := &prober{stats: map[string]*ProbeStats{}}
	for _, t := range targets {
		p.stats[t] = &ProbeStats{}
	}
	return p
}

// run probes every target each interval until ctx ends.
func (p *prober) run(ctx context.Context, interval time.Duration) {
	var wg sync.WaitGroup
	for target := range p.stats {
		wg.Go(func() {
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				err := probe(ctx, target)
				if ctx.Err() != nil {
					return // a probe cut short by the pod's end is no failure
				}
				p.record(target, err)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	wg.Wait()
}

func (p *prober) record(target string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats[target]
	if err == nil {
		s.OK++
		return
	}
	s.Failed++
	s.LastError, s.LastFail = err.Error(), time.Now()
}

// ServeHTTP answers GET /probes with every target's stats as JSON.
func (p *prober) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	out := make(map[string]ProbeStats, len(p.stats))
	for t, s := range p.stats {
		out[t] = *s
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// probe makes one request to target.
func probe(ctx context.Context, target string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	deadline, _ := ctx.Deadline()
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := c.Write([]byte("probe\n")); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}
