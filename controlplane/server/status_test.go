package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestRegistryForgetsWhatAgentsSent checks that the registry's memory
// does not grow with what clients send: a disconnected agent's
// capabilities and address are dropped, a name with no Node object is
// forgotten as soon as its stream ends (without waiting for a ListNodes),
// and a known node keeps only its fixed-size sync results.
func TestRegistryForgetsWhatAgentsSent(t *testing.T) {
	store := cluster(t)
	store.Publish(nil, map[string]*compute.Node{"node-1": compute.BuildNode("node-1", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})})
	srv := New(store, Options{}, slog.New(slog.DiscardHandler))
	client, _, _, _ := serve(t, srv)
	caps := &pb.Capabilities{Deltas: true, Dataplane: "nftables", AgentVersion: strings.Repeat("v", maxCapabilityLen)}

	known := connect(t, client, &pb.Hello{NodeName: "node-1", Capabilities: caps})
	known.ack(known.recv())
	// The ACK is read by the stream's goroutine: let it land before the
	// stream ends, or the registry rightly has nothing acknowledged.
	eventually(t, "node-1's ACK recorded", func() bool {
		return nodeStatus(t, client, "node-1").GetAckedVersion() == known.version
	})
	invented := connect(t, client, &pb.Hello{NodeName: "invented-7", Capabilities: caps})
	invented.ack(invented.recv())
	if st := nodeStatus(t, client, "invented-7"); !st.GetConnected() || st.GetCapabilities().GetDataplane() != "nftables" {
		t.Fatalf("connected agent's status %v, want connected with its capabilities", st)
	}

	known.close()
	invented.close()
	entries := func() (int, *nodeEntry) {
		srv.reg.mu.Lock()
		defer srv.reg.mu.Unlock()
		return len(srv.reg.nodes), srv.reg.nodes["node-1"]
	}
	eventually(t, "both streams detached", func() bool {
		n, e := entries()
		return n == 1 && e != nil && e.stream == nil
	})
	st := nodeStatus(t, client, "node-1")
	if st.GetConnected() || st.GetCapabilities() != nil || st.GetPeer() != "" {
		t.Errorf("disconnected node-1 still shows what its agent sent: %v", st)
	}
	if st.GetAckedVersion() != known.version || !st.GetKnown() {
		t.Errorf("disconnected node-1: acked %q known %v, want %q and known", st.GetAckedVersion(), st.GetKnown(), known.version)
	}
	if nodeStatus(t, client, "invented-7") != nil {
		t.Error("a name without a Node object is still listed after its stream ended")
	}
}

func TestHelloCapabilitiesBounded(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1", Capabilities: &pb.Capabilities{Dataplane: strings.Repeat("x", 1<<20)}})
	if err := a.recvErr(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("hello with 1 MiB of capabilities ended with %v, want InvalidArgument", err)
	}
	if nodeStatus(t, client, "node-1") != nil {
		t.Error("a refused hello left an entry in the registry")
	}
}

func TestNackErrorBounded(t *testing.T) {
	store := cluster(t)
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	a.nack(a.recv(), strings.Repeat("é", 100_000))
	eventually(t, "the NACK recorded", func() bool { return nodeStatus(t, client, "node-1").GetNackedVersion() != "" })
	got := nodeStatus(t, client, "node-1").GetNackError()
	if len(got) > maxNackError+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("NACK error kept: %d bytes, want at most %d ending in an ellipsis", len(got), maxNackError+len("…"))
	}
}

// TestAdmissionQueuesStreams checks that streams past the admission burst
// wait their turn instead of being served at once or refused.
func TestAdmissionQueuesStreams(t *testing.T) {
	store := cluster(t)
	// One turn an hour after the burst: the third stream must wait.
	client, _, _ := newTestServer(t, store, Options{AdmissionRate: 1.0 / 3600, AdmissionBurst: 2})
	first := connect(t, client, &pb.Hello{NodeName: "node-1"})
	second := connect(t, client, &pb.Hello{NodeName: "node-2"})
	first.ack(first.recv())
	second.ack(second.recv())
	third := connect(t, client, &pb.Hello{NodeName: "node-3"})
	got := make(chan error, 1)
	go func() {
		_, err := third.stream.Recv()
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("third stream answered (%v) past the admission burst; want it waiting", err)
	case <-time.After(300 * time.Millisecond):
	}
	if st := nodeStatus(t, client, "node-3"); st.GetConnected() {
		t.Errorf("waiting stream already registered: %v", st)
	}
	third.close()
	if err := <-got; status.Code(err) != codes.Canceled {
		t.Errorf("waiting stream ended with %v after its agent gave up, want Canceled", err)
	}
}

// TestListNodesLag checks current_version and lag through an agent's
// life: behind from the stream's start until its first ACK, current
// after it, behind again from the world change it has not acknowledged,
// still behind after rejecting it, and without a lag once disconnected.
func TestListNodesLag(t *testing.T) {
	store := cluster(t)
	store.Publish(nil, map[string]*compute.Node{"node-1": compute.BuildNode("node-1", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})})
	client, _, _ := newTestServer(t, store, Options{})
	a := connect(t, client, &pb.Hello{NodeName: "node-1"})
	first := a.recv()

	st := nodeStatus(t, client, "node-1")
	if st.GetLag() == nil || st.GetAckedVersion() != "" || st.GetCurrentVersion() != wantVersion(t, store, "node-1") {
		t.Errorf("before the first ACK: lag %v, acked %q, current %q; want a lag, nothing acked, current %q",
			st.GetLag(), st.GetAckedVersion(), st.GetCurrentVersion(), wantVersion(t, store, "node-1"))
	}
	a.ack(first)
	eventually(t, "node-1 current", func() bool {
		st := nodeStatus(t, client, "node-1")
		return st.GetAckedVersion() == st.GetCurrentVersion() && st.GetLag() == nil
	})

	publish(t, store, map[string]*compute.Service{"a": service(t, "a", 2, 2)})
	delta := a.recv()
	st = nodeStatus(t, client, "node-1")
	if st.GetLag() == nil || st.GetCurrentVersion() != wantVersion(t, store, "node-1") || st.GetAckedVersion() == st.GetCurrentVersion() {
		t.Errorf("after a change: lag %v, acked %q, current %q; want a lag and acked behind current %q",
			st.GetLag(), st.GetAckedVersion(), st.GetCurrentVersion(), wantVersion(t, store, "node-1"))
	}
	a.nack(delta, "bad")
	eventually(t, "the NACK recorded", func() bool { return nodeStatus(t, client, "node-1").GetNackedVersion() != "" })
	lag := st.GetLag().AsDuration()
	eventually(t, "the lag growing after the NACK", func() bool {
		return nodeStatus(t, client, "node-1").GetLag().AsDuration() > lag
	})

	a.close()
	eventually(t, "node-1 disconnected", func() bool { return !nodeStatus(t, client, "node-1").GetConnected() })
	st = nodeStatus(t, client, "node-1")
	if st.GetLag() != nil || st.GetCurrentVersion() != wantVersion(t, store, "node-1") {
		t.Errorf("disconnected: lag %v, current %q; want no lag and current %q", st.GetLag(), st.GetCurrentVersion(), wantVersion(t, store, "node-1"))
	}
}
