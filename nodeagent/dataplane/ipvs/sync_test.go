package ipvs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// assertLikeFullSync checks that n's kernel holds exactly what full syncs
// of n's current table give on an empty kernel of the same node: partial
// syncs (and repairs) must converge to the same state.
func (n *node) assertLikeFullSync() {
	n.t.Helper()
	ref := newNode(n.t, n.k, nil)
	var services []*pb.Service
	for _, k := range n.prev.Keys() {
		services = append(services, n.prev.Entries[k].GetService())
	}
	ref.mustSync(true, services...)
	if got, want := n.dump(), ref.dump(); got != want {
		n.t.Fatalf("kernel differs from a full sync of the same table:\n%s", dptest.LineDiff(want, got))
	}
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		for _, table := range []string{"nat", "filter"} {
			if got, want := n.kern.iptables[f].dump(table), ref.kern.iptables[f].dump(table); got != want {
				n.t.Fatalf("%v %s table differs from a full sync:\n%s", f, table, dptest.LineDiff(want, got))
			}
		}
	}
}

// logSince returns the changes logged from mark on.
func (n *node) logSince(mark int) []string { return slices.Clone(n.kern.log[mark:]) }

// scaleSpecs returns n ClusterIP+NodePort Services with two endpoints.
func scaleSpecs(n int) []svcSpec {
	out := make([]svcSpec, n)
	for i := range out {
		out[i] = svcSpec{idx: 30 + i, name: fmt.Sprintf("svc-%d", i), nodePort: true, pods: []int{i % 4, (i + 1) % 4}}
	}
	return out
}

func buildAll(k int, specs ...svcSpec) []*pb.Service {
	out := make([]*pb.Service, len(specs))
	for i, s := range specs {
		out[i] = s.build(k)
	}
	return out
}

func TestPartialSyncTouchesOnlyTheChange(t *testing.T) {
	n := newNode(t, 0, nil)
	specs := scaleSpecs(20)
	n.mustSync(true, buildAll(0, specs...)...)
	reads, restores := n.kern.ipvs.reads, len(n.kern.ipset.restores)

	// One Service's endpoints change: pod 3 replaces pod 1.
	specs[1].pods = []int{2, 3}
	before := len(n.kern.log)
	n.mustSync(false, buildAll(0, specs...)...)
	got := n.logSince(before)
	for _, op := range got {
		if strings.Contains(op, "iptables") || strings.Contains(op, "sysctl") || strings.Contains(op, "link") {
			t.Errorf("partial sync did %q", op)
		}
		if strings.HasPrefix(op, "ipvs") && !strings.Contains(op, "10.244.1.11:8080") && !strings.Contains(op, "10.244.2.11:8080") &&
			!strings.Contains(op, "[fd00:244:1::11]:8080") && !strings.Contains(op, "[fd00:244:2::11]:8080") {
			t.Errorf("partial sync touched another real server: %q", op)
		}
	}
	// Four virtual servers per family (ClusterIP and three NodePort
	// addresses... two here: node and bridge) x two protocols each gain
	// pod 3 and lose pod 1.
	var adds, dels int
	for _, op := range got {
		adds += strings.Count(op, "add-rs")
		dels += strings.Count(op, "delete-rs")
	}
	if want := 2 * 2 * 3; adds != want || dels != want {
		t.Errorf("partial sync added %d and deleted %d real servers, want %d each:\n%s", adds, dels, want, strings.Join(got, "\n"))
	}
	// Idle real servers are deleted without a listing; nothing else is
	// read.
	if n.kern.ipvs.reads-reads > 2*2*3 {
		t.Errorf("partial sync listed real servers %d times", n.kern.ipvs.reads-reads)
	}
	// Pods 1 and 3 still serve other Services: no set member changed.
	if got := len(n.kern.ipset.restores); got != restores {
		t.Errorf("partial sync ran ipset restore:\n%s", n.kern.ipset.restores[got-1])
	}
	n.assertLikeFullSync()

	// Nothing changed: nothing is written.
	before = len(n.kern.log)
	n.mustSync(false, buildAll(0, specs...)...)
	if got := n.logSince(before); len(got) != 0 {
		t.Errorf("no-op partial sync changed %v", got)
	}
}

func TestPartialSyncAddAndRemove(t *testing.T) {
	n := newNode(t, 0, nil)
	specs := scaleSpecs(5)
	n.mustSync(true, buildAll(0, specs...)...)
	lb := svcSpec{idx: 13, name: "lb", lbIPs: ext(1, 13), extIPs: ext(0, 13), pods: []int{0, 2}, ranges: []string{"203.0.113.0/24"}}
	n.mustSync(false, append(buildAll(0, specs...), lb.build(0))...)
	n.assertLikeFullSync()

	// Removal: addresses unbound before the virtual servers go.
	before := len(n.kern.log)
	n.mustSync(false, buildAll(0, specs...)...)
	got := n.logSince(before)
	unbind := slices.IndexFunc(got, func(s string) bool { return strings.HasPrefix(s, "link unbind "+vip(13)) })
	del := slices.IndexFunc(got, func(s string) bool { return strings.HasPrefix(s, "ipvs delete TCP "+vip(13)) })
	if unbind < 0 || del < 0 || unbind > del {
		t.Errorf("removal: want the address unbound, then the virtual server deleted:\n%s", strings.Join(got, "\n"))
	}
	n.assertLikeFullSync()
	if d := n.kern.dump(dataplane.IPv4); strings.Contains(d, vip(13)) || strings.Contains(d, extIP(0, 13)) {
		t.Errorf("removed Service left state behind:\n%s", d)
	}
}

func TestAdditionsBeforeBinding(t *testing.T) {
	n := newNode(t, 0, nil)
	n.mustSync(true)
	before := len(n.kern.log)
	n.mustSync(false, flowCases[0].services(0)...)
	got := n.logSince(before)
	addRS := slices.IndexFunc(got, func(s string) bool { return strings.HasPrefix(s, "ipvs add-rs TCP "+vip(0)) })
	bind := slices.IndexFunc(got, func(s string) bool { return s == "link bind "+vip(0) })
	if addRS < 0 || bind < 0 || addRS > bind {
		t.Errorf("want real servers in place before the address is bound:\n%s", strings.Join(got, "\n"))
	}
}

// TestPartialSyncsConverge applies random changes, mostly as partial
// syncs, and checks after each that the kernel is what a full sync of the
// same table gives.
func TestPartialSyncsConverge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, k := range []int{0, 1} {
		t.Run(fmt.Sprintf("node-%d", k), func(t *testing.T) {
			n := newNode(t, k, nil)
			specs := map[int]svcSpec{}
			n.mustSync(true)
			for step := range 300 {
				mutate(rng, specs)
				var services []*pb.Service
				for _, i := range slices.Sorted(mapKeys(specs)) {
					services = append(services, specs[i].build(k))
				}
				if err := n.sync(step%50 == 49, services...); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				n.assertLikeFullSync()
			}
		})
	}
}

// mutate makes one random change: add, remove, or change a Service's
// endpoints, policies, addresses, source ranges or affinity.
func mutate(rng *rand.Rand, specs map[int]svcSpec) {
	i := rng.IntN(8)
	s, ok := specs[i]
	if ok && rng.IntN(6) == 0 {
		delete(specs, i)
		return
	}
	if !ok {
		s = svcSpec{idx: 40 + i, name: fmt.Sprintf("s%d", i)}
	}
	switch rng.IntN(7) {
	case 0:
		s.etpLocal, s.itpLocal = rng.IntN(2) == 0, rng.IntN(2) == 0
	case 1:
		s.lbIPs = nil
		if rng.IntN(2) == 0 {
			s.lbIPs = ext(rng.IntN(2), s.idx)
		}
	case 2:
		s.extIPs = nil
		if rng.IntN(2) == 0 {
			s.extIPs = ext(rng.IntN(2), s.idx+20)
		}
	case 3:
		s.ranges = nil
		if rng.IntN(2) == 0 {
			s.ranges = []string{"203.0.113.0/24", clientIP[rng.IntN(2)] + "/32"}[:1+rng.IntN(2)]
		}
	case 4:
		s.affinity = int32(rng.IntN(2) * 60)
	case 5:
		s.nodePort = !s.nodePort
	}
	s.pods = nil
	for p := range 4 {
		if rng.IntN(2) == 0 {
			s.pods = append(s.pods, p)
		}
	}
	s.noEndpoints = len(s.pods) == 0
	specs[i] = s
}

func TestFullSyncRepairsDrift(t *testing.T) {
	n := newNode(t, 0, func(c *Config) { c.ExcludeCIDRs = []string{"172.16.0.0/12"} })
	services := buildAll(0, scaleSpecs(3)...)
	n.mustSync(true, services...)

	kern := n.kern
	// Someone deletes a virtual server and a real server, adds strays,
	// unbinds an address, binds one of theirs, edits our sets, flushes
	// one of our chains and a built-in one with our jump.
	ours := vsKey{netip.MustParseAddr(clusterIPs(30)[0]), TCP, 80}
	delete(kern.ipvs.vss, ours)
	other := vsKey{netip.MustParseAddr(clusterIPs(31)[0]), UDP, 80}
	for ap := range kern.ipvs.vss[other].dests {
		delete(kern.ipvs.vss[other].dests, ap)
		break
	}
	stray := VirtualServer{Addr: netip.MustParseAddr("10.96.9.9"), Protocol: TCP, Port: 9, Scheduler: "wlc"}
	kern.ipvs.vss[stray.key()] = &fakeVS{vs: stray, dests: map[netip.AddrPort]*RealServer{}}
	protected := VirtualServer{Addr: netip.MustParseAddr("172.17.0.1"), Protocol: TCP, Port: 53, Scheduler: "rr"}
	kern.ipvs.vss[protected.key()] = &fakeVS{vs: protected, dests: map[netip.AddrPort]*RealServer{}}
	link := kern.links.links[DefaultInterface]
	delete(link.addrs, netip.MustParseAddr(clusterIPs(32)[0]))
	link.addrs[netip.MustParseAddr("10.96.8.8")] = true
	kern.ipset.sets["PP-CLUSTER-IP"].members["10.96.7.7,tcp:7"] = true
	delete(kern.ipset.sets["PP-LOOP-BACK"].members, pod(0)+",tcp:8080,"+pod(0))
	delete(kern.ipset.sets, "PP-DROP-INTERNAL")
	kern.iptables[dataplane.IPv4].tables["nat"][chainPostrouting] = nil
	kern.iptables[dataplane.IPv4].tables["nat"]["PREROUTING"] = nil

	// A partial sync trusts its record; a full one looks.
	n.mustSync(false, services...)
	if kern.ipvs.vss[ours] != nil {
		t.Fatalf("a partial sync with nothing changed repaired the kernel; it should not have looked")
	}
	n.mustSync(true, services...)
	if kern.ipvs.vss[protected.key()] == nil {
		t.Errorf("full sync deleted a virtual server in ExcludeCIDRs")
	}
	delete(kern.ipvs.vss, protected.key())
	n.assertLikeFullSync()
}

func TestOtherFamilyAndOtherLinksUntouched(t *testing.T) {
	n := newNode(t, 0, nil)
	n.mustSync(true, flowCases[0].services(0)...)
	// A v6-only change: the IPv4 Dataplane writes nothing.
	before := len(n.kern.log)
	s := flowCases[0].services(0)[0]
	s.ClusterEndpoints[0].Endpoints = slices.DeleteFunc(slices.Clone(s.ClusterEndpoints[0].Endpoints), func(e *pb.Endpoint) bool {
		return e.GetIp() == pod6(3)
	})
	next := dptest.Table(t, testNode(0), s)
	if err := n.dps[dataplane.IPv4].Sync(context.Background(), next, []string{"flows/spread"}, false); err != nil {
		t.Fatal(err)
	}
	if got := n.logSince(before); len(got) != 0 {
		t.Errorf("IPv4 Dataplane changed %v for an IPv6-only change", got)
	}
	if err := n.dps[dataplane.IPv6].Sync(context.Background(), next, []string{"flows/spread"}, false); err != nil {
		t.Fatal(err)
	}
	for _, op := range n.logSince(before) {
		if !strings.Contains(op, "fd00:") && op != "ipset restore" {
			t.Errorf("IPv6 Dataplane did %q", op)
		}
	}
}

func TestGracefulTermination(t *testing.T) {
	n := newNode(t, 0, nil)
	spec := svcSpec{idx: 15, name: "drain", pods: []int{1, 2}}
	n.mustSync(true, spec.build(0))
	tcpVS := vsKey{netip.MustParseAddr(vip(15)), TCP, 80}
	udpVS := vsKey{netip.MustParseAddr(vip(15)), UDP, 80}
	old := netip.MustParseAddrPort(podEP(1, dataplane.IPv4))
	n.kern.ipvs.setConns(tcpVS, old, 2, 1)
	n.kern.ipvs.setConns(udpVS, old, 0, 1)

	spec.pods = []int{2}
	n.mustSync(false, spec.build(0))
	if d := n.kern.ipvs.vss[tcpVS].dests[old]; d == nil || d.Weight != 0 {
		t.Fatalf("TCP real server with connections: got %+v, want kept at weight 0", d)
	}
	if d := n.kern.ipvs.vss[udpVS].dests[old]; d != nil {
		t.Errorf("UDP real server kept (%+v); expire_nodest_conn moves its flows, it should go at once", d)
	}
	if _, _, draining := n.kern.ipvs.count(dataplane.IPv4); draining != 1 {
		t.Errorf("%d real servers draining, want 1", draining)
	}

	// Still busy: a sync with no change leaves it.
	n.mustSync(false, spec.build(0))
	if n.kern.ipvs.vss[tcpVS].dests[old] == nil {
		t.Fatalf("busy real server deleted")
	}
	// Idle: the next sync, partial or not, deletes it.
	n.kern.ipvs.setConns(tcpVS, old, 0, 0)
	n.mustSync(false, spec.build(0))
	if n.kern.ipvs.vss[tcpVS].dests[old] != nil {
		t.Errorf("idle real server not deleted")
	}
	n.assertLikeFullSync()

	// An endpoint that comes back while draining gets its weight back:
	// its connections carry on.
	n.kern.ipvs.setConns(tcpVS, netip.MustParseAddrPort(podEP(2, dataplane.IPv4)), 1, 0)
	spec.pods = []int{3}
	n.mustSync(false, spec.build(0))
	before := len(n.kern.log)
	spec.pods = []int{2, 3}
	n.mustSync(false, spec.build(0))
	want := fmt.Sprintf("ipvs update-rs %s -> %s w1", tcpVS, podEP(2, dataplane.IPv4))
	if got := n.logSince(before); !slices.Contains(got, want) || slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "add-rs "+tcpVS.String()) }) {
		t.Errorf("returning endpoint: got %v, want %q and no re-add", got, want)
	}
	n.assertLikeFullSync()

	// After a restart, a full sync finds a weight-0 real server with
	// connections in the kernel and keeps draining it.
	n.kern.ipvs.setConns(tcpVS, netip.MustParseAddrPort(podEP(2, dataplane.IPv4)), 1, 0)
	spec.pods = []int{3}
	restarted := newNode(t, 0, nil)
	restarted.kern = n.kern
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		restarted.dps[f] = restarted.newDataplane(testConfig(f, 0))
	}
	restarted.mustSync(true, spec.build(0))
	if d := n.kern.ipvs.vss[tcpVS].dests[netip.MustParseAddrPort(podEP(2, dataplane.IPv4))]; d == nil || d.Weight != 0 {
		t.Errorf("after a restart: draining real server %+v, want kept at weight 0", d)
	}
}

func TestFailureForcesFullSync(t *testing.T) {
	n := newNode(t, 0, nil)
	base := buildAll(0, scaleSpecs(3)...)
	n.mustSync(true, base...)

	added := svcSpec{idx: 4, name: "nodeport", nodePort: true, pods: []int{1, 3}}
	n.kern.fail = func(op string) error {
		if strings.HasPrefix(op, "ipvs add-rs TCP "+vip(4)) {
			return syscall.ENOMEM
		}
		return nil
	}
	err := n.dps[dataplane.IPv4].Sync(context.Background(), dptest.Table(t, testNode(0), append(base, added.build(0))...), []string{"flows/nodeport"}, false)
	var ke *KernelError
	if !errors.As(err, &ke) || !IsKernelFailed(err) || ke.Key != "flows/nodeport" || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("Sync error = %v, want a KernelError for flows/nodeport wrapping ENOMEM", err)
	}
	if !strings.Contains(err.Error(), "service flows/nodeport") {
		t.Errorf("error text does not name the Service: %v", err)
	}
	// The others went in regardless: the UDP port's virtual server.
	if n.kern.ipvs.vss[vsKey{netip.MustParseAddr(vip(4)), UDP, 80}] == nil {
		t.Errorf("a failure stopped the other changes")
	}
	if last := n.rec.Last(t); last.Family != dataplane.IPv4 || last.Full || !errors.Is(last.Err, err) || last.Mode != "ipvs" {
		t.Errorf("reported %+v, want the failed partial ipvs IPv4 sync", last)
	}
	if _, _, failed := n.rec.Counts(dataplane.IPv4); failed != 1 {
		t.Errorf("%d failed syncs reported, want 1", failed)
	}
	n.kern.fail = nil

	// The next sync, asked to be partial, runs full and converges.
	restores := len(n.kern.iptables[dataplane.IPv4].restores)
	n.mustSync(false, append(base, added.build(0))...)
	if len(n.kern.iptables[dataplane.IPv4].restores) != restores+1 {
		t.Errorf("the sync after a failure was not full")
	}
	n.assertLikeFullSync()
	if full, partial, _ := n.rec.Counts(dataplane.IPv4); full != 2 || partial != 0 {
		t.Errorf("%d full and %d partial syncs succeeded, want 2 full", full, partial)
	}
}

func TestRestoreFailureNamesTheLine(t *testing.T) {
	n := newNode(t, 0, nil)
	n.kern.fail = func(op string) error {
		if op == "ipset restore" {
			return &xtables.RestoreError{Tool: "ipset restore", Line: 2, Stderr: "ipset v7.17: Error in line 2: Kernel error received: Invalid argument", Err: errors.New("exit status 1")}
		}
		return nil
	}
	err := n.dps[dataplane.IPv4].Sync(context.Background(), dptest.Table(t, testNode(0), flowCases[0].services(0)...), nil, true)
	var re *xtables.RestoreError
	if !xtables.IsRestoreFailed(err) || !errors.As(err, &re) || re.Rule != createLine(dataplane.IPv4, 1) {
		t.Errorf("RestoreError = %+v, want the failing line %q", re, createLine(dataplane.IPv4, 1))
	}
}

func TestRestartAdoptsTheKernel(t *testing.T) {
	n := newNode(t, 0, func(c *Config) { c.TCPTimeout = 15 * time.Minute })
	services := buildAll(0, scaleSpecs(4)...)
	n.mustSync(true, services...)
	// A new agent process: same kernel, new Dataplanes, full sync.
	before := len(n.kern.log)
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		c := testConfig(f, 0)
		c.TCPTimeout = 15 * time.Minute
		n.dps[f] = n.newDataplane(c)
	}
	n.mustSync(true, services...)
	for _, op := range n.logSince(before) {
		switch {
		case op == "ipset restore", strings.HasSuffix(op, "tables restore"), strings.HasPrefix(op, "ipvs timeouts"):
			// Rewritten on every full sync, idempotent.
		default:
			t.Errorf("restart changed %q", op)
		}
	}
}

func TestUpdatesInPlace(t *testing.T) {
	n := newNode(t, 0, nil)
	spec := svcSpec{idx: 8, name: "affinity", pods: allPods}
	n.mustSync(true, spec.build(0))
	spec.affinity = 600
	before := len(n.kern.log)
	n.mustSync(false, spec.build(0))
	want := "ipvs update TCP " + vip(8) + ":80 rr persistent 600"
	if got := n.logSince(before); !slices.Contains(got, want) || slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "ipvs delete") }) {
		t.Errorf("affinity change: got %v, want %q in place", got, want)
	}

	// A restart with another scheduler updates every virtual server in
	// place: none goes away.
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		c := testConfig(f, 0)
		c.Scheduler = "wlc"
		n.dps[f] = n.newDataplane(c)
	}
	before = len(n.kern.log)
	n.mustSync(true, spec.build(0))
	for _, op := range n.logSince(before) {
		if strings.HasPrefix(op, "ipvs") && !strings.HasPrefix(op, "ipvs update ") {
			t.Errorf("scheduler change did %q", op)
		}
	}
	if vs := n.kern.ipvs.vss[vsKey{netip.MustParseAddr(vip(8)), TCP, 80}].vs; vs.Scheduler != "wlc" || vs.Timeout != 600 {
		t.Errorf("virtual server = %+v", vs)
	}
}

func TestNodeAddressChangeForcesFullSync(t *testing.T) {
	n := newNode(t, 0, nil)
	spec := svcSpec{idx: 4, name: "nodeport", nodePort: true, pods: []int{1}}
	n.mustSync(true, spec.build(0))
	n.kern.links.node = append(n.kern.links.node, netip.MustParseAddr("10.0.0.7"))
	restores := len(n.kern.iptables[dataplane.IPv4].restores)
	n.mustSync(false, spec.build(0))
	if n.kern.ipvs.vss[vsKey{netip.MustParseAddr("10.0.0.7"), TCP, uint16(nodePort(4))}] == nil {
		t.Errorf("no NodePort virtual server on the new node address")
	}
	if len(n.kern.iptables[dataplane.IPv4].restores) != restores+1 {
		t.Errorf("a node address change did not make the sync full")
	}
}

func TestNodePortAddresses(t *testing.T) {
	n := newNode(t, 0, func(c *Config) { c.NodePortAddresses = []string{"192.168.100.0/24", "fd00:100::/64"} })
	n.mustSync(true, svcSpec{idx: 4, name: "nodeport", nodePort: true, pods: []int{1}}.build(0))
	for _, a := range []string{nodeIPs[0][0], nodeIPs[0][1]} {
		if n.kern.ipvs.vss[vsKey{netip.MustParseAddr(a), TCP, uint16(nodePort(4))}] == nil {
			t.Errorf("no NodePort on %s", a)
		}
	}
	for _, a := range []string{bridgeIPs[0][0], bridgeIPs[0][1]} {
		if n.kern.ipvs.vss[vsKey{netip.MustParseAddr(a), TCP, uint16(nodePort(4))}] != nil {
			t.Errorf("NodePort on %s, outside nodePortAddresses", a)
		}
	}
}

func TestPrepare(t *testing.T) {
	n := newNode(t, 0, func(c *Config) { c.TCPTimeout, c.UDPTimeout = 900*time.Second, 5*time.Second })
	n.mustSync(true)
	if got := n.kern.ipvs.timeouts; got != [3]time.Duration{900 * time.Second, 0, 5 * time.Second} {
		t.Errorf("timeouts = %v", got)
	}
	if l := n.kern.links.links[DefaultInterface]; l == nil || !l.up {
		t.Errorf("link %s = %+v, want created and up", DefaultInterface, l)
	}
	for id := range numSets {
		for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			if n.kern.ipset.sets[setName(f, id)] == nil {
				t.Errorf("set %s not created", setName(f, id))
			}
		}
	}

	// No timeouts configured: the kernel's are left alone.
	m := newNode(t, 0, nil)
	m.mustSync(true)
	if slices.ContainsFunc(m.kern.log, func(s string) bool { return strings.HasPrefix(s, "ipvs timeouts") }) {
		t.Errorf("timeouts set although none was configured")
	}
}

func TestNoDummyLink(t *testing.T) {
	n := newNode(t, 0, nil)
	n.kern.links.noDummy = true
	err := n.dps[dataplane.IPv4].Sync(context.Background(), dptest.Table(t, testNode(0)), nil, true)
	if !IsDummyUnavailable(err) || !strings.Contains(err.Error(), "the kernel has no dummy link type (dummy module / CONFIG_DUMMY)") {
		t.Errorf("Sync error = %v, want one naming the missing dummy link type", err)
	}
}

// TestSyncsObserved checks what the Driver reports of each sync, and
// what a full and a partial sync of one Service leave.
func TestSyncsObserved(t *testing.T) {
	n := newNode(t, 0, nil)
	n.mustSync(true, flowCases[0].services(0)...)
	n.mustSync(false, flowCases[0].services(0)...)
	if full, partial, failed := n.rec.Counts(dataplane.IPv4); full != 1 || partial != 1 || failed != 0 {
		t.Errorf("%d full, %d partial and %d failed syncs reported, want one full and one partial", full, partial, failed)
	}
	for _, r := range n.rec.Results {
		if r.Mode != "ipvs" || r.Took <= 0 {
			t.Errorf("reported %+v, want mode ipvs and a duration", r)
		}
	}
	d := n.dps[dataplane.IPv4]
	if d.b.tools.Backend() != xtables.BackendNFT || len(d.b.plans) != 1 {
		t.Errorf("backend %q and %d Services planned, want nft and 1", d.b.tools.Backend(), len(d.b.plans))
	}
	// ClusterIP TCP and UDP, four real servers each.
	if vss, rss, draining := n.kern.ipvs.count(dataplane.IPv4); vss != 2 || rss != 8 || draining != 0 {
		t.Errorf("%d virtual servers, %d real servers, %d draining; want 2, 8, 0", vss, rss, draining)
	}
}

// TestCleanup checks --cleanup's part in IPVS mode: after it no virtual
// server, service address, PP- chain, jump or set of either family is
// left, excluded virtual servers stay, a second run finds nothing to do,
// and a sync afterwards programs everything again.
func TestCleanup(t *testing.T) {
	n := newNode(t, 0, func(c *Config) { c.ExcludeCIDRs = []string{"10.200.0.0/16"} })
	services := flowCases[0].services(0)
	n.mustSync(true, services...)
	other := VirtualServer{Addr: netip.MustParseAddr("10.200.0.1"), Port: 80, Protocol: TCP, Scheduler: "rr"}
	if err := n.kern.ipvs.AddVirtualServer(other); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			if err := n.dps[f].Cleanup(context.Background()); err != nil {
				t.Fatalf("%v Cleanup: %v", f, err)
			}
		}
		for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			if vss, _, _ := n.kern.ipvs.count(f); f == dataplane.IPv4 && vss != 1 || f == dataplane.IPv6 && vss != 0 {
				t.Errorf("%v: %d virtual servers left, want only the excluded one", f, vss)
			}
			if addrs, _ := n.kern.links.LinkAddrs(DefaultInterface, f); len(addrs) != 0 {
				t.Errorf("%v: addresses %v left on %s", f, addrs, DefaultInterface)
			}
			for _, table := range []string{"nat", "filter"} {
				if dump := n.kern.iptables[f].dump(table); strings.Contains(dump, "PP-") {
					t.Errorf("%v %s still holds proxyplane's rules:\n%s", f, table, dump)
				}
			}
			if dump := n.kern.ipset.dump(f); dump != "" {
				t.Errorf("%v sets left:\n%s", f, dump)
			}
		}
	}
	n.mustSync(false, services...) // the Driver forgot: this sync is full
	if vss, rss, _ := n.kern.ipvs.count(dataplane.IPv4); vss != 3 || rss != 8 {
		t.Errorf("after a sync: %d virtual servers, %d real servers; want the excluded one and 2 with 8", vss, rss)
	}
}

// TestSysctlsCheckedNeverWritten: the agent's /proc/sys is read-only, so
// the sysctls IPVS needs are the init container's to set; a full sync
// reads them, warns once of each wrong one (until it is right again), and
// still programs the Services.
func TestSysctlsCheckedNeverWritten(t *testing.T) {
	var logs bytes.Buffer
	n := newNode(t, 0, func(c *Config) { c.Log = slog.New(slog.NewTextHandler(&logs, nil)) })
	// No init container ran: one sysctl missing (no ip_vs module yet),
	// one wrong.
	delete(n.kern.sysctl.values, "net/ipv4/ip_forward")
	n.kern.sysctl.values["net/ipv4/vs/conntrack"] = 0
	warned := func() map[string]int {
		got := map[string]int{}
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "level=WARN") {
				_, rest, _ := strings.Cut(line, "sysctl=")
				name, _, _ := strings.Cut(rest, " ")
				got[name]++
			}
		}
		return got
	}

	n.mustSync(true, svcSpec{idx: 1, name: "web", pods: []int{1}}.build(0))
	if n.kern.ipvs.vss[vsKey{netip.MustParseAddr(clusterIPs(1)[0]), TCP, 80}] == nil {
		t.Error("the full sync programmed no virtual server")
	}
	// Both families' dataplanes check net/ipv4/vs; ip_forward is IPv4's.
	want := map[string]int{"net/ipv4/vs/conntrack": 2, "net/ipv4/ip_forward": 1}
	if got := warned(); !maps.Equal(got, want) {
		t.Errorf("warnings by sysctl = %v, want %v:\n%s", got, want, logs.String())
	}
	if got, ok := n.kern.sysctl.values["net/ipv4/ip_forward"]; ok || n.kern.sysctl.values["net/ipv4/vs/conntrack"] != 0 {
		t.Errorf("sysctls changed: ip_forward = %d (set %v), vs/conntrack = %d", got, ok, n.kern.sysctl.values["net/ipv4/vs/conntrack"])
	}

	// Still wrong: no second warning. The checks are reads of every
	// sysctl, at each full sync only.
	reads := n.kern.sysctl.reads
	n.mustSync(true, svcSpec{idx: 1, name: "web", pods: []int{1}}.build(0))
	if got := warned(); !maps.Equal(got, want) {
		t.Errorf("a second full sync warned again: %v", got)
	}
	if got, want := n.kern.sysctl.reads-reads, len(Sysctls(dataplane.IPv4))+len(Sysctls(dataplane.IPv6)); got != want {
		t.Errorf("a full sync read %d sysctls, want %d", got, want)
	}
	reads = n.kern.sysctl.reads
	n.mustSync(false, svcSpec{idx: 1, name: "web", pods: []int{2}}.build(0))
	if n.kern.sysctl.reads != reads {
		t.Error("a partial sync read sysctls")
	}

	// Fixed, then broken again: warned again.
	n.kern.sysctl.values["net/ipv4/vs/conntrack"] = 1
	n.mustSync(true, svcSpec{idx: 1, name: "web", pods: []int{1}}.build(0))
	n.kern.sysctl.values["net/ipv4/vs/conntrack"] = 0
	n.mustSync(true, svcSpec{idx: 1, name: "web", pods: []int{1}}.build(0))
	if got := warned()["net/ipv4/vs/conntrack"]; got != 4 {
		t.Errorf("vs/conntrack warned %d times over two episodes, want 4 (2 families x 2)", got)
	}
}
