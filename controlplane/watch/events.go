package watch

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// maxEvents bounds the event list, so that a cluster full of broken
// objects costs a bounded amount of memory and a ListEvents answer stays
// small; a thousand is more than anyone reads, and enough to see a pattern.
const maxEvents = 1000

// maxListed is how many of an object's problems its message spells out; a
// slice with a thousand bad endpoints says how many more there are.
const maxListed = 5

// objectRef names an object that has an event.
type objectRef struct{ kind, namespace, name string }

func (r objectRef) compare(o objectRef) int {
	return cmp.Or(cmp.Compare(r.namespace, o.namespace), cmp.Compare(r.name, o.name), cmp.Compare(r.kind, o.kind))
}

// event is one object's current problem.
type event struct {
	service         string // key of the Service whose computation found it
	reason, message string
	count           uint32
	first, last     time.Time
}

// eventLog keeps one event per object that compute found invalid, for
// ListEvents and for logging each distinct problem once.
//
// Only the watcher's goroutine (Run's) calls record and publish; nothing
// but snapshot is safe from other goroutines. Readers get the last
// published snapshot through an atomic pointer: an immutable
// ListEventsResponse replaced whole on each change, so they never lock and
// never see half an update.
type eventLog struct {
	max     int
	events  map[objectRef]*event
	owned   map[string][]objectRef // by Service key: the objects it reported
	dropped uint64
	changed bool // since the last publish

	current atomic.Pointer[pb.ListEventsResponse]
}

func newEventLog(limit int) *eventLog {
	l := &eventLog{max: limit, events: map[objectRef]*event{}, owned: map[string][]objectRef{}}
	l.current.Store(&pb.ListEventsResponse{})
	return l
}

// change is an event that appeared, changed or went away, for the log.
type change struct {
	ref     objectRef
	ev      event // the new state; zero when cleared
	cleared bool
}

// record replaces what the Service under key reported last time with
// problems, found at now, and returns what changed: new or different
// problems, and objects that are fine again. A problem seen again only
// counts, so a resync logs nothing.
func (l *eventLog) record(key string, problems []compute.Problem, now time.Time) []change {
	byObject := map[objectRef][]compute.Problem{}
	var refs []objectRef // in the order compute reported them
	for _, p := range problems {
		r := objectRef{p.Kind, p.Namespace, p.Name}
		if _, ok := byObject[r]; !ok {
			refs = append(refs, r)
		}
		byObject[r] = append(byObject[r], p)
	}

	var changes []change
	for _, r := range l.owned[key] {
		// Another Service may have claimed the object since (a slice
		// relabelled): its event is that Service's to clear.
		if _, still := byObject[r]; !still && l.events[r] != nil && l.events[r].service == key {
			delete(l.events, r)
			changes = append(changes, change{ref: r, cleared: true})
			l.changed = true
		}
	}
	for _, r := range refs {
		ps := byObject[r]
		reason, message := ps[0].Reason, summarize(ps)
		ev := l.events[r]
		if ev != nil && ev.reason == reason && ev.message == message {
			ev.count++
			ev.last, ev.service = now, key
		} else {
			ev = &event{service: key, reason: reason, message: message, count: 1, first: now, last: now}
			l.events[r] = ev
			changes = append(changes, change{ref: r, ev: *ev})
		}
		l.changed = true
	}
	if len(refs) == 0 {
		delete(l.owned, key)
	} else {
		l.owned[key] = refs
	}
	for len(l.events) > l.max {
		l.dropOldest()
	}
	return changes
}

// dropOldest drops the event seen least recently: the one most likely
// about an object nobody is changing, and the first to go stale. Its
// object, if still invalid, comes back (and is logged again) the next time
// its Service is recomputed.
func (l *eventLog) dropOldest() {
	var oldest objectRef
	var ev *event
	for r, e := range l.events {
		if ev == nil || e.last.Before(ev.last) || (e.last.Equal(ev.last) && r.compare(oldest) < 0) {
			oldest, ev = r, e
		}
	}
	delete(l.events, oldest)
	l.dropped++
	metrics.EventsDroppedTotal.Inc()
}

// summarize words an object's problems as one message.
func summarize(ps []compute.Problem) string {
	if len(ps) == 1 {
		return ps[0].Message
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problems: ", len(ps))
	for i, p := range ps[:min(len(ps), maxListed)] {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.Message)
	}
	if len(ps) > maxListed {
		fmt.Fprintf(&b, "; and %d more", len(ps)-maxListed)
	}
	return b.String()
}

// publish makes the recorded events visible to snapshot, if they changed.
func (l *eventLog) publish() {
	metrics.InvalidObjects.Set(float64(len(l.events)))
	if !l.changed {
		return
	}
	l.changed = false
	out := &pb.ListEventsResponse{Events: make([]*pb.Event, 0, len(l.events)), Dropped: l.dropped}
	refs := make([]objectRef, 0, len(l.events))
	for r := range l.events {
		refs = append(refs, r)
	}
	slices.SortFunc(refs, objectRef.compare)
	for _, r := range refs {
		e := l.events[r]
		out.Events = append(out.Events, &pb.Event{
			// Protobuf strings must be UTF-8; API objects always are, but
			// compute reports a Service whose name is not (it is invalid).
			Kind: r.kind, Namespace: strings.ToValidUTF8(r.namespace, "\uFFFD"), Name: strings.ToValidUTF8(r.name, "\uFFFD"),
			Service: strings.ToValidUTF8(e.service, "\uFFFD"),
			Reason:  e.reason, Message: strings.ToValidUTF8(e.message, "\uFFFD"),
			Count:     e.count,
			FirstSeen: timestamppb.New(e.first), LastSeen: timestamppb.New(e.last),
		})
	}
	l.current.Store(out)
}

// snapshot returns the last published events. Safe from any goroutine; the
// result is shared and must not be modified.
func (l *eventLog) snapshot() *pb.ListEventsResponse { return l.current.Load() }
