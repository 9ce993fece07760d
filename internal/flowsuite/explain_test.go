package flowsuite

import (
	"context"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/server"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// TestExplainMatchesTables holds `controlplane explain` against the
// tables of every case of the packet-flow suite: with the suite's
// Services and nodes, after the initial objects and after each case's
// update, the server's Explain, for every node and every Service, names
// exactly the cluster-wide and local endpoints of that node's table for
// every port, the table's version and the entry's hash; Services the
// suite skips are NotFound. It also holds the source check to the suite's
// loadBalancerSourceRanges case: the client is let in before the update
// and dropped after it, as the packets show.
//
// It needs the suite's topology (so root) for the cases' addresses, but
// no dataplane: only the computation and the server are under test.
func TestExplainMatchesTables(t *testing.T) {
	nstest.RequireRoot(t)
	tp := nstest.New(t, nstest.Options{Nodes: len(zones), Pods: 2})
	c := &cluster{tp: tp, store: table.NewStore(1000), services: map[string]*corev1.Service{}, slices: map[string][]*discoveryv1.EndpointSlice{}}
	nodes := map[string]*compute.Node{}
	for k := range tp.Nodes() {
		n := tp.Node(k)
		nodes[n.Name()] = compute.BuildNode(n.Name(), &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name(), Labels: map[string]string{corev1.LabelTopologyZone: zones[k]}},
		})
	}
	c.store.Publish(nil, nodes)
	srv := server.New(c.store, server.Options{}, slog.New(slog.DiscardHandler))

	// c has no agents: apply only builds and publishes.
	var objs []serviceObjects
	for idx, fc := range flowCases {
		objs = append(objs, fc.objects(c, idx)...)
	}
	c.apply(t, objs...)
	checked := checkExplain(t, c, srv, "initial objects")
	checkRanges(t, c, srv, true)
	for idx, fc := range flowCases {
		if fc.update == nil {
			continue
		}
		c.apply(t, fc.update(c, idx)...)
		checked += checkExplain(t, c, srv, "after the update of "+fc.name)
	}
	checkRanges(t, c, srv, false)
	// Every case's Services, on both nodes, before and after: far more
	// than the cases, so no case was left out by a bug of this test.
	if checked < 2*len(flowCases) {
		t.Errorf("only %d explanations checked for %d cases", checked, len(flowCases))
	}
	t.Logf("%d explanations checked against the tables", checked)
}

// checkExplain compares, for every node, the table the node gets with
// Explain's answer for each Service, and returns the number of
// explanations checked.
func checkExplain(t *testing.T, c *cluster, srv *server.Server, when string) int {
	t.Helper()
	w := c.store.Current()
	checked := 0
	for k := range c.tp.Nodes() {
		node := c.tp.Node(k).Name()
		cur, err := table.NewCursor(node, w, table.Held{}, true, 1000)
		if err != nil {
			t.Fatal(err)
		}
		snap := &pb.Snapshot{}
		if err := proto.Unmarshal(cur.Next().Body.Bytes(), snap); err != nil {
			t.Fatal(err)
		}
		inTable := map[string]bool{}
		for _, e := range snap.GetEntries() {
			inTable[e.GetKey()] = true
			svc := e.GetService()
			x, err := srv.Explain(context.Background(), &pb.ExplainRequest{NodeName: node, Namespace: svc.GetNamespace(), Name: svc.GetName()})
			if err != nil {
				t.Errorf("%s: %s %s: %v", when, node, e.GetKey(), err)
				continue
			}
			checked++
			if x.GetVersion() != snap.GetVersion() || x.GetEntryHash() != compute.FormatVersion(e.GetHash()) {
				t.Errorf("%s: %s %s: version %s entry %s; the table's %s and %016x", when, node, e.GetKey(),
					x.GetVersion(), x.GetEntryHash(), snap.GetVersion(), e.GetHash())
			}
			if len(x.GetService().GetPorts()) != len(svc.GetPorts()) {
				t.Errorf("%s: %s %s: %d ports explained, the table has %d", when, node, e.GetKey(), len(x.GetService().GetPorts()), len(svc.GetPorts()))
			}
			for _, pe := range x.GetService().GetPorts() {
				cluster, local := compute.ExplainedEndpoints(pe)
				for _, set := range []struct {
					name      string
					got, want []*pb.PortEndpoints
				}{
					{"cluster", cluster, portEndpoints(svc.GetClusterEndpoints(), pe.GetName())},
					{"local", local, portEndpoints(svc.GetLocalEndpoints(), pe.GetName())},
				} {
					if len(set.got) != len(set.want) || (len(set.got) == 1 && !proto.Equal(set.got[0], set.want[0])) {
						t.Errorf("%s: %s %s port %s: %s endpoints explained %v, the table has %v",
							when, node, e.GetKey(), pe.GetName(), set.name, set.got, set.want)
					}
				}
			}
		}
		// What the suite skips is in no table, and Explain says so.
		for key := range c.services {
			if inTable[key] {
				continue
			}
			ns, name := c.services[key].Namespace, c.services[key].Name
			_, err := srv.Explain(context.Background(), &pb.ExplainRequest{NodeName: node, Namespace: ns, Name: name})
			if status.Code(err) != codes.NotFound {
				t.Errorf("%s: %s %s, in no table: %v, want NotFound", when, node, key, err)
			}
			checked++
		}
	}
	return checked
}

func portEndpoints(lists []*pb.PortEndpoints, port string) []*pb.PortEndpoints {
	for _, pe := range lists {
		if pe.GetPortName() == port && len(pe.GetEndpoints()) > 0 {
			return []*pb.PortEndpoints{pe}
		}
	}
	return nil
}

// checkRanges checks Explain's source check on the suite's
// loadBalancerSourceRanges case against what its packets show: the
// client let in before the update, dropped after it, in both families.
func checkRanges(t *testing.T, c *cluster, srv *server.Server, allowed bool) {
	t.Helper()
	for _, from := range []string{c.tp.ClientIP().String(), c.tp.ClientIPv6().String()} {
		x, err := srv.Explain(context.Background(), &pb.ExplainRequest{NodeName: c.tp.Node(0).Name(), Namespace: namespace, Name: "ranges", From: from})
		if err != nil {
			t.Fatal(err)
		}
		if got := x.GetService().GetSource(); got.GetAllowed() != allowed {
			t.Errorf("from the client %s: %v, want allowed %v, as the packets show", from, got, allowed)
		}
	}
}
