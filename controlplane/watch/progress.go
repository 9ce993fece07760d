package watch

import (
	"strconv"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// progress tracks how far the world has followed the cluster: a
// resourceVersion through which every change to the watched objects is in
// the published world. Replicas of one cluster compare worlds by it
// (resourceVersions are etcd revisions, ordered across every resource),
// so a replica behind the table an agent holds does not roll it back.
//
// Each informer contributes a lower bound, and the world's is the lowest
// of them:
//   - events: the highest resourceVersion its handler was given, as of
//     the last publish's swap of the dirty sets (handlers are called in
//     order, and a handler marks its key dirty before its resourceVersion
//     counts, so the swap after it takes the key);
//   - the reflector's position (LastSyncResourceVersion), which also moves
//     on the initial list and on bookmarks, without events: an idle
//     informer advances only this way. The reflector queues an event
//     before it moves, and the handler gets it microseconds later, so a
//     position counts only once a heartbeat has passed since it was read.
//
// Unparsable resourceVersions count as 0: the bound then stays 0, and 0
// disables the comparison (see server.Sync).
type progress struct {
	lastSync []func() string // each informer's reflector position
	handled  []*atomic.Uint64

	// Run's goroutine's.
	published      []uint64 // handled, as of the last swap
	older, current []uint64 // positions read one and zero samples ago
}

// add tracks one informer, given its reflector position, and returns its
// index for handle. Not safe for concurrent use: call before the
// informers start.
func (p *progress) add(lastSync func() string) int {
	p.lastSync = append(p.lastSync, lastSync)
	p.handled = append(p.handled, new(atomic.Uint64))
	p.published = append(p.published, 0)
	p.older = append(p.older, 0)
	p.current = append(p.current, 0)
	return len(p.handled) - 1
}

// handle records that informer i's handler was given obj. Handlers call
// it after marking obj's key dirty.
func (p *progress) handle(i int, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj // its last known state: older, so still a lower bound
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	rv := parseRV(m.GetResourceVersion())
	for h := p.handled[i]; ; {
		old := h.Load()
		if rv <= old || h.CompareAndSwap(old, rv) {
			return
		}
	}
}

// swapped records the handlers' positions; the caller holds the lock that
// guards the dirty sets, and has just taken them.
func (p *progress) swapped() {
	for i, h := range p.handled {
		p.published[i] = h.Load()
	}
}

// sample reads the reflectors' positions; the previous sample becomes
// usable. Call it once a heartbeat.
func (p *progress) sample() {
	p.older, p.current = p.current, p.older
	for i, f := range p.lastSync {
		p.current[i] = parseRV(f())
	}
}

// bound returns the resourceVersion through which the world published
// after the last swap reflects every change; 0 when unknown.
func (p *progress) bound() uint64 {
	var low uint64
	for i := range p.published {
		b := max(p.published[i], p.older[i])
		if i == 0 || b < low {
			low = b
		}
	}
	return low
}

func parseRV(s string) uint64 {
	rv, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0
	}
	return rv
}
