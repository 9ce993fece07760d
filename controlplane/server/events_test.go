package server

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// fakeEvents is an EventSource whose snapshot the test replaces, as the
// watcher's goroutine does.
type fakeEvents struct {
	current atomic.Pointer[pb.ListEventsResponse]
}

func (f *fakeEvents) Events() *pb.ListEventsResponse { return f.current.Load() }

func badService(name string, count uint32) *pb.Event {
	return &pb.Event{
		Kind: compute.KindService, Namespace: "default", Name: name, Service: "default/" + name,
		Reason: compute.ReasonInvalidService, Message: "ports[0]: unknown protocol", Count: count,
		FirstSeen: timestamppb.New(time.Unix(100, 0)), LastSeen: timestamppb.New(time.Unix(200, 0)),
	}
}

func listEvents(t *testing.T, client pb.TableServiceClient) *pb.ListEventsResponse {
	t.Helper()
	resp, err := client.ListEvents(context.Background(), &pb.ListEventsRequest{})
	if err != nil {
		t.Fatalf("ListEvents: %v", err)
	}
	return resp
}

func TestListEvents(t *testing.T) {
	store := table.NewStore(100)
	src := &fakeEvents{}
	src.current.Store(&pb.ListEventsResponse{})
	client, _, _ := newTestServer(t, store, Options{Events: src})

	// Nothing has been checked before the first world: no answer yet
	// rather than an empty list that would claim everything is valid.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := client.ListEvents(ctx, &pb.ListEventsRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("ListEvents before the first world: %v, want DeadlineExceeded", err)
	}
	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 1, 1)})

	if got := listEvents(t, client); len(got.GetEvents()) != 0 || got.GetDropped() != 0 {
		t.Errorf("ListEvents with no problems = %v, want empty", got)
	}
	want := &pb.ListEventsResponse{Events: []*pb.Event{badService("x", 2), {
		Kind: compute.KindEndpointSlice, Namespace: "default", Name: "y-abcde", Service: "default/y",
		Reason: compute.ReasonInvalidEndpoint, Message: `endpoints[3]: address "10.0.0.300" is not an IP address`, Count: 1,
		FirstSeen: timestamppb.New(time.Unix(150, 0)), LastSeen: timestamppb.New(time.Unix(150, 0)),
	}}, Dropped: 7}
	src.current.Store(want)
	if got := listEvents(t, client); !proto.Equal(got, want) {
		t.Errorf("ListEvents = %v, want %v", got, want)
	}

	// Concurrent readers while the owner replaces the snapshot: every
	// answer is one of the snapshots, whole (run with -race).
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				got, err := client.ListEvents(context.Background(), &pb.ListEventsRequest{})
				if err != nil {
					t.Errorf("ListEvents: %v", err)
					return
				}
				if n := len(got.GetEvents()); n != 1 && n != 2 {
					t.Errorf("ListEvents returned %d events, want a whole snapshot (1 or 2)", n)
				}
			}
		})
	}
	for i := range 20 {
		if i%2 == 0 {
			src.current.Store(&pb.ListEventsResponse{Events: []*pb.Event{badService("x", uint32(i))}})
		} else {
			src.current.Store(want)
		}
	}
	wg.Wait()
}

func TestListEventsWithoutSource(t *testing.T) {
	client, _, _ := newTestServer(t, cluster(t), Options{})
	if got := listEvents(t, client); len(got.GetEvents()) != 0 {
		t.Errorf("ListEvents without a source = %v, want empty", got)
	}
}
