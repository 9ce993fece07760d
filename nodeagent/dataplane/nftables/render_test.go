package nftables

import (
	"context"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current renderer")

// TestGolden renders each case's ruleset (what a full sync programs, as
// an nft table block) and compares it with testdata/<case>.golden. Run
// with -update to accept a change, then read the diff: it is the ruleset
// change under review. TestKernelNetlinkMatchesNFT proves the kernel gets
// the same rules over netlink.
func TestGolden(t *testing.T) {
	for _, c := range dptest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			cfg := caseConfig(c)
			tbl := dptest.Table(t, dptest.Node(), c.Services()...)
			got := rulesetText(fullState(tbl, cfg), c.Family)
			dptest.Golden(t, c.Name, got, *update)
			// The kernel model must accept the full sync: every reference
			// exists, every statement is allowed where it is reached.
			k := newFakeKernel(c.Family)
			d := newTestDataplane(cfg, k)
			if err := d.Sync(context.Background(), tbl, nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			if d.Ruleset() != got {
				t.Errorf("Dataplane.Ruleset differs from the golden's ruleset")
			}
		})
	}
}

// TestRenderDeterministic checks that building twice, with Services in a
// different order, gives the same ruleset and the same transaction.
func TestRenderDeterministic(t *testing.T) {
	all := dptest.CaseServices()
	rev := make([]*pb.Service, len(all))
	for i, s := range all {
		rev[len(all)-1-i] = s
	}
	cfg := testConfig(dataplane.IPv4)
	a, b := fullState(dptest.Table(t, dptest.Node(), all...), cfg), fullState(dptest.Table(t, dptest.Node(), rev...), cfg)
	if x, y := rulesetText(a, dataplane.IPv4), rulesetText(b, dataplane.IPv4); x != y {
		t.Fatalf("ruleset depends on input order:\n%s", dptest.LineDiff(x, y))
	}
	if x, y := fullTransaction(a, nil, true).text(dataplane.IPv4), fullTransaction(b, nil, true).text(dataplane.IPv4); x != y {
		t.Fatalf("transaction depends on input order:\n%s", dptest.LineDiff(x, y))
	}
}

// TestNames pins the naming scheme to kube-proxy's nftables mode: the same
// service port gets the same chain name, so operators can correlate.
func TestNames(t *testing.T) {
	// kube-proxy's proxier.go documents these two examples.
	if got := portNameBase("ns1/svc1", "tcp", "p80"); got != "ULMVA6XW-ns1/svc1/tcp/p80" {
		t.Errorf("service port base = %s, want ULMVA6XW-ns1/svc1/tcp/p80", got)
	}
	if got := endpointNameBase("ns1/svc1", "tcp", "p80", "10.180.0.1", 80); got != "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80" {
		t.Errorf("endpoint base = %s, want 5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80", got)
	}
	if got := endpointNameBase("ns", "s", "tcp", "fd00::1", 80); strings.Contains(got, ":") {
		t.Errorf("IPv6 endpoint name %s holds a colon", got)
	}
	long := strings.Repeat("n", 63) + "/" + strings.Repeat("s", 63)
	name := prefixAffinitySet + affinityNameBase(long, "sctp", strings.Repeat("p", 63), "fd00:1111:2222:3333:4444:5555:6666:7777", 65535, 86400)
	if len(name) > nameMax {
		t.Errorf("longest affinity set name is %d characters, over nf_tables' %d", len(name), nameMax)
	}
	for _, n := range []string{chainServices, chainFilterForward, mapServiceIPs, setClusterIPs} {
		if isServiceObject(n) {
			t.Errorf("isServiceObject(%s) = true: full syncs would treat it as a Service's", n)
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

	v4 := rulesetText(fullState(tbl, testConfig(dataplane.IPv4)), dataplane.IPv4)
	v6 := rulesetText(fullState(tbl, testConfig(dataplane.IPv6)), dataplane.IPv6)
	for _, s := range []string{"fd00:", "ns/v6only", "ip6 "} {
		if strings.Contains(v4, s) {
			t.Errorf("IPv4 ruleset mentions %q:\n%s", s, v4)
		}
	}
	for _, s := range []string{"10.96.", "10.244.", "127.0.0.0/8", "ip saddr", "ip daddr"} {
		if strings.Contains(v6, s) {
			t.Errorf("IPv6 ruleset mentions %q:\n%s", s, v6)
		}
	}
	if !strings.Contains(v6, "dnat to [fd00:244:1::10]:8080") || !strings.Contains(v6, "ip6 daddr != ::1") {
		t.Errorf("IPv6 ruleset lacks bracketed DNAT target or loopback exclusion:\n%s", v6)
	}
}

// TestEndpointMap checks the random choice without affinity: one rule
// draws numgen modulo the number of endpoints from a map holding each
// endpoint once at indices 0 to n-1, so each gets 1/n.
func TestEndpointMap(t *testing.T) {
	s := dptest.Svc("ns", "four", "10.96.0.4")
	s.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	eps := []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"}
	s.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", eps...)}
	cfg := testConfig(dataplane.IPv4)
	cfg.EndpointMapMin = len(eps)
	st := fullState(dptest.Table(t, dptest.Node(), s), cfg)
	fr := st.services["ns/four"]
	var c *chain
	for _, ch := range fr.chains {
		if strings.HasPrefix(ch.name, prefixClusterPolicyChain) {
			c = ch
		}
	}
	if c == nil {
		t.Fatal("no service chain")
	}
	// The masquerade rule, then the choice.
	if len(c.rules) != 2 {
		t.Fatalf("service chain has %d rules, want 2", len(c.rules))
	}
	last := c.rules[1].exprs
	dm, ok := last[len(last)-1].(dnatMap)
	if !ok || dm.mod != uint32(len(eps)) {
		t.Fatalf("choice rule %s, want a dnat map modulo %d", c.rules[1].String(dataplane.IPv4), len(eps))
	}
	got := map[string]int{}
	for e := range endpointElements(fr.epMaps[dm.set], "") {
		got[e.endpoint.String()]++
	}
	for _, ep := range eps {
		if got[ep] != 1 {
			t.Errorf("endpoint %s is %d of the %d indices, want 1", ep, got[ep], dm.mod)
		}
	}
}

// TestEndpointCascade checks the random choice below EndpointMapMin
// endpoints (DNAT rules) and with affinity (gotos to endpoint chains):
// rule i of n matches with probability 1/(n-i), so each endpoint gets
// 1/n, and the last rule is unconditional.
func TestEndpointCascade(t *testing.T) {
	t.Run("dnat", func(t *testing.T) { testEndpointCascade(t, false) })
	t.Run("affinity", func(t *testing.T) { testEndpointCascade(t, true) })
}

func testEndpointCascade(t *testing.T, affinity bool) {
	t.Helper()
	s := dptest.Svc("ns", "four", "10.96.0.4")
	s.Ports = []*pb.ServicePort{dptest.Port("", dptest.TCP, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("", "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80")}
	skip := 1 // the masquerade rule
	if affinity {
		s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 600}
		skip += 4 // and one affinity rule per endpoint
	}
	cfg := testConfig(dataplane.IPv4)
	cfg.EndpointMapMin = 5
	st := fullState(dptest.Table(t, dptest.Node(), s), cfg)
	var c *chain
	for _, ch := range st.services["ns/four"].chains {
		if strings.HasPrefix(ch.name, prefixClusterPolicyChain) {
			c = ch
		}
	}
	if c == nil {
		t.Fatal("no service chain")
	}
	probability, remaining := 0.0, 1.0
	var got []float64
	for _, r := range c.rules[skip:] {
		switch e := r.exprs[0].(type) {
		case numgenZero:
			probability = 1 / float64(e.mod)
		case verdict, protoMatch:
			probability = 1
		default:
			t.Fatalf("unexpected rule %s", r.String(dataplane.IPv4))
		}
		if _, ok := r.exprs[len(r.exprs)-1].(dnatTo); ok == affinity {
			t.Fatalf("rule %s: with affinity %v, want DNAT %v", r.String(dataplane.IPv4), affinity, !affinity)
		}
		got = append(got, remaining*probability)
		remaining *= 1 - probability
	}
	if len(got) != 4 {
		t.Fatalf("cascade has %d rules, want 4", len(got))
	}
	for i, p := range got {
		if p < 0.2499 || p > 0.2501 {
			t.Errorf("endpoint %d gets %.4f, want 0.25", i, p)
		}
	}
}

// TestNamePrefixesFit checks every prefix* constant of names.go against
// nameBaseMax: a name base cut to nameBaseMax, behind any prefix, must
// fit nf_tables' nameMax. The constants are read from the source, so a
// prefix added later is checked too.
func TestNamePrefixesFit(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "names.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "prefix") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s is not a string literal", name.Name)
				}
				p, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				n++
				if len(p)+nameBaseMax > nameMax {
					t.Errorf("%s %q: %d characters before a base of up to %d make %d, over nf_tables' %d", name.Name, p, len(p), nameBaseMax, len(p)+nameBaseMax, nameMax)
				}
			}
		}
	}
	if n < 8 {
		t.Errorf("found %d prefix constants in names.go, want the 8 or more it has", n)
	}
}
