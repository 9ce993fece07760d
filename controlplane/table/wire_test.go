package table

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// publishWorld publishes svcs and ns into a new store and returns its world.
func publishWorld(t *testing.T, svcs []*compute.Service, ns ...*compute.Node) *World {
	t.Helper()
	s := NewStore(testMaxPending)
	s.Publish(services(svcs...), nodes(ns...))
	return s.Current()
}

// snapshotOf is the snapshot a fresh agent of node gets in w.
func snapshotOf(t *testing.T, w *World, node string) (*Response, *pb.Snapshot) {
	t.Helper()
	c, err := NewCursor(node, w, Held{}, true, testMaxPending)
	if err != nil {
		t.Fatalf("new cursor: %v", err)
	}
	r := c.Next()
	return r, decodeSnapshot(t, r)
}

func TestWireSnapshot(t *testing.T) {
	n1 := buildNode(t, "n1", "a")
	svcs := []*compute.Service{
		// Out of key order, so that sorting is visible.
		simpleService(t, "zeta", "10.0.0.9"),
		buildService(t, svcSpec{name: "alpha", clusterIP: "10.96.0.2", trigger: "2025-03-01T10:00:00.123456789Z", eps: []epSpec{{ip: "10.0.0.1"}}}),
		zonedService(t, "mid", []string{"10.0.1.1"}, []string{"10.0.1.2"}),
		buildService(t, svcSpec{name: "local", clusterIP: "10.96.0.3", local: true, eps: []epSpec{{ip: "10.0.2.1", node: "n1"}, {ip: "10.0.2.2", node: "n2"}}}),
		simpleService(t, "empty"),
	}
	w := publishWorld(t, svcs, n1)
	r, snap := snapshotOf(t, w, "n1")

	if want := w.Version(w.Node("n1")); r.Version != want {
		t.Errorf("version %016x, want World.Version %016x", r.Version, want)
	}
	var wantNode pb.NodeInfo
	if err := proto.Unmarshal(n1.Bytes, &wantNode); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(snap.GetNode(), &wantNode) {
		t.Errorf("node %v, want %v", snap.GetNode(), &wantNode)
	}
	if snap.GetNode().GetHash() != n1.Hash || snap.GetNode().GetZone() != "a" || snap.GetNode().GetName() != "n1" {
		t.Errorf("node %v: want name n1, zone a, hash %016x", snap.GetNode(), n1.Hash)
	}
	keys := entryKeys(snap.GetEntries())
	if want := []string{key("alpha"), key("empty"), key("local"), key("mid"), key("zeta")}; !slices.Equal(keys, want) {
		t.Errorf("entry keys %v, want %v (sorted)", keys, want)
	}
	for _, e := range snap.GetEntries() {
		checkEntry(t, e, w.Service(e.GetKey()), n1)
	}
	if want := mustTime(t, "2025-03-01T10:00:00.123456789Z"); !r.TriggerTime.Equal(want) {
		t.Errorf("response trigger time %v, want %v", r.TriggerTime, want)
	}
	if r.Upserts != len(svcs) || r.Removals != 0 {
		t.Errorf("counts %d upserts, %d removals; want %d, 0", r.Upserts, r.Removals, len(svcs))
	}
}

func TestWireEmptySnapshot(t *testing.T) {
	w := publishWorld(t, nil)
	r, snap := snapshotOf(t, w, "ghost")
	if len(snap.GetEntries()) != 0 {
		t.Errorf("entries %v, want none", entryKeys(snap.GetEntries()))
	}
	bare := compute.BuildNode("ghost", nil)
	if r.Version != bare.Hash || snap.GetNode().GetHash() != bare.Hash || snap.GetNode().GetName() != "ghost" {
		t.Errorf("version %016x, node %v; want the bare node's hash %016x", r.Version, snap.GetNode(), bare.Hash)
	}
	if !r.TriggerTime.IsZero() {
		t.Errorf("trigger time %v, want zero", r.TriggerTime)
	}
}

func TestWireTriggerTime(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trigger string // "" for no annotation
	}{
		{name: "unset", trigger: ""},
		{name: "whole seconds", trigger: "2025-03-01T10:00:00Z"},
		{name: "nanoseconds", trigger: "2025-03-01T10:00:00.000000001Z"},
		{name: "offset zone", trigger: "2025-03-01T12:00:00.5+02:00"},
		{name: "before the epoch", trigger: "1969-12-31T23:59:59.25Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n1 := buildNode(t, "n1", "a")
			svc := buildService(t, svcSpec{name: "web", trigger: tc.trigger, eps: []epSpec{{ip: "10.0.0.1"}}})
			w := publishWorld(t, []*compute.Service{svc}, n1)
			r, snap := snapshotOf(t, w, "n1")
			if len(snap.GetEntries()) != 1 {
				t.Fatalf("entries %v, want one", entryKeys(snap.GetEntries()))
			}
			e := snap.GetEntries()[0]
			checkEntry(t, e, svc, n1)
			if tc.trigger == "" {
				if e.TriggerTime != nil || !r.TriggerTime.IsZero() {
					t.Errorf("trigger_time %v, response %v; want unset", e.GetTriggerTime(), r.TriggerTime)
				}
				return
			}
			want := mustTime(t, tc.trigger)
			if got := e.GetTriggerTime().AsTime(); !got.Equal(want) {
				t.Errorf("trigger_time %v, want %v", got, want)
			}
			if !r.TriggerTime.Equal(want) {
				t.Errorf("response trigger time %v, want %v", r.TriggerTime, want)
			}
		})
	}
}

// TestWireServiceContent checks decoded entries against Services written
// out by hand, independently of compute's own encoding.
func TestWireServiceContent(t *testing.T) {
	port := []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, HasEndpoints: true}}
	ep := func(ip string) *pb.Endpoint { return &pb.Endpoint{Ip: ip, Port: 8080, Ready: true, Serving: true} }
	eps := func(ips ...string) []*pb.PortEndpoints {
		out := &pb.PortEndpoints{PortName: "http"}
		for _, ip := range ips {
			out.Endpoints = append(out.Endpoints, ep(ip))
		}
		return []*pb.PortEndpoints{out}
	}
	frontend := func(itp pb.TrafficPolicy) *pb.Service {
		return &pb.Service{
			Namespace: "default", Name: "web", Type: pb.ServiceType_SERVICE_TYPE_CLUSTER_IP,
			ClusterIps:            []string{"10.96.0.1"},
			ExternalTrafficPolicy: pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER,
			InternalTrafficPolicy: itp,
			Ports:                 port,
		}
	}
	with := func(s *pb.Service, f func(*pb.Service)) *pb.Service { f(s); return s }
	cluster := pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
	local := pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL

	for _, tc := range []struct {
		name string
		spec svcSpec
		node *compute.Node
		want *pb.Service
	}{{
		name: "cluster endpoints",
		spec: svcSpec{name: "web", eps: []epSpec{{ip: "10.0.0.2"}, {ip: "10.0.0.1"}}},
		node: buildNode(t, "n1", "a"),
		want: with(frontend(cluster), func(s *pb.Service) { s.ClusterEndpoints = eps("10.0.0.1", "10.0.0.2") }),
	}, {
		name: "zone hints for the node's zone",
		spec: svcSpec{name: "web", eps: []epSpec{{ip: "10.0.0.1", zone: "a"}, {ip: "10.0.0.2", zone: "b"}}},
		node: buildNode(t, "n1", "a"),
		want: with(frontend(cluster), func(s *pb.Service) { s.ClusterEndpoints = eps("10.0.0.1") }),
	}, {
		name: "zone hints for no zone of the node",
		spec: svcSpec{name: "web", eps: []epSpec{{ip: "10.0.0.1", zone: "a"}, {ip: "10.0.0.2", zone: "b"}}},
		node: buildNode(t, "n9", "c"),
		want: with(frontend(cluster), func(s *pb.Service) { s.ClusterEndpoints = eps("10.0.0.1", "10.0.0.2") }),
	}, {
		name: "local endpoints on the node",
		spec: svcSpec{name: "web", local: true, eps: []epSpec{{ip: "10.0.0.1", node: "n1"}, {ip: "10.0.0.2", node: "n2"}}},
		node: buildNode(t, "n1", "a"),
		want: with(frontend(local), func(s *pb.Service) { s.LocalEndpoints = eps("10.0.0.1") }),
	}, {
		name: "local policy without local endpoints",
		spec: svcSpec{name: "web", local: true, eps: []epSpec{{ip: "10.0.0.2", node: "n2"}}},
		node: buildNode(t, "n1", "a"),
		want: frontend(local),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := buildService(t, tc.spec)
			w := publishWorld(t, []*compute.Service{svc}, tc.node)
			_, snap := snapshotOf(t, w, tc.node.Name)
			if len(snap.GetEntries()) != 1 {
				t.Fatalf("entries %v, want one", entryKeys(snap.GetEntries()))
			}
			e := snap.GetEntries()[0]
			if !proto.Equal(e.GetService(), tc.want) {
				t.Errorf("service\n got %v\nwant %v", e.GetService(), tc.want)
			}
			checkEntry(t, e, svc, tc.node)
		})
	}
}

func TestWireDelta(t *testing.T) {
	for _, tc := range []struct {
		name     string
		newNode  *compute.Node // nil: the node is unchanged
		wantNode bool
	}{
		{name: "services only"},
		{name: "node changed", newNode: buildNode(t, "n1", "b"), wantNode: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(testMaxPending)
			n1 := buildNode(t, "n1", "a")
			s.Publish(services(
				simpleService(t, "b", "10.0.0.1"),
				simpleService(t, "c", "10.0.0.2"),
				simpleService(t, "e", "10.0.0.3"),
				simpleService(t, "uniform", "10.0.0.4"),
			), nodes(n1))
			p := connect(t, s, "n1", Held{}, true, testMaxPending)
			p.sync()
			base := p.agent.version

			change := services(
				buildService(t, svcSpec{name: "e", trigger: "2025-03-01T10:00:00Z", eps: []epSpec{{ip: "10.0.0.33"}}}),
				simpleService(t, "a", "10.0.0.5"),
				simpleService(t, "d", "10.0.0.6"),
			)
			change[key("c")] = nil
			change[key("b")] = nil
			var ns map[string]*compute.Node
			if tc.newNode != nil {
				ns = nodes(tc.newNode)
			}
			s.Publish(change, ns)

			r := p.next()
			d := decodeDelta(t, r)
			w := s.Current()
			node := w.Node("n1")
			if r.Base != base {
				t.Errorf("base %016x, want %016x", r.Base, base)
			}
			if want := w.Version(node); r.Version != want {
				t.Errorf("version %016x, want World.Version %016x", r.Version, want)
			}
			if want := []string{key("a"), key("d"), key("e")}; !slices.Equal(entryKeys(d.GetUpserts()), want) {
				t.Errorf("upserts %v, want %v", entryKeys(d.GetUpserts()), want)
			}
			for _, e := range d.GetUpserts() {
				checkEntry(t, e, w.Service(e.GetKey()), node)
			}
			if want := []string{key("b"), key("c")}; !slices.Equal(d.GetRemovals(), want) {
				t.Errorf("removals %v, want %v", d.GetRemovals(), want)
			}
			if tc.wantNode {
				var want pb.NodeInfo
				if err := proto.Unmarshal(tc.newNode.Bytes, &want); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(d.GetNode(), &want) {
					t.Errorf("node %v, want %v", d.GetNode(), &want)
				}
			} else if d.Node != nil {
				t.Errorf("node %v, want unset", d.GetNode())
			}
			if want := mustTime(t, "2025-03-01T10:00:00Z"); !r.TriggerTime.Equal(want) {
				t.Errorf("response trigger time %v, want %v", r.TriggerTime, want)
			}
			p.ack(r)
		})
	}
}
