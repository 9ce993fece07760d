package status

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func reached(ms ...int) []*pb.QuantileReached {
	var out []*pb.QuantileReached
	for i, m := range ms {
		out = append(out, &pb.QuantileReached{Quantile: []float64{0.5, 0.9, 0.99, 1}[i], After: durationpb.New(time.Duration(m) * time.Millisecond)})
	}
	return out
}

func TestMergeChanges(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 250e6, time.UTC)
	trig := timestamppb.New(t0)
	replies := []Reply{
		{Replica: "a:9640", Convergence: []*pb.Convergence{
			// Seen (no trigger time): each replica's own, never merged.
			{Revision: 9, Services: []string{"ns/b"}, ServicesChanged: 1, StartedAt: timestamppb.New(t0.Add(time.Second)), Nodes: 2, Converged: 2, Reached: reached(3, 4, 4, 4)},
			// The same triggered change as b's revision 5.
			{Revision: 8, Services: []string{"ns/a"}, ServicesChanged: 1, StartedAt: trig, FromTriggerTime: true, Nodes: 2, Converged: 2, Reached: reached(10, 20, 20, 20)},
		}},
		{Replica: "b:9640", Convergence: []*pb.Convergence{
			{
				Revision: 5, Services: []string{"ns/a"}, ServicesChanged: 1, StartedAt: trig, FromTriggerTime: true, Nodes: 3, Converged: 2, Left: 1, Reached: reached(15, 30),
				Pending: []*pb.PendingNode{{NodeName: "node-4", Reason: "nacked"}},
			},
		}},
		{Replica: "c:9640", Err: errors.New("refused")},
	}
	got := MergeChanges(replies)
	want := []Change{
		{
			Replicas: []string{"a:9640"}, Services: []string{"ns/b"}, ServicesChanged: 1, Started: t0.Add(time.Second), Nodes: 2, Converged: 2,
			Reached: map[string]Seconds{"0.5": Seconds(3 * time.Millisecond), "0.9": Seconds(4 * time.Millisecond), "0.99": Seconds(4 * time.Millisecond), "1": Seconds(4 * time.Millisecond)},
		},
		// Nodes add up, and those that left; a quantile shows once every
		// replica reached it, as the largest time: 99% and 100% are not
		// reached on b.
		{
			Replicas: []string{"a:9640", "b:9640"}, Services: []string{"ns/a"}, ServicesChanged: 1, Started: t0, FromTriggerTime: true, Nodes: 5, Converged: 4, Left: 1,
			Reached: map[string]Seconds{"0.5": Seconds(15 * time.Millisecond), "0.9": Seconds(30 * time.Millisecond)},
			Pending: []Pending{{Node: "node-4", Reason: "nacked", Replica: "b:9640"}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MergeChanges (-want +got):\n%s", diff)
	}

	rep := &Report{Nodes: []Row{
		{Node: "node-0", Known: true, Connected: true, Replica: "a:9640", AckedVersion: "v0", Lag: lag(0)},
		{Node: "node-4", Known: true, Connected: true, Replica: "b:9640", AckedVersion: "v1", Lag: lag(2 * time.Second), Drift: []Drift{
			{Dataplane: "nftables", IPFamily: "IPv4", Count: 3, LastRepaired: t0.Add(-time.Minute), Detail: "IPv4 table proxyplane: chains deleted services"},
		}},
	}, Changes: got}
	var b bytes.Buffer
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	wantTable := `NODE    REPLICA  ACKED  LAG  LAST NACK
node-0  a:9640   v0     0s   -
node-4  b:9640   v1     2s   -

DRIFT REPAIRED: rules changed behind the agent's back, which it put back
NODE    DATAPLANE  FAMILY  REPAIRS  LAST (UTC)  WHAT
node-4  nftables   IPv4    3        03:03:05    IPv4 table proxyplane: chains deleted services

CONVERGENCE: time from each change's start until that share of the agents whose table it alters had acknowledged it
STARTED (UTC)  FROM     SERVICES  REPLICAS       NODES        50%   90%   99%  100%  NOT CONVERGED
03:04:06.250   seen     ns/b      a:9640         2/2          3ms   4ms   4ms  4ms   -
03:04:05.250   trigger  ns/a      a:9640,b:9640  4/5 +1 left  15ms  30ms  -    -     node-4 (nacked)
`
	if b.String() != wantTable {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), wantTable)
	}
}

func TestChangesCellsAreTerminalSafe(t *testing.T) {
	rep := &Report{Changes: []Change{{
		Replicas: []string{"a:9640"}, Services: []string{"ns/" + hostileNode}, ServicesChanged: 9, Nodes: 30, Converged: 1,
		Pending: []Pending{{Node: hostileNode, Reason: "pending\x1b[2J"}},
	}}, Nodes: []Row{{Node: hostileNode, Drift: []Drift{{Dataplane: "nftables", Count: 1, Detail: hostileNack}}}}}
	var b bytes.Buffer
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsAny(b.Bytes(), "\x1b\x07\x7f\u202e\u009b") {
		t.Errorf("table carries terminal controls:\n%q", b.String())
	}
	if !bytes.Contains(b.Bytes(), []byte("+8")) || !bytes.Contains(b.Bytes(), []byte("and 28 more")) {
		t.Errorf("table does not count the Services and nodes it does not name:\n%s", b.String())
	}
}
