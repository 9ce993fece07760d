package main

import (
	"context"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/procfs"
)

// Process names in figures.
const (
	pControlPlane = "controlplane"
	pAPIServer    = "apiserver"
	pAgents       = "agents"
	pPeer         = "peer"
	pHarness      = "harness"
	pFloorServer  = "floorServer"
	pFloorClients = "floorClients"
)

// meter reads the CPU time of the processes of a run. A pid of 0 is a
// process not running.
type meter struct {
	mu   sync.Mutex // guards pids
	pids map[string]int
}

func newMeter() *meter { return &meter{pids: map[string]int{pHarness: os.Getpid()}} }

func (m *meter) set(name string, pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pids[name] = pid
}

// cpu returns each running process's CPU time so far. With several
// control plane replicas (replicaName), pControlPlane is their sum.
func (m *meter) cpu() map[string]time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]time.Duration{}
	for name, pid := range m.pids {
		if pid == 0 {
			continue
		}
		if d, err := procfs.CPU(pid); err == nil {
			out[name] = d
			if strings.HasPrefix(name, pControlPlane+"-") {
				out[pControlPlane] += d
			}
		}
	}
	return out
}

// since returns the CPU each process used from before to now.
func (m *meter) since(before map[string]time.Duration) map[string]time.Duration {
	now := m.cpu()
	out := map[string]time.Duration{}
	for name, d := range now {
		out[name] = d - before[name]
	}
	return out
}

// heapSampler scrapes the control plane's heap in use at an interval, for
// its peak during a phase. Each scrape costs the control plane CPU (its
// /metrics handler reads the runtime's statistics and lists its open
// files, one per agent), which is counted in the phase: so it scrapes
// every Options.HeapSample, not more often than the peak needs. Peak RSS
// costs it nothing: the kernel keeps it (VmHWM, read from /proc).
type heapSampler struct {
	cancel context.CancelFunc
	done   chan struct{}
	peak   uint64
}

// sampleHeap starts sampling every interval; 0 samples nothing, and the
// peak is then the heap at the phase's end.
func sampleHeap(ctx context.Context, cp *controlPlane, interval time.Duration) *heapSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &heapSampler{cancel: cancel, done: make(chan struct{})}
	if interval <= 0 {
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if h, err := cp.heapInuse(ctx); err == nil {
				s.peak = max(s.peak, h)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends sampling and returns the peak seen.
func (s *heapSampler) stop() uint64 {
	s.cancel()
	<-s.done
	return s.peak
}

// memFigures are a process's memory at the end of a phase.
type memFigures struct {
	// RSS at the end, peak RSS (VmHWM) during the phase, heap in use at
	// the end and its sampled peak.
	RSS, PeakRSS, Heap, PeakHeap uint64
	// Runtime is the Go runtime's account at the end; nil if the scrape
	// failed.
	Runtime *runtimeMem `json:"runtime,omitempty"`
}
