package iptables

import (
	"context"
	"flag"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current renderer")

// TestGolden renders each case as a full sync and compares it with
// testdata/<case>.golden. Run with -update to accept a change, then read
// the diff: it is the ruleset change under review.
func TestGolden(t *testing.T) {
	for _, c := range dptest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			cfg := caseConfig(c)
			rs := renderFull(dptest.Table(t, dptest.Node(), c.Services()...), cfg)
			dptest.Golden(t, c.Name, string(rs.data), *update)
			// A full sync writes every rule we own: kube-proxy's
			// sync_proxy_rules_iptables_total and _last agree.
			want := restoreRuleCounts(string(rs.data))
			for _, got := range rs.counts() {
				if got.Total != want[got.Table] || got.Written != want[got.Table] {
					t.Errorf("%s rules: total %d, written %d; the input adds %d", got.Table, got.Total, got.Written, want[got.Table])
				}
			}
			// The kernel model must accept it: every jump target exists,
			// nothing deleted is still referenced.
			f := newFakeRunner()
			d := newTestDataplane(cfg, f, nil)
			if err := d.Sync(context.Background(), dptest.Table(t, dptest.Node(), c.Services()...), nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
		})
	}
}

// TestRenderDeterministic checks that rendering twice, with services in a
// different order, gives the same bytes (goldens and partial-sync
// comparisons rely on it).
func TestRenderDeterministic(t *testing.T) {
	all := dptest.CaseServices()
	cfg := testConfig(dataplane.IPv4)
	a := renderFull(dptest.Table(t, dptest.Node(), all...), cfg)
	rev := make([]*pb.Service, len(all))
	for i, s := range all {
		rev[len(all)-1-i] = s
	}
	b := renderFull(dptest.Table(t, dptest.Node(), rev...), cfg)
	if string(a.data) != string(b.data) {
		t.Fatalf("render depends on input order:\n%s", dptest.LineDiff(string(a.data), string(b.data)))
	}
}

// TestChainNames pins the hash scheme to kube-proxy's: the same service
// port gives the same suffix as KUBE-SVC-, so operators can correlate.
func TestChainNames(t *testing.T) {
	// kube-proxy's proxier_test.go expects KUBE-SVC-XPGD46QRK7WJZT7O for
	// ns1/svc1:p80 tcp.
	if got := prefixSvc + portHash(plan.ServicePortName("ns1/svc1", "p80"), "tcp"); got != "PP-SVC-XPGD46QRK7WJZT7O" {
		t.Errorf("service chain = %s, want PP-SVC-XPGD46QRK7WJZT7O", got)
	}
	for _, name := range []string{"PP-SVC-XPGD46QRK7WJZT7O", "PP-SEP-AAAAAAAAAAAAAAAA", "PP-FW-AAAAAAAAAAAAAAAA"} {
		if len(name) > 28 {
			t.Errorf("%s is longer than iptables' 28 characters", name)
		}
		if !isServiceChain(name) {
			t.Errorf("isServiceChain(%s) = false", name)
		}
	}
	for _, name := range []string{chainServices, chainNodePorts, chainMarkMasq, "KUBE-SVC-XPGD46QRK7WJZT7O"} {
		if isServiceChain(name) {
			t.Errorf("isServiceChain(%s) = true: full syncs would delete it", name)
		}
	}
}

// TestProbability pins kube-proxy's formatting.
func TestProbability(t *testing.T) {
	for n, want := range map[int]string{2: "0.5000000000", 3: "0.3333333333", 7: "0.1428571429", 1000: "0.0010000000"} {
		if got := probability(n); got != want {
			t.Errorf("probability(%d) = %s, want %s", n, got, want)
		}
	}
}

// TestFamilyFiltering checks that each family's ruleset holds only its own
// addresses, and that a Service without a cluster IP of the family is not
// programmed at all.
func TestFamilyFiltering(t *testing.T) {
	v6only := dptest.Svc("ns", "v6only", "fd00:96::200")
	v6only.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 30200, true)}
	v6only.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", "[fd00:244:2::20]:80")}
	tbl := dptest.Table(t, dptest.Node(), dptest.DualStackService(), v6only)

	v4 := string(renderFull(tbl, testConfig(dataplane.IPv4)).data)
	v6 := string(renderFull(tbl, testConfig(dataplane.IPv6)).data)
	for _, s := range []string{"fd00:", "ns/v6only"} {
		if strings.Contains(v4, s) {
			t.Errorf("IPv4 ruleset mentions %q:\n%s", s, v4)
		}
	}
	for _, s := range []string{"10.96.", "10.244.", "127.0.0.0/8"} {
		if strings.Contains(v6, s) {
			t.Errorf("IPv6 ruleset mentions %q:\n%s", s, v6)
		}
	}
	if !strings.Contains(v6, "[fd00:244:1::10]:8080") || !strings.Contains(v6, "! -d ::1/128") {
		t.Errorf("IPv6 ruleset lacks bracketed DNAT target or loopback exclusion:\n%s", v6)
	}
}

// TestLargeClusterDropsComments checks kube-proxy's large-cluster mode:
// above 1000 endpoints, per-endpoint rules carry no comments.
func TestLargeClusterDropsComments(t *testing.T) {
	tbl := dptest.Table(t, dptest.Node(), dptest.ScaleServices(400, 3)...)
	rs := renderFull(tbl, testConfig(dataplane.IPv4))
	for _, line := range strings.Split(string(rs.data), "\n") {
		if strings.HasPrefix(line, "-A PP-SEP-") && strings.Contains(line, "--comment") {
			t.Fatalf("large cluster: endpoint rule has a comment: %s", line)
		}
	}
	small := renderFull(dptest.Table(t, dptest.Node(), dptest.ScaleServices(10, 3)...), testConfig(dataplane.IPv4))
	if !strings.Contains(string(small.data), "-A PP-SEP-") || !strings.Contains(string(small.data), "--comment ns/svc-0:http -s") {
		t.Fatalf("small cluster: endpoint rules lack comments")
	}
}

// TestNFTListsWhenLarge checks the iptables-nft speed-up: a large nat input
// for the nft backend starts with "-S"; small inputs and legacy ones do not.
func TestNFTListsWhenLarge(t *testing.T) {
	large := dptest.Table(t, dptest.Node(), dptest.ScaleServices(200, 3)...)
	small := dptest.Table(t, dptest.Node(), dptest.ScaleServices(10, 3)...)
	for _, tt := range []struct {
		name    string
		tbl     *proxytable.Table
		backend xtables.Backend
		want    bool
	}{
		{"large nft", large, xtables.BackendNFT, true},
		{"small nft", small, xtables.BackendNFT, false},
		{"large legacy", large, xtables.BackendLegacy, false},
	} {
		p := newParams(&Config{Settings: dataplane.DefaultSettings(dataplane.IPv4)}, tt.tbl.Node)
		p.backend = tt.backend
		rs := render(&renderInput{table: tt.tbl, params: p, full: true})
		if got := strings.HasPrefix(string(rs.data), "*nat\n-S\n"); got != tt.want {
			t.Errorf("%s: starts with -S = %v, want %v", tt.name, got, tt.want)
		}
	}
}
