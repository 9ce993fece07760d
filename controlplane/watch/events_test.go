package watch

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func svcProblem(name, msg string) compute.Problem {
	return compute.Problem{Kind: compute.KindService, Namespace: "default", Name: name, Reason: compute.ReasonInvalidService, Message: msg}
}

func sliceProblem(name, msg string) compute.Problem {
	return compute.Problem{Kind: compute.KindEndpointSlice, Namespace: "default", Name: name, Reason: compute.ReasonInvalidEndpoint, Message: msg}
}

// at is a time n seconds into the test.
func at(n int) time.Time { return time.Unix(1_700_000_000+int64(n), 0) }

// published records problems for key at time n and publishes them.
func published(l *eventLog, key string, n int, problems ...compute.Problem) []change {
	c := l.record(key, problems, at(n))
	l.publish()
	return c
}

func only(t *testing.T, l *eventLog) *pb.Event {
	t.Helper()
	ev := l.snapshot().GetEvents()
	if len(ev) != 1 {
		t.Fatalf("events = %v, want one", ev)
	}
	return ev[0]
}

func TestEventLogCountsRepeatsAndLogsChanges(t *testing.T) {
	l := newEventLog(maxEvents)
	if c := published(l, "default/web", 0, svcProblem("web", "port 0")); len(c) != 1 || c[0].cleared {
		t.Fatalf("first sighting: changes %+v, want one new event", c)
	}
	// Seen again, as on a resync: counted, nothing to log.
	if c := published(l, "default/web", 10, svcProblem("web", "port 0")); len(c) != 0 {
		t.Errorf("second sighting: changes %+v, want none", c)
	}
	e := only(t, l)
	if e.GetCount() != 2 || !e.GetFirstSeen().AsTime().Equal(at(0)) || !e.GetLastSeen().AsTime().Equal(at(10)) {
		t.Errorf("event after two sightings = %v; want count 2, first at 0 s, last at 10 s", e)
	}
	if e.GetKind() != "Service" || e.GetNamespace() != "default" || e.GetName() != "web" || e.GetService() != "default/web" || e.GetReason() != "InvalidService" {
		t.Errorf("event = %v, want Service default/web InvalidService", e)
	}

	// A different problem is a different event: logged, counted afresh.
	if c := published(l, "default/web", 20, svcProblem("web", "unknown protocol")); len(c) != 1 || c[0].ev.message != "unknown protocol" {
		t.Errorf("changed problem: changes %+v, want the new message", c)
	}
	if e := only(t, l); e.GetCount() != 1 || !e.GetFirstSeen().AsTime().Equal(at(20)) {
		t.Errorf("event after the change = %v, want count 1 from 20 s", e)
	}

	// Valid again: the event goes, and that is worth a line too.
	if c := published(l, "default/web", 30); len(c) != 1 || !c[0].cleared {
		t.Errorf("fixed: changes %+v, want one cleared", c)
	}
	if ev := l.snapshot().GetEvents(); len(ev) != 0 {
		t.Errorf("events after the fix = %v, want none", ev)
	}
}

func TestEventLogOneEventPerObject(t *testing.T) {
	l := newEventLog(maxEvents)
	var ps []compute.Problem
	for i := range 7 {
		ps = append(ps, sliceProblem("web-1", fmt.Sprintf("endpoints[%d]: bad", i)))
	}
	ps = append(ps, sliceProblem("web-2", "ports[0]: no name"))
	published(l, "default/web", 0, ps...)
	ev := l.snapshot().GetEvents()
	if len(ev) != 2 || ev[0].GetName() != "web-1" || ev[1].GetName() != "web-2" {
		t.Fatalf("events = %v, want web-1 then web-2", ev)
	}
	want := "7 problems: endpoints[0]: bad; endpoints[1]: bad; endpoints[2]: bad; endpoints[3]: bad; endpoints[4]: bad; and 2 more"
	if got := ev[0].GetMessage(); got != want {
		t.Errorf("message = %q, want %q", got, want)
	}
	if ev[1].GetMessage() != "ports[0]: no name" || ev[1].GetService() != "default/web" {
		t.Errorf("second event = %v", ev[1])
	}
}

func TestEventLogClearsOnlyItsOwn(t *testing.T) {
	// A slice relabelled from Service a to b: b reports it before a is
	// recomputed, and a's recomputation must not clear b's event.
	l := newEventLog(maxEvents)
	published(l, "default/a", 0, sliceProblem("s", "bad"))
	published(l, "default/b", 1, sliceProblem("s", "bad"))
	published(l, "default/a", 2)
	if e := only(t, l); e.GetService() != "default/b" {
		t.Errorf("event = %v, want it kept, owned by default/b", e)
	}
	published(l, "default/b", 3)
	if ev := l.snapshot().GetEvents(); len(ev) != 0 {
		t.Errorf("events = %v, want none", ev)
	}
}

func TestEventLogBounded(t *testing.T) {
	l := newEventLog(3)
	for i, name := range []string{"a", "b", "c"} {
		published(l, "default/"+name, i, svcProblem(name, "bad"))
	}
	published(l, "default/a", 10, svcProblem("a", "bad")) // a is now the freshest
	published(l, "default/d", 11, svcProblem("d", "bad"))
	got := l.snapshot()
	var names []string
	for _, e := range got.GetEvents() {
		names = append(names, e.GetName())
	}
	if strings.Join(names, ",") != "a,c,d" || got.GetDropped() != 1 {
		t.Errorf("events %v, dropped %d; want a,c,d (b, seen least recently, dropped) and 1", names, got.GetDropped())
	}
}

func TestEventLogSnapshots(t *testing.T) {
	l := newEventLog(maxEvents)
	if s := l.snapshot(); s == nil || len(s.GetEvents()) != 0 {
		t.Fatalf("initial snapshot = %v, want empty", s)
	}
	published(l, "default/web", 0, svcProblem("web", "bad"))
	first := l.snapshot()
	before := proto.Clone(first)

	// Nothing recorded: the same snapshot stays.
	l.publish()
	if l.snapshot() != first {
		t.Errorf("a publish without changes replaced the snapshot")
	}
	// A later change makes a new snapshot and leaves the old one alone,
	// for readers still holding it.
	published(l, "default/web", 5, svcProblem("web", "bad"))
	published(l, "default/api", 5, svcProblem("api", "bad"))
	if l.snapshot() == first || !proto.Equal(first, before) {
		t.Errorf("publishing modified a published snapshot: %v, was %v", first, before)
	}

	// Names that are not UTF-8 (compute reports such a Service as
	// invalid) must not make the response unmarshalable.
	published(l, "default/we\xffb", 6, compute.Problem{
		Kind: compute.KindService, Namespace: "default", Name: "we\xffb", Reason: compute.ReasonInvalidService, Message: "bad namespace or name",
	})
	if _, err := proto.Marshal(l.snapshot()); err != nil {
		t.Errorf("marshalling the snapshot: %v", err)
	}
}
