package table

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// testMaxPending is the lag limit of stores and cursors in tests that do
// not exercise it.
const testMaxPending = 100

// epSpec is one endpoint of a test Service, on port 8080.
type epSpec struct {
	ip       string
	node     string // nodeName, "" for none
	zone     string // zone hint, "" for none
	nodeHint string // node hint, "" for none
	notReady bool
}

// svcSpec is a test Service in namespace "default" with one TCP port 80
// named "http".
type svcSpec struct {
	name      string
	clusterIP string // "10.96.0.1" when empty
	eps       []epSpec
	trigger   string // last-change-trigger-time annotation, RFC 3339
	local     bool   // internalTrafficPolicy Local
}

func ptr[T any](v T) *T { return &v }

// buildService computes spec with compute.Build.
func buildService(t *testing.T, spec svcSpec) *compute.Service {
	t.Helper()
	ip := spec.clusterIP
	if ip == "" {
		ip = "10.96.0.1"
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: spec.name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	if spec.local {
		svc.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: spec.name + "-abcde"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	if spec.trigger != "" {
		slice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: spec.trigger}
	}
	for _, e := range spec.eps {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(!e.notReady)},
		}
		if e.node != "" {
			ep.NodeName = ptr(e.node)
		}
		if e.zone != "" || e.nodeHint != "" {
			ep.Hints = &discoveryv1.EndpointHints{}
		}
		if e.zone != "" {
			ep.Hints.ForZones = []discoveryv1.ForZone{{Name: e.zone}}
		}
		if e.nodeHint != "" {
			ep.Hints.ForNodes = []discoveryv1.ForNode{{Name: e.nodeHint}}
		}
		slice.Endpoints = append(slice.Endpoints, ep)
	}
	s, err := compute.Build(svc, []*discoveryv1.EndpointSlice{slice})
	if err != nil {
		t.Fatalf("build %s: %v", spec.name, err)
	}
	return s
}

// simpleService is a Service without topology whose endpoints are ips.
func simpleService(t *testing.T, name string, ips ...string) *compute.Service {
	t.Helper()
	spec := svcSpec{name: name}
	for _, ip := range ips {
		spec.eps = append(spec.eps, epSpec{ip: ip})
	}
	return buildService(t, spec)
}

// zonedService is a Service whose endpoints carry zone hints: ipsA are
// hinted for zone "a", ipsB for zone "b".
func zonedService(t *testing.T, name string, ipsA, ipsB []string) *compute.Service {
	t.Helper()
	spec := svcSpec{name: name}
	for _, ip := range ipsA {
		spec.eps = append(spec.eps, epSpec{ip: ip, zone: "a"})
	}
	for _, ip := range ipsB {
		spec.eps = append(spec.eps, epSpec{ip: ip, zone: "b"})
	}
	return buildService(t, spec)
}

// buildNode computes a Node in zone ("" for unlabelled).
func buildNode(t *testing.T, name, zone string) *compute.Node {
	t.Helper()
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}},
	}
	if zone != "" {
		obj.Labels = map[string]string{corev1.LabelTopologyZone: zone}
	}
	return compute.BuildNode(name, obj)
}

func key(name string) string { return compute.Key("default", name) }

// services maps each Service to its key, for Publish.
func services(svcs ...*compute.Service) map[string]*compute.Service {
	m := make(map[string]*compute.Service, len(svcs))
	for _, s := range svcs {
		m[s.Key] = s
	}
	return m
}

// nodes maps each Node to its name, for Publish.
func nodes(ns ...*compute.Node) map[string]*compute.Node {
	m := make(map[string]*compute.Node, len(ns))
	for _, n := range ns {
		m[n.Name] = n
	}
	return m
}

// removed maps keys to nil, for Publish.
func removed(keys ...string) map[string]*compute.Service {
	m := make(map[string]*compute.Service, len(keys))
	for _, k := range keys {
		m[k] = nil
	}
	return m
}

// parseVersion parses a version or fails the test.
func parseVersion(t *testing.T, v string) uint64 {
	t.Helper()
	n, err := compute.ParseVersion(v)
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	return n
}

// decodeSnapshot decodes a snapshot response and checks its framing.
func decodeSnapshot(t *testing.T, r *Response) *pb.Snapshot {
	t.Helper()
	if r == nil {
		t.Fatal("response: got nil, want a snapshot")
	}
	if !r.Snapshot {
		t.Fatalf("response: got a delta from %s, want a snapshot", compute.FormatVersion(r.Base))
	}
	var s pb.Snapshot
	if err := proto.Unmarshal(r.Body.Bytes(), &s); err != nil {
		t.Fatalf("unmarshal snapshot: %v", err)
	}
	if got := parseVersion(t, s.GetVersion()); got != r.Version {
		t.Fatalf("snapshot version %s, response version %s", s.GetVersion(), compute.FormatVersion(r.Version))
	}
	if len(s.GetEntries()) != r.Upserts {
		t.Fatalf("snapshot has %d entries, response counts %d", len(s.GetEntries()), r.Upserts)
	}
	if s.GetResourceVersion() != r.ResourceVersion {
		t.Fatalf("snapshot resource_version %d, response %d", s.GetResourceVersion(), r.ResourceVersion)
	}
	return &s
}

// decodeDelta decodes a delta response and checks its framing.
func decodeDelta(t *testing.T, r *Response) *pb.Delta {
	t.Helper()
	if r == nil {
		t.Fatal("response: got nil, want a delta")
	}
	if r.Snapshot {
		t.Fatal("response: got a snapshot, want a delta")
	}
	var d pb.Delta
	if err := proto.Unmarshal(r.Body.Bytes(), &d); err != nil {
		t.Fatalf("unmarshal delta: %v", err)
	}
	if got := parseVersion(t, d.GetBaseVersion()); got != r.Base {
		t.Fatalf("delta base %s, response base %s", d.GetBaseVersion(), compute.FormatVersion(r.Base))
	}
	if got := parseVersion(t, d.GetVersion()); got != r.Version {
		t.Fatalf("delta version %s, response version %s", d.GetVersion(), compute.FormatVersion(r.Version))
	}
	if len(d.GetUpserts()) != r.Upserts || len(d.GetRemovals()) != r.Removals {
		t.Fatalf("delta has %d upserts and %d removals, response counts %d and %d",
			len(d.GetUpserts()), len(d.GetRemovals()), r.Upserts, r.Removals)
	}
	if d.GetResourceVersion() != r.ResourceVersion {
		t.Fatalf("delta resource_version %d, response %d", d.GetResourceVersion(), r.ResourceVersion)
	}
	return &d
}

// entryKeys lists the keys of entries, in order.
func entryKeys(es []*pb.ServiceEntry) []string {
	keys := make([]string, len(es))
	for i, e := range es {
		keys[i] = e.GetKey()
	}
	return keys
}

// wantService is what compute produces for node's view of svc: its shared
// and local parts, each decoded on its own and merged.
func wantService(t *testing.T, svc *compute.Service, node *compute.Node) *pb.Service {
	t.Helper()
	e := svc.EntryFor(node)
	var shared, local pb.Service
	if err := proto.Unmarshal(e.Shared.Bytes, &shared); err != nil {
		t.Fatalf("unmarshal shared part of %s: %v", svc.Key, err)
	}
	if err := proto.Unmarshal(e.Local.Bytes, &local); err != nil {
		t.Fatalf("unmarshal local part of %s: %v", svc.Key, err)
	}
	proto.Merge(&shared, &local)
	return &shared
}

// checkEntry checks one decoded entry against node's view of svc.
func checkEntry(t *testing.T, got *pb.ServiceEntry, svc *compute.Service, node *compute.Node) {
	t.Helper()
	if got.GetKey() != svc.Key {
		t.Errorf("entry key %q, want %q", got.GetKey(), svc.Key)
	}
	if want := svc.EntryFor(node).Hash; got.GetHash() != want {
		t.Errorf("entry %s: hash %016x, want %016x", svc.Key, got.GetHash(), want)
	}
	if want := wantService(t, svc, node); !proto.Equal(got.GetService(), want) {
		t.Errorf("entry %s: service\n got %v\nwant %v", svc.Key, got.GetService(), want)
	}
	switch {
	case svc.TriggerTime.IsZero() && got.TriggerTime != nil:
		t.Errorf("entry %s: trigger_time %v, want unset", svc.Key, got.GetTriggerTime().AsTime())
	case !svc.TriggerTime.IsZero() && got.TriggerTime == nil:
		t.Errorf("entry %s: trigger_time unset, want %v", svc.Key, svc.TriggerTime)
	case !svc.TriggerTime.IsZero() && !got.GetTriggerTime().AsTime().Equal(svc.TriggerTime):
		t.Errorf("entry %s: trigger_time %v, want %v", svc.Key, got.GetTriggerTime().AsTime(), svc.TriggerTime)
	}
}

// agent simulates what an agent holds: entry hashes by key and its
// NodeInfo, applying responses as a real agent would.
type agent struct {
	version uint64
	has     bool // holds a table
	node    *pb.NodeInfo
	entries map[string]uint64
}

// apply applies r, checking that a delta applies to what the agent holds
// and that the result adds up to r.Version.
func (a *agent) apply(t *testing.T, r *Response) {
	t.Helper()
	if r.Snapshot {
		decodeSnapshot(t, r)
	} else {
		decodeDelta(t, r)
	}
	if err := a.applyErr(r); err != nil {
		t.Fatal(err)
	}
}

// applyErr is apply for goroutines other than the test's.
func (a *agent) applyErr(r *Response) error {
	if r.Snapshot {
		var s pb.Snapshot
		if err := proto.Unmarshal(r.Body.Bytes(), &s); err != nil {
			return fmt.Errorf("unmarshal snapshot: %w", err)
		}
		if !slices.IsSorted(entryKeys(s.GetEntries())) {
			return fmt.Errorf("snapshot entries not sorted: %v", entryKeys(s.GetEntries()))
		}
		a.node = s.GetNode()
		a.entries = map[string]uint64{}
		for _, e := range s.GetEntries() {
			a.entries[e.GetKey()] = e.GetHash()
		}
	} else {
		var d pb.Delta
		if err := proto.Unmarshal(r.Body.Bytes(), &d); err != nil {
			return fmt.Errorf("unmarshal delta: %w", err)
		}
		if !a.has || r.Base != a.version || d.GetBaseVersion() != compute.FormatVersion(a.version) {
			return fmt.Errorf("delta from %s applied to held version %016x (held: %v)", d.GetBaseVersion(), a.version, a.has)
		}
		if !slices.IsSorted(entryKeys(d.GetUpserts())) || !slices.IsSorted(d.GetRemovals()) {
			return fmt.Errorf("delta not sorted: upserts %v, removals %v", entryKeys(d.GetUpserts()), d.GetRemovals())
		}
		if d.Node != nil {
			a.node = d.GetNode()
		}
		for _, e := range d.GetUpserts() {
			a.entries[e.GetKey()] = e.GetHash()
		}
		for _, k := range d.GetRemovals() {
			if _, ok := a.entries[k]; !ok {
				return fmt.Errorf("delta removes %q, which the agent does not hold", k)
			}
			delete(a.entries, k)
		}
	}
	if a.sum() != r.Version {
		return fmt.Errorf("after applying: entries add up to %016x, response version %016x", a.sum(), r.Version)
	}
	a.version, a.has = r.Version, true
	return nil
}

// sum is the version the agent's entries and node add up to.
func (a *agent) sum() uint64 {
	s := a.node.GetHash()
	for _, h := range a.entries {
		s += h
	}
	return s
}

// held is what the agent reports when it reconnects.
func (a *agent) held() Held {
	if !a.has {
		return Held{}
	}
	return Held{Version: compute.FormatVersion(a.version), Entries: maps.Clone(a.entries), NodeHash: a.node.GetHash()}
}

// tableOf is node's whole table in w as entry hashes, from a fresh snapshot.
func tableOf(t *testing.T, w *World, node string) (*pb.NodeInfo, map[string]uint64) {
	t.Helper()
	c, err := NewCursor(node, w, Held{}, true, testMaxPending)
	if err != nil {
		t.Fatalf("new cursor: %v", err)
	}
	s := decodeSnapshot(t, c.Next())
	m := map[string]uint64{}
	for _, e := range s.GetEntries() {
		m[e.GetKey()] = e.GetHash()
	}
	return s.GetNode(), m
}

// checkAgentCurrent checks that a holds node's table in w.
func checkAgentCurrent(t *testing.T, a *agent, w *World, node string) {
	t.Helper()
	if want := w.Version(w.Node(node)); a.sum() != want || a.version != want {
		t.Fatalf("agent of %s: sum %016x, version %016x; world version %016x", node, a.sum(), a.version, want)
	}
	info, want := tableOf(t, w, node)
	if !maps.Equal(a.entries, want) {
		t.Fatalf("agent of %s holds %v, want %v", node, a.entries, want)
	}
	if !proto.Equal(a.node, info) {
		t.Fatalf("agent of %s holds node %v, want %v", node, a.node, info)
	}
}

// mustTime parses an RFC 3339 time.
func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
