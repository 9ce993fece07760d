package nftables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// syncer drives a Dataplane over a fake kernel through a series of tables,
// computing the changed keys the way proxytable.Apply reports them.
type syncer struct {
	t    *testing.T
	cfg  Config
	k    *fakeKernel
	rec  *dptest.Recorder
	d    *Dataplane
	prev *proxytable.Table
}

func newSyncer(t *testing.T, cfg Config) *syncer {
	t.Helper()
	k, rec := newFakeKernel(cfg.Family), &dptest.Recorder{}
	return &syncer{t: t, cfg: cfg, k: k, rec: rec, d: newDataplane(cfg, k, rec.Observe), prev: proxytable.Empty()}
}

// sync programs services, fully or as a delta from the previous table,
// and returns the transaction run (nil for none) and the error.
func (s *syncer) sync(full bool, services ...*pb.Service) (*transaction, error) {
	s.t.Helper()
	return s.syncNode(full, dptest.Node(), services...)
}

func (s *syncer) syncNode(full bool, node *pb.NodeInfo, services ...*pb.Service) (*transaction, error) {
	s.t.Helper()
	next := dptest.Table(s.t, node, services...)
	changed := dptest.ChangedKeys(s.prev, next)
	n := len(s.k.runs)
	err := s.d.Sync(context.Background(), next, changed, full)
	if err == nil {
		s.prev = next
	}
	if len(s.k.runs) == n {
		return nil, err
	}
	return s.k.runs[len(s.k.runs)-1], err
}

// mustSync is sync that fails the test on error; it returns the
// transaction's nft text ("" for none).
func (s *syncer) mustSync(full bool, services ...*pb.Service) string {
	s.t.Helper()
	tx, err := s.sync(full, services...)
	if err != nil {
		s.t.Fatalf("Sync(full=%v): %v", full, err)
	}
	if tx == nil {
		return ""
	}
	return tx.text(s.cfg.Family)
}

// assertKernelLikeFullSync checks that the fake kernel holds exactly what
// a full sync of the current table into an empty kernel gives: partial
// syncs must converge to the same ruleset.
func (s *syncer) assertKernelLikeFullSync() {
	s.t.Helper()
	ref := newFakeKernel(s.cfg.Family)
	if err := newTestDataplane(s.cfg, ref).Sync(context.Background(), s.prev, nil, true); err != nil {
		s.t.Fatalf("reference Sync: %v", err)
	}
	if got, want := s.k.dump(), ref.dump(); got != want {
		s.t.Fatalf("kernel differs from a full sync of the same table:\n%s", dptest.LineDiff(want, got))
	}
}

func TestPartialSyncEndpointChangeWritesOnlyThatService(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	cfg.EndpointMapMin = 1
	s := newSyncer(t, cfg)
	others := dptest.ScaleServices(20, 2)
	web := dptest.ClusterIPTwoEndpoints()
	s.mustSync(true, append(others, web)...)

	// One endpoint replaced, as many endpoints: only elements change,
	// the replaced one in the Service's endpoint map and in the hairpin
	// set; no rule, so the kernel does not validate the chain graph.
	web2 := dptest.ClusterIPTwoEndpoints()
	web2.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.LocalEP+":8080", dptest.RemoteEP2+":8080")}
	data := s.mustSync(false, append(others, web2)...)

	epMap := prefixEndpointsMap + portNameBase("ns/web", "tcp", "http")
	want := []string{
		"delete element ip proxyplane " + epMap + " { 1 }",
		"add element ip proxyplane " + epMap + " { 1 : " + dptest.RemoteEP2 + " . 8080 }",
		"delete element ip proxyplane " + setHairpin + " { " + dptest.RemoteEP + " . " + dptest.RemoteEP + " . tcp . 8080 }",
		"add element ip proxyplane " + setHairpin + " { " + dptest.RemoteEP2 + " . " + dptest.RemoteEP2 + " . tcp . 8080 }",
	}
	for _, w := range want {
		if !strings.Contains(data, w) {
			t.Errorf("partial sync lacks %q:\n%s", w, data)
		}
	}
	if n := strings.Count(data, "\n"); n != len(want) {
		t.Errorf("partial sync has %d operations, want %d:\n%s", n, len(want), data)
	}
	for _, unwanted := range []string{"chain", "rule", dptest.LocalEP + " . 8080", "ns/svc-", "services", "table"} {
		if strings.Contains(data, unwanted) {
			t.Errorf("endpoint-only change wrote %q:\n%s", unwanted, data)
		}
	}
	if s.k.lists != 1 {
		t.Errorf("the kernel was listed %d times, want once (first full sync only)", s.k.lists)
	}
	s.assertKernelLikeFullSync()
}

func TestPartialSyncAddAndRemove(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	others := dptest.ScaleServices(5, 2)
	s.mustSync(true, others...)

	// Add: its chains and elements, nothing of the others.
	data := s.mustSync(false, append(others, dptest.NodePortService())...)
	for _, w := range []string{
		"add element ip proxyplane service-ips { 10.96.0.20 . tcp . 80 : goto service-",
		"add element ip proxyplane service-nodeports { tcp . 30080 : goto external-", "add element ip proxyplane cluster-ips { 10.96.0.20 }",
	} {
		if !strings.Contains(data, w) {
			t.Errorf("adding a service lacks %q:\n%s", w, data)
		}
	}
	if strings.Contains(data, "ns/svc-") || strings.Contains(data, "flush") {
		t.Errorf("adding a service touched others:\n%s", data)
	}
	s.assertKernelLikeFullSync()

	// Remove: elements first, then its chains flushed and deleted.
	data = s.mustSync(false, others...)
	np := portNameBase("ns/np", "tcp", "")
	lines := strings.Split(data, "\n")
	firstDelete := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "delete chain") })
	lastElement := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "delete element") {
			lastElement = i
		}
	}
	if firstDelete < 0 || lastElement < 0 || lastElement > firstDelete {
		t.Errorf("removal must delete elements before chains:\n%s", data)
	}
	for _, c := range []string{prefixClusterPolicyChain + np, prefixExternalChain + np} {
		if !strings.Contains(data, "delete chain ip proxyplane "+c+"\n") {
			t.Errorf("removal does not delete %s:\n%s", c, data)
		}
	}
	s.assertKernelLikeFullSync()
	if strings.Contains(s.k.dump(), np) {
		t.Errorf("removed service's chains still in the kernel:\n%s", s.k.dump())
	}
}

func TestPartialSyncLosingEndpointsRejects(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.ClusterIPTwoEndpoints(), dptest.NodePortService())
	gone := dptest.ClusterIPTwoEndpoints()
	gone.Ports[0].HasEndpoints = false
	gone.ClusterEndpoints = nil
	data := s.mustSync(false, gone, dptest.NodePortService())
	if !strings.Contains(data, "add element ip proxyplane no-endpoint-services { 10.96.0.10 . tcp . 80 : goto reject-chain }") ||
		!strings.Contains(data, "delete element ip proxyplane service-ips { 10.96.0.10 . tcp . 80 }") {
		t.Errorf("service losing its endpoints did not move to no-endpoint-services:\n%s", data)
	}
	s.assertKernelLikeFullSync()
}

func TestPartialSyncOtherFamilyChangeWritesNothing(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.DualStackService())
	v6changed := dptest.DualStackService()
	v6changed.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.LocalEP+":8080", "[fd00:244:3::10]:8080")}
	tx, err := s.sync(false, v6changed)
	if err != nil {
		t.Fatal(err)
	}
	if tx != nil && !tx.empty() {
		t.Errorf("an IPv6-only change made the IPv4 dataplane write:\n%s", tx.text(dataplane.IPv4))
	}
}

// TestFullSyncReplacesLeftovers checks the first full sync of a process:
// it lists the table and deletes what it does not use, and recreates base
// chains and shared maps (a table of another version may differ).
func TestFullSyncReplacesLeftovers(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	leftovers := &transaction{}
	old := &chain{name: "service-OLDOLDOL-ns/old/tcp/http", rules: []rule{newRule(verdictOf(verdictDrop))}}
	oldSet := &set{name: "affinity-OLDOLDOL-ns/old/tcp/http__10.0.0.1/80/60s", key: keyAddr, timeout: 60e9}
	oldBase := &chain{name: chainNATPrerouting, hook: &baseHook{typ: "nat", hook: "prerouting", priority: -150}}
	ips := &set{name: mapServiceIPs, key: keyAddrProtoPort, vmap: true}
	leftovers.add(op{kind: opAddTable}, op{kind: opAddChain, chain: old}, op{kind: opAddRule, name: old.name, rule: &old.rules[0]},
		op{kind: opAddSet, set: oldSet}, op{kind: opAddChain, chain: oldBase}, op{kind: opAddSet, set: ips},
		op{kind: opAddElements, set: ips, elems: []element{{key: elemKey{addr: mustAddr("10.96.9.9"), proto: protoTCP, port: 80}, verdict: goTo(old.name)}}})
	if err := s.k.Run(context.Background(), leftovers); err != nil {
		t.Fatal(err)
	}
	data := s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	for _, w := range []string{
		"delete chain ip proxyplane " + old.name, "delete set ip proxyplane " + oldSet.name,
		"delete chain ip proxyplane nat-prerouting", "delete map ip proxyplane service-ips",
	} {
		if !strings.Contains(data, w+"\n") {
			t.Errorf("first full sync lacks %q:\n%s", w, data)
		}
	}
	if s.k.lists != 1 {
		t.Errorf("listed %d times, want 1", s.k.lists)
	}
	s.assertKernelLikeFullSync()

	// A later full sync knows the kernel: no listing, no recreation.
	data = s.mustSync(true, dptest.NodePortService())
	if s.k.lists != 1 || strings.Contains(data, "delete chain ip proxyplane nat-prerouting") {
		t.Errorf("second full sync listed the kernel or recreated base chains:\n%s", data)
	}
	if !strings.Contains(data, "delete chain ip proxyplane "+prefixClusterPolicyChain+portNameBase("ns/web", "tcp", "http")) {
		t.Errorf("full sync does not delete the removed service's chain:\n%s", data)
	}
	s.assertKernelLikeFullSync()
}

// TestFullSyncKeepsAffinitySets checks that full syncs neither delete nor
// flush the affinity sets that stay: clients keep their endpoints.
func TestFullSyncKeepsAffinitySets(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.AffinityService())
	set := affinitySet("ns/sticky", "http", dptest.RemoteEP+":8080")
	s.k.table.sets[set].elems[elemKey{addr: mustAddr(dptest.LocalPod)}] = element{key: elemKey{addr: mustAddr(dptest.LocalPod)}} // a client seen
	data := s.mustSync(true, dptest.AffinityService())
	if strings.Contains(data, "set ip proxyplane "+set) && !strings.Contains(data, "add set ip proxyplane "+set) {
		t.Errorf("full sync touched the affinity set:\n%s", data)
	}
	if _, ok := s.k.table.sets[set].elems[elemKey{addr: mustAddr(dptest.LocalPod)}]; !ok {
		t.Errorf("full sync lost the affinity entry")
	}
	// A new timeout is a new set; the old one goes.
	longer := dptest.AffinityService()
	longer.SessionAffinity.TimeoutSeconds = 1200
	s.mustSync(false, longer)
	if _, ok := s.k.table.sets[set]; ok {
		t.Errorf("affinity set of the old timeout survives")
	}
	s.assertKernelLikeFullSync()
}

func TestRefusedTransactionKeepsStateAndForcesFull(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	base := dptest.ScaleServices(3, 2)
	s.mustSync(true, base...)
	before := s.k.dump()

	s.k.fail = func(tx *transaction) error {
		for _, o := range opsOf(tx) {
			if o.owner == "ns/np" && o.kind == opAddRule {
				return &TransactionError{Family: dataplane.IPv4, Op: o.text(dataplane.IPv4), Key: o.owner, Errno: syscall.EINVAL, Refused: 1}
			}
		}
		return nil
	}
	_, err := s.sync(false, append(base, dptest.NodePortService(), dptest.NoEndpointsService())...)
	var te *TransactionError
	if !errors.As(err, &te) || !IsTransactionRefused(err) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Sync error = %v, want a TransactionError wrapping EINVAL", err)
	}
	if !te.Partial || te.Key != "ns/np" || !strings.Contains(err.Error(), "service ns/np") {
		t.Errorf("TransactionError = %+v (%v), want partial, naming ns/np", te, err)
	}
	if s.rec.Count(false, true) != 1 || s.rec.Count(true, true) != 0 {
		t.Errorf("observed syncs %+v, want one failure, partial", s.rec.Results)
	}
	if s.k.dump() != before {
		t.Errorf("a refused transaction changed the kernel")
	}
	s.k.fail = nil

	// The next call is partial but runs as full and converges. The
	// Driver forgets the kernel after any failure, so it lists the table
	// first: a refusal may come of drift (another program's element in
	// the way), which the state cannot show.
	tx, err := s.sync(false, base...)
	if err != nil {
		t.Fatal(err)
	}
	if tx.op(0).kind != opAddTable || s.k.lists != 2 {
		t.Errorf("sync after a failure was not a full one from a listing (lists %d):\n%s", s.k.lists, tx.text(dataplane.IPv4))
	}
	s.assertKernelLikeFullSync()
	if s.rec.Count(true, false) != 2 || s.rec.Count(false, false) != 0 {
		t.Errorf("observed syncs %+v, want 2 successful full syncs", s.rec.Results)
	}
}

// TestUnknownOutcomeListsAgain checks that after a transaction whose
// outcome is unknown (the answer was lost) the next sync lists the table.
func TestUnknownOutcomeListsAgain(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	s.k.fail = func(tx *transaction) error {
		return &SocketError{Op: "reading the kernel's answer", Sent: true, Err: syscall.ENOBUFS}
	}
	if _, err := s.sync(false, dptest.ClusterIPTwoEndpoints(), dptest.NodePortService()); !IsOutcomeUnknown(err) || !IsSocketFailed(err) {
		t.Fatalf("Sync error = %v, want an unknown outcome", err)
	}
	s.k.fail = nil
	s.mustSync(false, dptest.ClusterIPTwoEndpoints(), dptest.NodePortService())
	if s.k.lists != 2 {
		t.Errorf("listed %d times, want 2 (after the unknown outcome)", s.k.lists)
	}
	s.assertKernelLikeFullSync()
}

func TestNodeCIDRChangeForcesFullSync(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	cfg.LocalMode = dataplane.LocalNodeCIDR
	s := newSyncer(t, cfg)
	if _, err := s.syncNode(true, dptest.Node(), dptest.ClusterIPTwoEndpoints()); err != nil {
		t.Fatal(err)
	}
	node := dptest.Node()
	node.PodCidrs = []string{"10.244.9.0/24"}
	node.Hash = 8
	tx, err := s.syncNode(false, node, dptest.ClusterIPTwoEndpoints())
	if err != nil {
		t.Fatal(err)
	}
	if data := tx.text(dataplane.IPv4); !strings.Contains(data, "ip saddr != 10.244.9.0/24 jump mark-for-masquerade") || tx.op(0).kind != opAddTable {
		t.Errorf("pod CIDR change did not rewrite everything:\n%s", data)
	}
	s.assertKernelLikeFullSync()
}

// TestConflictingServices checks that two Services claiming the same
// address and port (invalid, but not prevented) never fail a sync: the
// smaller key wins, and the other takes over when it goes.
func TestConflictingServices(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	a := dptest.ExternalIPService() // ns/ext, 198.51.100.80:80
	b := proto.CloneOf(a)
	b.Name, b.ClusterIps = "ext2", []string{"10.96.0.81"}
	b.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.RemoteEP2+":8080")}
	s.mustSync(true, a, b)
	winner := func() string {
		for key, v := range s.k.table.sets[mapServiceIPs].elems {
			if key.addr == mustAddr("198.51.100.80") {
				return v.verdict.chain
			}
		}
		return ""
	}
	if w := winner(); !strings.Contains(w, "ns/ext/") {
		t.Errorf("external IP goes to %s, want ns/ext's chain", w)
	}
	s.mustSync(false, b)
	if w := winner(); !strings.Contains(w, "ns/ext2/") {
		t.Errorf("after ns/ext went, the external IP goes to %q, want ns/ext2's chain", w)
	}
	s.assertKernelLikeFullSync()
	s.mustSync(false, a, b)
	s.assertKernelLikeFullSync()
}

// TestPartialSyncsConverge applies random changes as partial syncs (and
// every 50th as a full one) and checks after each that the kernel holds
// what a full sync of the same table into an empty kernel would.
func TestPartialSyncsConverge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, family := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		// Cascades, endpoint maps for every service port, and ports
		// crossing the threshold both ways as their endpoints change.
		for _, mapMin := range []int{0, 1, 2, 3} {
			t.Run(fmt.Sprintf("%s/endpoint-map-min-%d", family, mapMin), func(t *testing.T) {
				cfg := testConfig(family)
				cfg.EndpointMapMin = mapMin
				s := newSyncer(t, cfg)
				s.mustSync(true)
				dptest.Converge(t, rng, func(full bool, services ...*pb.Service) error {
					_, err := s.sync(full, services...)
					return err
				}, s.assertKernelLikeFullSync)
			})
		}
	}
}

// TestHairpinSharedEndpoint checks the hairpin set's counts: an endpoint
// two Services share (same address, protocol and port) stays in the set
// until neither has it, through partial syncs.
func TestHairpinSharedEndpoint(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	a := dptest.ClusterIPTwoEndpoints() // ns/web: LocalEP and RemoteEP on 8080
	b := proto.CloneOf(a)
	b.Name, b.ClusterIps = "web2", []string{"10.96.0.12"}
	b.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.RemoteEP+":8080")}
	shared := elemKey{addr: mustAddr(dptest.RemoteEP), proto: protoTCP, port: 8080}
	local := elemKey{addr: mustAddr(dptest.LocalEP), proto: protoTCP, port: 8080}
	has := func(k elemKey) bool {
		_, ok := s.k.table.sets[setHairpin].elems[k]
		return ok
	}
	s.mustSync(true, a, b)
	if !has(shared) || !has(local) {
		t.Fatalf("hairpin set lacks the endpoints:\n%s", s.k.dump())
	}
	// ns/web goes: its other endpoint leaves the set, the shared one stays.
	data := s.mustSync(false, b)
	if has(local) || !has(shared) {
		t.Errorf("after ns/web went, hairpin set has %v (want false) and %v (want true):\n%s", has(local), has(shared), data)
	}
	// ns/web2 moves its endpoint elsewhere: the shared one goes too.
	b2 := proto.CloneOf(b)
	b2.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.RemoteEP2+":8080")}
	data = s.mustSync(false, b2)
	if has(shared) {
		t.Errorf("the endpoint no Service has stayed in the hairpin set:\n%s", data)
	}
	// Both back at once, the shared endpoint counted twice, one goes.
	s.mustSync(false, a, b)
	s.mustSync(false, b)
	if !has(shared) {
		t.Errorf("the shared endpoint left the hairpin set with one Service still using it")
	}
	s.assertKernelLikeFullSync()
}

// TestFullSyncReusesUnchangedFragments checks that a full sync from memory
// takes the previous sync's fragment of every Service whose entry did not
// change (the table shares unchanged entries across deltas), builds the
// changed one's, programs what a full sync from scratch programs, and
// reuses nothing when the parameters changed (here the service CIDRs).
func TestFullSyncReusesUnchangedFragments(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	cfg.EndpointMapMin = 1
	k := newFakeKernel(cfg.Family)
	d := newTestDataplane(cfg, k)
	ctx := context.Background()
	web, np := dptest.ClusterIPTwoEndpoints(), dptest.NodePortService()
	t1 := dptest.Table(t, dptest.Node(), web, np)
	if err := d.Sync(ctx, t1, nil, true); err != nil {
		t.Fatal(err)
	}
	before := d.b.last.services
	moved := proto.CloneOf(web)
	moved.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps(moved.Ports[0].Name, "10.244.2.99:8080")}
	t2 := dptest.Replace(t, t1, moved)
	if err := d.Sync(ctx, t2, nil, true); err != nil {
		t.Fatal(err)
	}
	webKey := web.Namespace + "/" + web.Name
	for key, fr := range d.b.last.services {
		if reused := fr == before[key]; reused != (key != webKey) {
			t.Errorf("%s: fragment reused %v, want %v", key, reused, key != webKey)
		}
	}
	ref := newFakeKernel(cfg.Family)
	if err := newTestDataplane(cfg, ref).Sync(ctx, t2, nil, true); err != nil {
		t.Fatal(err)
	}
	if got, want := k.dump(), ref.dump(); got != want {
		t.Fatalf("kernel differs from a full sync of the same table:\n%s", dptest.LineDiff(want, got))
	}
	// Nothing changed: the state is the previous one, claims and all.
	st := d.b.last
	if err := d.Sync(ctx, t2, nil, true); err != nil {
		t.Fatal(err)
	}
	if d.b.last != st {
		t.Errorf("a full sync of an unchanged table built a new state")
	}
	if got, want := k.dump(), ref.dump(); got != want {
		t.Fatalf("kernel differs from a full sync of the same table:\n%s", dptest.LineDiff(want, got))
	}

	node := dptest.Node()
	node.ServiceCidrs = []string{"10.96.0.0/12"}
	t3, err := proxytable.FromEntries(t2.Version, node, slices.Collect(maps.Values(t2.Entries)))
	if err != nil {
		t.Fatal(err)
	}
	prev := d.b.last.services
	if err := d.Sync(ctx, t3, nil, true); err != nil {
		t.Fatal(err)
	}
	for key, fr := range d.b.last.services {
		if fr == prev[key] {
			t.Errorf("%s: fragment reused across a change of the service CIDRs", key)
		}
	}
}
