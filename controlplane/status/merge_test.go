package status

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

func TestMerge(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(s int) *timestamppb.Timestamp { return timestamppb.New(t0.Add(time.Duration(s) * time.Second)) }
	replies := []Reply{
		{Replica: "a:9640", Nodes: []*pb.NodeStatus{
			// Connected here only.
			{NodeName: "node-0", Known: true, Connected: true, Peer: "10.1.0.1:5000", ConnectedAt: at(0), AckedVersion: "v0", CurrentVersion: "v0"},
			// An older stream, still counted here: the agent moved to b.
			{NodeName: "node-1", Known: true, Connected: true, ConnectedAt: at(1), AckedVersion: "old", NackedVersion: "n1", NackError: "old nack"},
			// Disconnected; acknowledged here first.
			{NodeName: "node-2", Known: true, AckedVersion: "v2-old", AckedAt: at(1)},
		}},
		{Replica: "b:9640", Nodes: []*pb.NodeStatus{
			{NodeName: "node-0", Known: true, CurrentVersion: "v0"},
			{NodeName: "node-1", Known: true, Connected: true, ConnectedAt: at(5), AckedVersion: "v1", CurrentVersion: "v1b", Lag: durationpb.New(3 * time.Second)},
			{NodeName: "node-2", Known: true, AckedVersion: "v2", AckedAt: at(9)},
			// Only b lists it: an agent without a Node object.
			{NodeName: "invented", Connected: true, ConnectedAt: at(2)},
		}},
		{Replica: "c:9640", Err: errors.New("connection refused")},
	}
	got := Merge(replies)
	zero, three := Seconds(0), Seconds(3*time.Second)
	want := &Report{
		Replicas: []ReplicaResult{{Address: "a:9640", Connected: 2}, {Address: "b:9640", Connected: 2}, {Address: "c:9640", Error: "connection refused"}},
		Nodes: []Row{
			{Node: "invented", Connected: true, Replica: "b:9640", Lag: &zero},
			{Node: "node-0", Known: true, Connected: true, Replica: "a:9640", Peer: "10.1.0.1:5000", AckedVersion: "v0", CurrentVersion: "v0", Lag: &zero},
			{Node: "node-1", Known: true, Connected: true, Replica: "b:9640", AlsoConnected: []string{"a:9640"}, AckedVersion: "v1", CurrentVersion: "v1b", Lag: &three},
			{Node: "node-2", Known: true, Replica: "b:9640", AckedVersion: "v2"},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Merge (-want +got):\n%s", diff)
	}
	if got.Answered() != 2 {
		t.Errorf("Answered = %d, want 2", got.Answered())
	}
}

func TestMergeNoAnswer(t *testing.T) {
	got := Merge([]Reply{{Replica: "a:9640", Err: errors.New("refused")}})
	if got.Answered() != 0 || len(got.Nodes) != 0 {
		t.Errorf("Merge of a failed reply: %+v, want no node and none answered", got)
	}
}
