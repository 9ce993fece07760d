package scenarios

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// movedReplicaPort is the gRPC port of the replica that stands for a
// control-plane machine replaced: no agent's --control-plane lists it.
const movedReplicaPort = 9720

// testControlPlaneReplaced replaces the control plane as Cluster API or
// a node pool roll would: a new replica, on an address no agent was
// configured with, becomes the only ready endpoint of the
// proxyplane-controlplane Service (the box writes its EndpointSlice, as
// the EndpointSlice controller would), every agent learns its address
// from its table, then every configured replica goes. Every agent must
// end up served by the new replica, and an agent restarted then, with
// only dead configured addresses, must reach it from its cache.
func (e *env) testControlPlaneReplaced(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	moved, err := b.StartExtraControlPlane(ctx, "controlplane-moved", movedReplicaPort)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(moved.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	learned := []string{moved.GRPCAddr()}
	ns := b.Deployment().Namespace
	sliceClient := b.Admin().DiscoveryV1().EndpointSlices(ns)
	portName, port, ready := "grpc", int32(movedReplicaPort), true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "proxyplane-controlplane-moved", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: "proxyplane-controlplane"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	if _, err := sliceClient.Create(ctx, slice, metav1.CreateOptions{FieldManager: box.FieldManager}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restoreControlPlanes(t, b, moved, slice.Name) })

	start := time.Now()
	if _, err := b.WaitProgrammed(ctx, func(_ string, s *pb.Snapshot) error {
		if got := s.GetNode().GetControlPlaneAddresses(); !slices.Equal(got, learned) {
			return fmt.Errorf("control plane addresses %q, want %q", got, learned)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	learnedIn := time.Since(start)

	// Every configured replica goes: the agents have only what they
	// learned.
	start = time.Now()
	if err := b.StopControlPlanes(ctx); err != nil {
		t.Fatal(err)
	}
	waitServedBy(ctx, t, b, moved, time.Time{})
	movedIn := time.Since(start)

	// A restart with nothing but dead configured addresses: the cached
	// table's learned address is dialled.
	a := b.Agents[0]
	restarted := time.Now()
	if err := a.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitServedBy(ctx, t, b, moved, restarted)
	figure(t, "control-plane-replaced", "learned=%s all-agents-on-new-replica=%s restarted-agent-reconnected=%s nodes=%d",
		ms(learnedIn), ms(movedIn), ms(time.Since(restarted)), len(b.Agents))
}

// waitServedBy waits until every agent is connected to c and has
// acknowledged its table there; since, when set, is a time the restarted
// first agent's stream must have opened after.
func waitServedBy(ctx context.Context, t *testing.T, b *box.Box, c *box.ControlPlane, since time.Time) {
	t.Helper()
	err := box.Eventually(ctx, func() error {
		resp, err := c.ListNodes(ctx)
		if err != nil {
			return err
		}
		statuses := map[string]*pb.NodeStatus{}
		for _, st := range resp.GetNodes() {
			statuses[st.GetNodeName()] = st
		}
		for i, a := range b.Agents {
			node := a.Node.Name()
			st := statuses[node]
			if !st.GetConnected() {
				return fmt.Errorf("%s is not connected to %s", node, c.Name())
			}
			if i == 0 && !since.IsZero() && st.GetConnectedAt().AsTime().Before(since.Add(-time.Second)) {
				return fmt.Errorf("%s's stream to %s predates its restart", node, c.Name())
			}
			if st.GetAckedVersion() == "" || st.GetAckedVersion() != st.GetCurrentVersion() {
				return fmt.Errorf("%s acknowledged %q on %s, its table is %q", node, st.GetAckedVersion(), c.Name(), st.GetCurrentVersion())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for every agent on %s: %v", c.Name(), err)
	}
}

// restoreControlPlanes undoes testControlPlaneReplaced: the configured
// replicas back, the slice gone (so tables learn nothing), then the moved
// replica stopped, and every agent back on a configured replica.
func restoreControlPlanes(t *testing.T, b *box.Box, moved *box.ControlPlane, slice string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), scenarioTimeout)
	defer cancel()
	if err := b.StartControlPlanes(ctx); err != nil {
		t.Errorf("restarting the replicas: %v", err)
	}
	if err := b.Admin().DiscoveryV1().EndpointSlices(b.Deployment().Namespace).Delete(ctx, slice, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting the slice: %v", err)
	}
	// Every replica's tables must have forgotten the address before the
	// moved replica goes, or agents would wait on it again.
	err := box.Eventually(ctx, func() error {
		for _, c := range append(slices.Clone(b.ControlPlanes), moved) {
			s, err := c.Table(ctx, b.Agents[0].Node.Name())
			if err != nil {
				return err
			}
			if a := s.GetNode().GetControlPlaneAddresses(); len(a) > 0 {
				return fmt.Errorf("%s still sends %q", c.Name(), a)
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("waiting for the tables to forget the moved replica: %v", err)
	}
	if err := moved.Stop(ctx); err != nil {
		t.Errorf("stopping %s: %v", moved.Name(), err)
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Errorf("agents not back on the configured replicas: %v", err)
	}
}
