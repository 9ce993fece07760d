package agentsim

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// tracker records, per change and agent, when the agent received and
// ACKed a response containing the change. A change is identified by its
// trigger time: the harness stamps every slice it changes with the time of
// the change, after the agents' process started (after); anything older
// is the world as created and is not tracked.
type tracker struct {
	after  int64
	agents int
	limit  int

	mu      sync.RWMutex // guards changes
	changes map[int64]*change
	dropped atomic.Uint64
}

// change is one tracked change. Its per-agent times are written with
// atomics (first write wins), so agents never wait on each other.
type change struct {
	key     string
	trigger int64
	reach   []atomic.Int64
	ack     []atomic.Int64
}

func newTracker(after int64, agents, limit int) *tracker {
	return &tracker{after: after, agents: agents, limit: limit, changes: map[int64]*change{}}
}

// seen is an entry of a response with a tracked trigger time.
type seen struct {
	key     string
	trigger int64
}

// get returns the change, creating it; nil past the bound.
func (t *tracker) get(s seen) *change {
	t.mu.RLock()
	c := t.changes[s.trigger]
	t.mu.RUnlock()
	if c != nil {
		return c
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c = t.changes[s.trigger]; c != nil {
		return c
	}
	if len(t.changes) >= t.limit {
		t.dropped.Add(1)
		return nil
	}
	c = &change{key: s.key, trigger: s.trigger, reach: make([]atomic.Int64, t.agents), ack: make([]atomic.Int64, t.agents)}
	t.changes[s.trigger] = c
	return c
}

func (t *tracker) reached(agent int, ss []seen, at int64) {
	for _, s := range ss {
		if c := t.get(s); c != nil {
			c.reach[agent].CompareAndSwap(0, at)
		}
	}
}

func (t *tracker) acked(agent int, ss []seen, at int64) {
	for _, s := range ss {
		if c := t.get(s); c != nil {
			c.ack[agent].CompareAndSwap(0, at)
		}
	}
}

// report summarises the changes with trigger times at or after since.
// An agent that received a later change of the same Service before the
// earlier one reached it has the earlier one too (the control plane
// coalesces): its times for a change are the earliest among that change
// and the later ones of its Service.
func (t *tracker) report(since int64, bitmaps bool) []contract.ChangeReport {
	t.mu.RLock()
	all := make([]*change, 0, len(t.changes))
	for _, c := range t.changes {
		all = append(all, c)
	}
	t.mu.RUnlock()
	byKey := map[string][]*change{}
	for _, c := range all {
		byKey[c.key] = append(byKey[c.key], c)
	}
	var out []contract.ChangeReport
	for _, cs := range byKey {
		// Newest first, carrying the running earliest time per agent.
		slices.SortFunc(cs, func(a, b *change) int { return cmp.Compare(b.trigger, a.trigger) })
		reach := make([]int64, t.agents)
		ack := make([]int64, t.agents)
		for _, c := range cs {
			for i := range t.agents {
				reach[i] = earliest(reach[i], c.reach[i].Load())
				ack[i] = earliest(ack[i], c.ack[i].Load())
			}
			if c.trigger < since {
				continue
			}
			r := contract.ChangeReport{Trigger: c.trigger, Key: c.key}
			if bitmaps {
				r.AckedBy = make([]byte, (t.agents+7)/8)
			}
			for i := range t.agents {
				if reach[i] != 0 {
					r.Reached++
					r.LastReach = max(r.LastReach, reach[i])
				}
				if ack[i] != 0 {
					r.Acked++
					r.LastAck = max(r.LastAck, ack[i])
					if bitmaps {
						r.AckedBy[i/8] |= 1 << (i % 8)
					}
				}
			}
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b contract.ChangeReport) int { return cmp.Compare(a.Trigger, b.Trigger) })
	return out
}

// earliest returns the earlier of two times, 0 meaning none.
func earliest(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	default:
		return min(a, b)
	}
}
