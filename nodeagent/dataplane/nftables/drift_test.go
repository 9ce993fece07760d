package nftables

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// driftServices are what the drift tests program: ns/web (ClusterIP
// 10.96.0.10, TCP 80) and ns/np (NodePort).
func driftServices() []*pb.Service {
	return []*pb.Service{dptest.ClusterIPTwoEndpoints(), dptest.NodePortService()}
}

// webServiceChain is ns/web's service chain.
var webServiceChain = prefixClusterPolicyChain + portNameBase("ns/web", "tcp", "http")

// webElement is ns/web's element in service-ips.
var webElement = elemKey{addr: mustAddr("10.96.0.10"), proto: protoTCP, port: 80}

// tampering is a change to the table behind the Dataplane's back, as an
// operator's nft command would make it (TestKernelDrift makes the first
// four with nft).
type tampering struct {
	name   string
	change func(t **fakeTable)
	// trips is set when a full sync from memory fails on it: such a sync
	// flushes the chains and maps it believes exist, and refills rules
	// and elements anyway.
	trips bool
	// endpointMaps programs every service port's endpoints as a map
	// (Config.EndpointMapMin 1), for tamperings with one.
	endpointMaps bool
}

// webEndpointsMap is ns/web's endpoint map, with endpointMaps.
var webEndpointsMap = prefixEndpointsMap + portNameBase("ns/web", "tcp", "http")

// webHairpin is ns/web's local endpoint's element in the hairpin set.
var webHairpin = elemKey{addr: mustAddr(dptest.LocalEP), proto: protoTCP, port: 8080}

var tamperings = []tampering{
	{name: "table deleted", trips: true, change: func(t **fakeTable) { *t = nil }},
	{name: "service chain deleted", trips: true, change: func(t **fakeTable) {
		// The kernel deletes only an unreferenced chain: its map
		// element goes first.
		delete((*t).sets[mapServiceIPs].elems, webElement)
		delete((*t).chains, webServiceChain)
	}},
	{name: "map element deleted", change: func(t **fakeTable) {
		delete((*t).sets[mapServiceIPs].elems, webElement)
	}},
	{name: "base chain rule deleted", change: func(t **fakeTable) {
		(*t).chains[chainNATPrerouting].rules = nil
	}},
	{name: "hairpin element deleted", change: func(t **fakeTable) {
		delete((*t).sets[setHairpin].elems, webHairpin)
	}},
	{name: "hairpin set deleted", trips: true, change: func(t **fakeTable) {
		// The kernel deletes only an unreferenced set: its rule goes
		// first.
		(*t).chains[chainMasquerading].rules = nil
		delete((*t).sets, setHairpin)
	}},
	{name: "endpoint map element deleted", endpointMaps: true, change: func(t **fakeTable) {
		delete((*t).sets[webEndpointsMap].elems, elemKey{index: 0})
	}},
	{name: "endpoint map deleted", endpointMaps: true, trips: true, change: func(t **fakeTable) {
		(*t).chains[webServiceChain].rules = nil
		delete((*t).sets, webEndpointsMap)
	}},
}

// driftConfig is the configuration tt's syncs run with.
func driftConfig(tt tampering) Config {
	cfg := testConfig(dataplane.IPv4)
	if tt.endpointMaps {
		cfg.EndpointMapMin = 1
	}
	return cfg
}

// TestDriftRepairedByNextFullSync tampers with the table after a good sync
// and checks that the next full sync (the agent's periodic one) repairs
// it at once: the generation changed, so the table is listed; when the
// listing differs from memory the sync is reported drifted and rewrites
// the table from the listing. Without the check, a full sync from memory
// fails on a missing chain or table, and only the one after it, from a
// listing, repairs.
func TestDriftRepairedByNextFullSync(t *testing.T) {
	for _, tt := range tamperings {
		t.Run(tt.name, func(t *testing.T) {
			s := newSyncer(t, driftConfig(tt))
			s.mustSync(true, driftServices()...)
			want := s.k.dump()
			s.k.commitBehind(tt.change)
			if s.k.dump() == want {
				t.Fatal("the tampering changed nothing")
			}
			lists := s.k.lists
			s.mustSync(true, driftServices()...)
			if got := s.rec.Last(t); got.Drifted != tt.trips {
				t.Errorf("sync reported Drifted=%v, want %v", got.Drifted, tt.trips)
			}
			// One listing confirms; drift makes the full sync list again.
			wantLists := lists + 1
			if tt.trips {
				wantLists++
			}
			if s.k.lists != wantLists {
				t.Errorf("listed %d times, want %d", s.k.lists-lists, wantLists-lists)
			}
			if got := s.k.dump(); got != want {
				t.Errorf("the full sync did not repair the table:\n%s", dptest.LineDiff(want, got))
			}
			// Trusted again: the next full sync neither lists nor drifts.
			lists = s.k.lists
			s.mustSync(true, driftServices()...)
			if s.k.lists != lists || s.rec.Last(t).Drifted {
				t.Errorf("the full sync after the repair listed or drifted")
			}
		})
		t.Run(tt.name+"/without the check", func(t *testing.T) {
			s := newSyncer(t, driftConfig(tt))
			s.d = withoutDriftCheck(s.d, s.rec.Observe)
			s.mustSync(true, driftServices()...)
			want := s.k.dump()
			s.k.commitBehind(tt.change)
			_, err := s.sync(true, driftServices()...)
			if (err != nil) != tt.trips {
				t.Fatalf("full sync from memory: %v; want failing %v", err, tt.trips)
			}
			if err != nil {
				if !errors.Is(err, syscall.ENOENT) {
					t.Errorf("error %v, want ENOENT", err)
				}
				s.mustSync(true, driftServices()...)
			}
			if got := s.k.dump(); got != want {
				t.Errorf("the full syncs did not repair the table:\n%s", dptest.LineDiff(want, got))
			}
		})
	}
}

// TestNoDriftNoListing checks that while nobody else commits, full syncs
// trust memory: no listing, no drift, no recreated base chains.
func TestNoDriftNoListing(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, driftServices()...)
	s.mustSync(false, dptest.ClusterIPTwoEndpoints())
	s.mustSync(false, driftServices()...)
	data := s.mustSync(true, driftServices()...)
	if s.k.lists != 1 {
		t.Errorf("listed %d times, want once (the first sync)", s.k.lists)
	}
	if strings.Contains(data, "delete chain ip proxyplane "+chainNATPrerouting) {
		t.Errorf("the full sync recreated the base chains:\n%s", data)
	}
	for _, res := range s.rec.Results {
		if res.Drifted || res.Err != nil {
			t.Errorf("sync %+v", res)
		}
	}
	s.assertKernelLikeFullSync()
}

// TestOtherCommitsConfirmedByListing checks that another program's commit
// (one that leaves our table alone) costs one listing and nothing else:
// no drift reported, the table not recreated, and trust restored.
func TestOtherCommitsConfirmedByListing(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, driftServices()...)
	s.k.commitBehind(func(**fakeTable) {})
	data := s.mustSync(true, driftServices()...)
	if s.k.lists != 2 || s.rec.Last(t).Drifted {
		t.Errorf("listed %d times, drifted %v; want a second listing and no drift", s.k.lists, s.rec.Last(t).Drifted)
	}
	if strings.Contains(data, "delete chain ip proxyplane "+chainNATPrerouting) {
		t.Errorf("a confirmed table was recreated:\n%s", data)
	}
	s.mustSync(true, driftServices()...)
	if s.k.lists != 2 {
		t.Errorf("listed again (%d) with no other commit", s.k.lists)
	}
}

// TestCommitAroundPartialSyncNotMissed checks that a partial sync does not
// vouch for a table someone changed since our last commit, even though
// the partial sync itself succeeds: the generation after it is not the one
// after ours, so the next full sync lists. Both when the other commit
// came between syncs and when it came just before ours.
func TestCommitAroundPartialSyncNotMissed(t *testing.T) {
	chainGone := tamperings[1]
	for _, just := range []bool{false, true} {
		name := map[bool]string{false: "between syncs", true: "just before ours"}[just]
		t.Run(name, func(t *testing.T) {
			s := newSyncer(t, testConfig(dataplane.IPv4))
			s.mustSync(true, dptest.ClusterIPTwoEndpoints())
			if just {
				s.k.fail = func(*transaction) error {
					s.k.commitBehind(chainGone.change)
					s.k.fail = nil
					return nil
				}
			} else {
				s.k.commitBehind(chainGone.change)
			}
			// The partial sync touches only ns/np: it succeeds.
			s.mustSync(false, driftServices()...)
			s.mustSync(true, driftServices()...)
			if !s.rec.Last(t).Drifted {
				t.Errorf("the full sync did not notice the deleted chain")
			}
			s.assertKernelLikeFullSync()
		})
	}
}

// TestDriftCheckErrorRereadsTheKernel checks that when the generation
// cannot be read, the full sync lists the table instead of trusting
// memory, and that the failed check is not reported as a repair.
func TestDriftCheckErrorRereadsTheKernel(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, driftServices()...)
	s.k.commitBehind(tamperings[0].change)
	s.k.genErr = &SocketError{Op: "getting the ruleset generation", Err: syscall.EIO}
	s.mustSync(true, driftServices()...)
	if last := s.rec.Last(t); last.Drifted || !strings.Contains(last.DriftDetail, "drift check failed") || s.k.lists != 2 {
		t.Errorf("drifted %v (%q), listed %d times; want no repair reported, why, and a second listing", last.Drifted, last.DriftDetail, s.k.lists)
	}
	s.assertKernelLikeFullSync()
	// Still unable to read the generation: every full sync lists.
	s.mustSync(true, driftServices()...)
	if s.k.lists != 3 {
		t.Errorf("listed %d times, want 3", s.k.lists)
	}
}
