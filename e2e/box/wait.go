package box

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxyplane/proxyplane/internal/nstest"
)

// Bounds on waiting; every wait in the box polls a condition and gives
// up at a deadline, never sleeps for a guessed time.
const (
	// DefaultTimeout bounds a wait whose context has no deadline. Every
	// condition the box waits for takes seconds at most on an idle
	// machine; a loaded 2-core CI machine may be several times slower.
	DefaultTimeout = 2 * time.Minute
	// pollInterval is short against what is awaited (a table reaching a
	// node takes tens of milliseconds) and long against one check (a
	// local RPC or scrape).
	pollInterval = 25 * time.Millisecond
)

// Eventually calls f until it returns nil and returns nil then. It gives
// up when ctx ends, or after DefaultTimeout if ctx has no deadline,
// returning f's last error; an error wrapped by Permanent ends it at once.
func Eventually(ctx context.Context, f func() error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		if isPermanent(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up (%w): %w", context.Cause(ctx), err)
		case <-tick.C:
		}
	}
}

// Probe dials one address over and over from one namespace, as a client
// that must not notice an outage would, and counts what failed.
type Probe struct {
	dials  atomic.Int64
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex // guards result
	result ProbeResult
}

// ProbeResult is what a Probe saw.
type ProbeResult struct {
	// Dials and Failures count connections tried and failed.
	Dials, Failures int
	// Errors holds the first few failures.
	Errors []error
	// Backends counts answers by backend name.
	Backends map[string]int
	// Duration is from the first dial to the end of the last.
	Duration time.Duration
}

// maxProbeErrors bounds ProbeResult.Errors.
const maxProbeErrors = 5

// StartProbe starts dialing addr over TCP from namespace ns every
// interval, each dial a new connection (a new conntrack flow, so every
// dial goes through the rules in force) bounded by timeout, until Stop or
// until maxDials dials have been made.
func (b *Box) StartProbe(ns, addr string, interval, timeout time.Duration, maxDials int) *Probe {
	p := &Probe{stop: make(chan struct{}), done: make(chan struct{})}
	p.result.Backends = map[string]int{}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		start := time.Now()
		for range maxDials {
			r, err := b.tp.DialTCP(ns, addr, timeout)
			p.mu.Lock()
			p.result.Dials++
			if err != nil {
				p.result.Failures++
				if len(p.result.Errors) < maxProbeErrors {
					p.result.Errors = append(p.result.Errors, fmt.Errorf("%s: %w", time.Now().Format("15:04:05.000"), err))
				}
			} else {
				p.result.Backends[r.Backend]++
			}
			p.result.Duration = time.Since(start)
			p.mu.Unlock()
			p.dials.Add(1)
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// Dials returns how many dials have completed so far.
func (p *Probe) Dials() int { return int(p.dials.Load()) }

// WaitDials waits until n more dials than now have completed, so a test
// can hold a state (an outage, say) for a number of probe dials rather
// than for a guessed time.
func (p *Probe) WaitDials(ctx context.Context, n int) error {
	want := p.Dials() + n
	return Eventually(ctx, func() error {
		select {
		case <-p.done:
			return Permanent(errors.New("probe stopped: it reached its dial limit"))
		default:
		}
		if got := p.Dials(); got < want {
			return fmt.Errorf("probe made %d dials, waiting for %d", got, want)
		}
		return nil
	})
}

// Stop stops the probe, waits for its last dial and returns what it saw.
func (p *Probe) Stop() ProbeResult {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.result
}

// PollDialTimeout bounds each dial of DialUntil. A working dial takes
// about a millisecond; one whose SYN left before the rules existed is
// never answered (nothing on the LAN answers a ClusterIP) and would hold
// a measurement's resolution to its timeout.
const PollDialTimeout = 100 * time.Millisecond

// DialUntil dials addr over TCP from ns, each dial a new connection
// bounded by PollDialTimeout, until one is answered by backend want (by
// any when want is empty), and returns when that answer came. It gives up
// when ctx ends (see Eventually).
func (b *Box) DialUntil(ctx context.Context, ns, addr, want string) (time.Time, error) {
	var at time.Time
	err := Eventually(ctx, func() error {
		r, err := b.tp.DialTCP(ns, addr, PollDialTimeout)
		if err != nil {
			return err
		}
		if want != "" && r.Backend != want {
			return fmt.Errorf("answered by %s, want %s", r.Backend, want)
		}
		at = time.Now()
		return nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("traffic from %s to %s: %w", b.label(ns), addr, err)
	}
	return at, nil
}

// WaitTraffic waits until a TCP dial from ns to addr is answered, by
// backend want when it is not empty. It is DialUntil without the time.
func (b *Box) WaitTraffic(ctx context.Context, ns, addr, want string) error {
	_, err := b.DialUntil(ctx, ns, addr, want)
	return err
}

// label names a namespace for messages: "pod-3", "node-1", "client".
func (b *Box) label(ns string) string {
	for k := range b.tp.Nodes() {
		if b.tp.Node(k).NS() == ns {
			return b.tp.Node(k).Name()
		}
	}
	for i := range b.tp.Pods() {
		if b.tp.PodNS(i) == ns {
			return fmt.Sprintf("pod-%d", i)
		}
	}
	if ns == b.tp.ClientNS() {
		return "client"
	}
	return ns
}

// Topology returns the box's namespaces.
func (b *Box) Topology() *nstest.Topology { return b.tp }
