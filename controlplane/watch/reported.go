package watch

import (
	"context"
	"net/netip"
	"slices"
	"time"
)

// reportWait bounds how long a hello waits for the publish that guards
// the addresses it reported: past it the stream goes on, and the worst
// that follows is a NACK of its first table until that publish lands.
const reportWait = 30 * time.Second

// ReportNodeAddresses records addrs as node's own addresses, as its
// agent's hello reported them (server.Options.NodeAddresses): the guard
// treats them as it treats the addresses the Node object lists, while
// that Node exists. They replace what node reported before, and are kept
// when its agent disconnects, so that tables do not change with the
// agent's connection. It returns once a publish built the Services
// against a guard holding them (at once when they are what node reported
// last), or after reportWait, or with ctx's error. It is safe for
// concurrent use.
func (w *Watcher) ReportNodeAddresses(ctx context.Context, node string, addrs []netip.Addr) error {
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	w.mu.Lock()
	old, had := w.reported[node]
	if had == (len(addrs) > 0) && slices.Equal(old, addrs) && !w.dirtyReported {
		w.mu.Unlock()
		return nil
	}
	if !slices.Equal(old, addrs) {
		if len(addrs) == 0 {
			delete(w.reported, node)
		} else {
			w.reported[node] = addrs
		}
		w.dirtyReported = true
	}
	if !w.dirtyReported {
		w.mu.Unlock()
		return nil
	}
	if w.reportedApplied == nil {
		w.reportedApplied = make(chan struct{})
	}
	applied := w.reportedApplied
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	t := time.NewTimer(reportWait)
	defer t.Stop()
	select {
	case <-applied:
		return nil
	case <-t.C:
		w.log.Warn("node addresses not yet guarded, going on", "node", node, "after", reportWait)
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// forgetReported drops what node's agent reported, its Node being gone.
// Run's goroutine calls it.
func (w *Watcher) forgetReported(node string) {
	delete(w.agentAddrs, node)
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.reported[node]; ok {
		delete(w.reported, node)
		w.dirtyReported = true
	}
}
