package iptables

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// syncer drives a Dataplane over a fake kernel through a series of tables,
// computing the changed keys the way proxytable.Apply reports them.
type syncer struct {
	t    *testing.T
	cfg  Config
	f    *fakeRunner
	d    *Dataplane
	prev *proxytable.Table
	// rec has the syncs the Driver reported, in order.
	rec dptest.Recorder
}

func newSyncer(t *testing.T, cfg Config) *syncer {
	t.Helper()
	s := &syncer{t: t, cfg: cfg, f: newFakeRunner(), prev: proxytable.Empty()}
	s.d = newTestDataplane(cfg, s.f, s.rec.Observe)
	return s
}

// sync programs services, fully or as a delta from the previous table,
// and returns the restore input written ("" for none) and the error.
func (s *syncer) sync(full bool, services ...*pb.Service) (string, error) {
	s.t.Helper()
	return s.syncNode(full, dptest.Node(), services...)
}

func (s *syncer) syncNode(full bool, node *pb.NodeInfo, services ...*pb.Service) (string, error) {
	s.t.Helper()
	next := dptest.Table(s.t, node, services...)
	changed := dptest.ChangedKeys(s.prev, next)
	n := len(s.f.restores)
	err := s.d.Sync(context.Background(), next, changed, full)
	if err == nil {
		s.prev = next
	}
	if len(s.f.restores) == n {
		return "", err
	}
	return s.f.restores[len(s.f.restores)-1].data, err
}

// mustSync is sync that fails the test on error.
func (s *syncer) mustSync(full bool, services ...*pb.Service) string {
	s.t.Helper()
	data, err := s.sync(full, services...)
	if err != nil {
		s.t.Fatalf("Sync(full=%v): %v", full, err)
	}
	return data
}

// assertKernelLikeFullSync checks that the fake kernel holds exactly what a
// full sync of the current table into an empty kernel gives: partial
// syncs must converge to the same ruleset.
func (s *syncer) assertKernelLikeFullSync() {
	s.t.Helper()
	ref := newFakeRunner()
	d := newTestDataplane(s.cfg, ref, nil)
	if err := d.Sync(context.Background(), s.prev, nil, true); err != nil {
		s.t.Fatalf("reference Sync: %v", err)
	}
	for _, table := range []string{"nat", "filter"} {
		if got, want := s.f.kernel.dump(table), ref.kernel.dump(table); got != want {
			s.t.Fatalf("%s table differs from a full sync of the same table:\n%s", table, dptest.LineDiff(want, got))
		}
	}
}

func declares(data, chain string) bool { return strings.Contains(data, "\n:"+chain+" - [0:0]\n") }

func TestPartialSyncEndpointChangeWritesOnlyThatService(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	others := dptest.ScaleServices(20, 2)
	web := dptest.ClusterIPTwoEndpoints()
	s.mustSync(true, append(others, web)...)

	// One endpoint replaced: the dispatch rules stay the same.
	web2 := dptest.ClusterIPTwoEndpoints()
	web2.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.LocalEP+":8080", dptest.RemoteEP2+":8080")}
	data := s.mustSync(false, append(others, web2)...)

	svcChain := prefixSvc + portHash("ns/web:http", "tcp")
	oldSep := sepChain("ns/web:http", "tcp", dptest.RemoteEP+":8080")
	newSep := sepChain("ns/web:http", "tcp", dptest.RemoteEP2+":8080")
	keptSep := sepChain("ns/web:http", "tcp", dptest.LocalEP+":8080")
	for _, c := range []string{svcChain, newSep, keptSep} {
		if !declares(data, c) {
			t.Errorf("partial sync does not rewrite %s:\n%s", c, data)
		}
	}
	if !strings.Contains(data, "\n-X "+oldSep+"\n") {
		t.Errorf("partial sync does not delete the removed endpoint's %s:\n%s", oldSep, data)
	}
	if declares(data, chainServices) || strings.Contains(data, "*filter") {
		t.Errorf("endpoint-only change rewrote the dispatch chains or the filter table:\n%s", data)
	}
	if strings.Contains(data, "ns/svc-") {
		t.Errorf("partial sync wrote unchanged services:\n%s", data)
	}
	if n := len(s.f.saves); n != 1 {
		t.Errorf("iptables-save ran %d times, want once (first full sync only)", n)
	}
	s.assertKernelLikeFullSync()
}

func TestPartialSyncAddAndRemove(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	others := dptest.ScaleServices(5, 2)
	s.mustSync(true, others...)

	// Add: dispatch rewritten, only the new service's chains written.
	data := s.mustSync(false, append(others, dptest.NodePortService())...)
	if declares(data, chainServices) || !strings.Contains(data, "\n-I PP-SERVICES 1 ") || !strings.Contains(data, "\n-A PP-NODEPORTS ") {
		t.Errorf("adding a service did not edit the dispatch chains in place:\n%s", data)
	}
	if strings.Contains(data, ":PP-SVC-"+portHash("ns/svc-0:http", "tcp")) {
		t.Errorf("adding a service rewrote another service's chains:\n%s", data)
	}
	if declares(data, chainPostrouting) {
		t.Errorf("partial sync rewrote PP-POSTROUTING:\n%s", data)
	}
	s.assertKernelLikeFullSync()

	// Remove: its chains are flushed and deleted.
	data = s.mustSync(false, others...)
	if !strings.Contains(data, "\n-D PP-SERVICES ") || !strings.Contains(data, "\n-D PP-NODEPORTS ") {
		t.Errorf("removal did not delete the service's dispatch rules:\n%s", data)
	}
	np := portHash("ns/np", "tcp")
	for _, c := range []string{prefixSvc + np, prefixExt + np, sepChain("ns/np", "tcp", dptest.LocalEP+":8080"), sepChain("ns/np", "tcp", dptest.RemoteEP+":8080")} {
		if !strings.Contains(data, "\n-X "+c+"\n") || !declares(data, c) {
			t.Errorf("removal does not flush and delete %s:\n%s", c, data)
		}
	}
	s.assertKernelLikeFullSync()
	if got := s.f.kernel.dump("nat"); strings.Contains(got, np) {
		t.Errorf("removed service's chains still in the kernel:\n%s", got)
	}
}

func TestPartialSyncLosingEndpointsRewritesFilter(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.ClusterIPTwoEndpoints(), dptest.NodePortService())
	gone := dptest.ClusterIPTwoEndpoints()
	gone.Ports[0].HasEndpoints = false
	gone.ClusterEndpoints = nil
	data := s.mustSync(false, gone, dptest.NodePortService())
	if !strings.Contains(data, "*filter") || !strings.Contains(data, "-j REJECT") {
		t.Errorf("service losing its endpoints did not get a REJECT:\n%s", data)
	}
	s.assertKernelLikeFullSync()
}

func TestPartialSyncOtherFamilyChangeWritesNothing(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.DualStackService())
	v6changed := dptest.DualStackService()
	v6changed.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", dptest.LocalEP+":8080", "[fd00:244:3::10]:8080")}
	data, err := s.sync(false, v6changed)
	if err != nil {
		t.Fatal(err)
	}
	if data != "" {
		t.Errorf("an IPv6-only change made the IPv4 dataplane restore:\n%s", data)
	}
}

func TestFullSyncPrunesStaleChains(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	// Leftovers of an earlier process, and chains that are not ours.
	if _, err := s.f.kernel.apply("*nat\n:PP-SVC-OLDOLDOLDOLDOLD1 - [0:0]\n:PP-SEP-OLDOLDOLDOLDOLD1 - [0:0]\n" +
		":KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n:CNI-HOSTPORT - [0:0]\n-A PP-SVC-OLDOLDOLDOLDOLD1 -j PP-SEP-OLDOLDOLDOLDOLD1\nCOMMIT\n"); err != nil {
		t.Fatal(err)
	}
	data := s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	for _, c := range []string{"PP-SVC-OLDOLDOLDOLDOLD1", "PP-SEP-OLDOLDOLDOLDOLD1"} {
		if !strings.Contains(data, "\n-X "+c+"\n") {
			t.Errorf("first full sync does not delete leftover %s:\n%s", c, data)
		}
	}
	nat := s.f.kernel.save("nat")
	if !strings.Contains(nat, ":KUBE-SVC-XPGD46QRK7WJZT7O") || !strings.Contains(nat, ":CNI-HOSTPORT") {
		t.Errorf("full sync deleted chains it does not own:\n%s", nat)
	}

	// A later full sync prunes what an earlier one wrote, from memory.
	data = s.mustSync(true, dptest.NodePortService())
	web := portHash("ns/web:http", "tcp")
	if !strings.Contains(data, "\n-X "+prefixSvc+web+"\n") {
		t.Errorf("full sync does not delete the removed service's chain:\n%s", data)
	}
	if n := len(s.f.saves); n != 1 {
		t.Errorf("iptables-save ran %d times, want once", n)
	}
	s.assertKernelLikeFullSync()
}

func TestFailedRestoreForcesFullSync(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	base := dptest.ScaleServices(3, 2)
	s.mustSync(true, base...)

	// A partial sync adding a service fails after the nat table
	// committed (only filter refused), the worst case: nat holds new
	// chains the Dataplane does not record.
	s.f.failRestore = func(data string) error {
		nat, _, _ := strings.Cut(data, "*filter")
		if _, err := s.f.kernel.apply(nat); err != nil {
			t.Fatalf("applying nat: %v", err)
		}
		return &xtables.RestoreError{Tool: "fake", Line: strings.Count(nat, "\n") + 2, Err: errors.New("exit status 1")}
	}
	_, err := s.sync(false, append(base, dptest.NodePortService(), dptest.NoEndpointsService())...)
	if !xtables.IsRestoreFailed(err) {
		t.Fatalf("Sync error = %v, want a RestoreError", err)
	}
	if last := s.rec.Last(t); last.Full || !errors.Is(last.Err, err) || last.Mode != "iptables" || last.Family != dataplane.IPv4 {
		t.Errorf("reported %+v, want the failed partial iptables IPv4 sync", last)
	}
	if _, _, failed := s.rec.Counts(0); failed != 1 {
		t.Errorf("%d failed syncs reported, want 1", failed)
	}
	s.f.failRestore = nil

	// The next call is partial but must run as full, and converge even
	// though the kernel holds chains of a table that never succeeded.
	data := s.mustSync(false, base...)
	if !declares(data, chainPostrouting) {
		t.Errorf("sync after a failure was not full:\n%s", data)
	}
	s.assertKernelLikeFullSync()
	if got := s.f.kernel.dump("nat"); strings.Contains(got, portHash("ns/np", "tcp")) {
		t.Errorf("chains of the failed sync survive:\n%s", got)
	}
	if n := len(s.f.saves); n != 2 {
		t.Errorf("iptables-save ran %d times, want twice: the failure made the kernel unknown", n)
	}
	if full, partial, _ := s.rec.Counts(0); full != 2 || partial != 0 {
		t.Errorf("%d full and %d partial syncs succeeded, want 2 full", full, partial)
	}
}

func TestRestoreErrorNamesService(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.f.failRestore = func(data string) error {
		for i, line := range strings.Split(data, "\n") {
			if strings.Contains(line, "DNAT") && strings.Contains(line, "ns/np") {
				return &xtables.RestoreError{Tool: "fake", Line: i + 1, Stderr: "iptables-restore: line failed", Err: errors.New("exit status 2")}
			}
		}
		return nil
	}
	_, err := s.sync(true, dptest.ClusterIPTwoEndpoints(), dptest.NodePortService())
	var re *xtables.RestoreError
	if !errors.As(err, &re) {
		t.Fatalf("Sync error = %v, want a RestoreError", err)
	}
	if re.Key != "ns/np" || !strings.Contains(re.Rule, "DNAT") || !s.rec.Results[0].Full {
		t.Errorf("RestoreError = %+v (sync %+v), want key ns/np, the DNAT rule, full", re, s.rec.Results[0])
	}
	if !strings.Contains(err.Error(), "service ns/np") {
		t.Errorf("error text does not name the service: %v", err)
	}
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
	data, err := s.syncNode(false, node, dptest.ClusterIPTwoEndpoints())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(data, "! -s 10.244.9.0/24 -j PP-MARK-MASQ") || !declares(data, chainPostrouting) {
		t.Errorf("pod CIDR change did not rewrite everything:\n%s", data)
	}
	s.assertKernelLikeFullSync()
}

func TestJumpsEnsured(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if s.f.ensured != len(jumps) {
		t.Errorf("ensured %d jumps, want %d", s.f.ensured, len(jumps))
	}
	nat := s.f.kernel.tables["nat"]
	if got := nat.chains["PREROUTING"]; len(got) != 1 || dptest.RuleTarget(got[0]) != chainServices {
		t.Errorf("nat PREROUTING = %q", got)
	}
	// Idempotent: a second full sync adds nothing.
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if got := nat.chains["PREROUTING"]; len(s.f.kernel.tables["nat"].chains["PREROUTING"]) != 1 {
		t.Errorf("nat PREROUTING after two syncs = %q", got)
	}
	// Partial syncs leave jumps alone.
	n := s.f.ensured
	s.mustSync(false, dptest.NodePortService())
	if s.f.ensured != n {
		t.Errorf("partial sync ensured jumps")
	}
}

// TestPartialSyncsConverge applies random changes as partial syncs and
// checks after each that the kernel is what a full sync would give.
func TestPartialSyncsConverge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, family := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		t.Run(family.String(), func(t *testing.T) {
			s := newSyncer(t, testConfig(family))
			s.mustSync(true)
			dptest.Converge(t, rng, func(full bool, services ...*pb.Service) error {
				_, err := s.sync(full, services...)
				return err
			}, s.assertKernelLikeFullSync)
		})
	}
}

// TestJumpsRepaired checks that full syncs re-assert the jumps inside the
// restore and, when one was removed behind our back (a firewall reload
// flushing PREROUTING), fall back to installing them one by one.
func TestJumpsRepaired(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	n := s.f.ensured
	data := s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if !strings.Contains(data, "\n-D PREROUTING ") || !strings.Contains(data, "\n-I PREROUTING 1 ") {
		t.Fatalf("full sync does not re-assert the jumps in the restore:\n%s", data)
	}
	if s.f.ensured != n {
		t.Errorf("jumps checked one by one although known to be installed")
	}

	s.f.kernel.tables["nat"].chains["PREROUTING"] = nil // flushed by someone
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if got := s.f.kernel.tables["nat"].chains["PREROUTING"]; len(got) != 1 || dptest.RuleTarget(got[0]) != chainServices {
		t.Fatalf("PREROUTING after repair = %q", got)
	}
	if s.f.ensured != n+len(jumps) {
		t.Errorf("ensured %d jumps during the repair, want %d", s.f.ensured-n, len(jumps))
	}
	for _, c := range []string{"OUTPUT", "POSTROUTING"} {
		if got := s.f.kernel.tables["nat"].chains[c]; len(got) != 1 {
			t.Errorf("nat %s after repair = %q, want one jump", c, got)
		}
	}
	s.assertKernelLikeFullSync()
}

// restoreRuleCounts counts, per table, the rules restore input adds to our
// chains ("-A PP-" and "-I PP-" lines), leaving out the jumps from the
// built-in chains, which kube-proxy does not count either.
func restoreRuleCounts(data string) map[string]int {
	out := map[string]int{}
	table := ""
	for _, line := range strings.Split(data, "\n") {
		if name, ok := strings.CutPrefix(line, "*"); ok {
			table = name
			continue
		}
		if strings.HasPrefix(line, "-A PP-") || strings.HasPrefix(line, "-I PP-") {
			out[table]++
		}
	}
	return out
}

// kernelRuleCounts counts the rules in our chains of the fake kernel.
func kernelRuleCounts(k *fakeKernel) map[string]int {
	out := map[string]int{}
	for _, table := range []string{"nat", "filter"} {
		for c, rules := range k.tables[table].chains {
			if strings.HasPrefix(c, "PP-") {
				out[table] += len(rules)
			}
		}
	}
	return out
}

// TestRuleCounts checks the counts behind kube-proxy's
// sync_proxy_rules_iptables_total and _last: what a sync wrote is the
// rules in its restore input; the total is what the kernel holds in our
// chains, partial syncs' untouched chains included.
func TestRuleCounts(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	check := func(step, data string, wantFull bool) {
		t.Helper()
		res := s.rec.Last(t)
		if res.Full != wantFull {
			t.Fatalf("%s: sync full = %v, want %v", step, res.Full, wantFull)
		}
		got := map[string]dataplane.TableRules{}
		for _, r := range res.Rules {
			got[r.Table] = r
		}
		written, total := restoreRuleCounts(data), kernelRuleCounts(s.f.kernel)
		for _, table := range []string{"nat", "filter"} {
			if got[table].Written != written[table] || got[table].Total != total[table] {
				t.Errorf("%s: %s rules written %d, total %d; want %d (restore input), %d (kernel)",
					step, table, got[table].Written, got[table].Total, written[table], total[table])
			}
		}
		if len(res.Rules) != 2 {
			t.Errorf("%s: counts for %d tables, want nat and filter", step, len(res.Rules))
		}
	}

	services := append(dptest.CaseServices(), dptest.ScaleServices(5, 2)...)
	data := s.mustSync(true, services...)
	check("first full sync", data, true)

	// An endpoint change: only that Service's chains are written, but the
	// total still counts every other Service's rules.
	services[len(services)-1] = dptest.EndpointChange(services[len(services)-1], 0)
	data = s.mustSync(false, services...)
	check("endpoint change", data, false)
	if w := restoreRuleCounts(data); w["nat"] == 0 || w["filter"] != 0 {
		t.Fatalf("endpoint change wrote %v, want some nat rules and no filter rule", w)
	}

	// A Service removed, one added and one without endpoints added: the
	// dispatch chains are edited in place and the filter table rewritten.
	rejected := dptest.Svc("ns", "rejected", "10.96.9.9")
	rejected.Ports = []*pb.ServicePort{dptest.Port("http", dptest.TCP, 80, 0, false)}
	services = append(services[1:], dptest.ScaleServices(6, 2)[5], rejected)
	data = s.mustSync(false, services...)
	check("services added and removed", data, false)
	if !strings.Contains(data, "\n-I "+chainServices+" 1 ") || !strings.Contains(data, "\n*filter\n") {
		t.Fatalf("the partial sync did not insert dispatch rules and rewrite the filter table, which this test means to count:\n%s", data)
	}

	// Full syncs once the jumps are in re-assert them in the restore:
	// they are not counted.
	data = s.mustSync(true, services...)
	check("second full sync", data, true)
	if !strings.Contains(data, "-I PREROUTING") {
		t.Fatalf("second full sync did not re-assert the jumps, which this test means to leave out:\n%s", data)
	}
}
