package ipvs

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// The kernel steps of a live mode switch to or from IPVS mode, which this
// machine's kernel cannot run, proven on the fakes: what each cleanup
// removes, and what it must leave to the mode that runs.

// addIPTablesMode puts into f what the iptables mode leaves: its
// PP-SERVICES chain and the PREROUTING jump to it.
func addIPTablesMode(t *testing.T, f *fakeIPTables) {
	t.Helper()
	ctx := context.Background()
	if err := f.Restore(ctx, []byte("*nat\n:PP-SERVICES - [0:0]\n-A PP-SERVICES -j RETURN\nCOMMIT\n"), "--noflush"); err != nil {
		t.Fatal(err)
	}
	if err := f.EnsureRule(ctx, "nat", "PREROUTING", "-m", "comment", "--comment", "proxyplane service portals", "-j", "PP-SERVICES"); err != nil {
		t.Fatal(err)
	}
}

// TestCleanupLeavesTheIPTablesMode checks that the IPVS mode's cleanup,
// which an agent switching to iptables mode runs once its own rules are
// in, removes the IPVS mode's chains, virtual servers, addresses and sets
// and none of the iptables mode's chains and jumps.
func TestCleanupLeavesTheIPTablesMode(t *testing.T) {
	n := newNode(t, 0, nil)
	n.mustSync(true, flowCases[0].services(0)...)
	ipt := n.kern.iptables[dataplane.IPv4]
	addIPTablesMode(t, ipt)

	found, err := n.dps[dataplane.IPv4].Leftovers(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nft nat/PP-IPVS-SERVICES", "virtual server", "address", "set PP-"} {
		if !slices.ContainsFunc(found, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("Leftovers = %q, lacks %q", found, want)
		}
	}
	if slices.ContainsFunc(found, func(s string) bool { return strings.Contains(s, "PP-SERVICES") && !strings.Contains(s, "PP-IPVS-") }) {
		t.Errorf("Leftovers = %q lists the iptables mode's chain", found)
	}

	if err := n.dps[dataplane.IPv4].Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	nat := ipt.dump("nat")
	if strings.Contains(nat, "PP-IPVS-") || strings.Contains(ipt.dump("filter"), "PP-IPVS-") {
		t.Errorf("the IPVS mode's chains stay:\n%s", nat)
	}
	if !strings.Contains(nat, ":PP-SERVICES\n") || !strings.Contains(nat, "-j PP-SERVICES") {
		t.Errorf("the IPVS cleanup removed the iptables mode's chain or jump:\n%s", nat)
	}
	if vss, _, _ := n.kern.ipvs.count(dataplane.IPv4); vss != 0 {
		t.Errorf("%d virtual servers left", vss)
	}
	if dump := n.kern.ipset.dump(dataplane.IPv4); dump != "" {
		t.Errorf("sets left:\n%s", dump)
	}
}

// TestCleanupRulesOfTheOtherBackend checks what an agent running IPVS
// mode on the nft backend removes of a run on the legacy one: the
// PP-IPVS- chains and jumps of legacy iptables, and nothing of its own
// (its nft chains, virtual servers, addresses and sets stay).
func TestCleanupRulesOfTheOtherBackend(t *testing.T) {
	n := newNode(t, 0, nil)
	services := flowCases[0].services(0)
	n.mustSync(true, services...)
	before := n.dump()

	// The legacy backend's tables, as an IPVS run on legacy left them:
	// the same rules, written by a Dataplane of that backend over a
	// kernel of its own (the sets are the running kernel's).
	old := newNode(t, 0, func(c *Config) { c.Backend = xtables.BackendLegacy })
	old.mustSync(true, services...)
	legacy := old.kern.iptables[dataplane.IPv4]
	legacy.k = n.kern
	addIPTablesMode(t, legacy) // a legacy iptables mode's too: not IPVS's

	c := testConfig(dataplane.IPv4, 0)
	c.Backend = xtables.BackendLegacy
	k := n.kern.seams(dataplane.IPv4)
	k.iptables = map[xtables.Backend]xtables.Runner{xtables.BackendLegacy: legacy}
	d := newDataplane(c, k, nil)

	found, err := d.Leftovers(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 || slices.ContainsFunc(found, func(s string) bool { return !strings.HasPrefix(s, "legacy ") || !strings.Contains(s, "PP-IPVS-") }) {
		t.Errorf("Leftovers(rulesOnly) = %q, want the legacy PP-IPVS- chains and jumps only", found)
	}
	for range 2 { // idempotent
		if err := d.CleanupRules(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if nat := legacy.dump("nat"); strings.Contains(nat, "PP-IPVS-") || !strings.Contains(nat, "-j PP-SERVICES") {
		t.Errorf("legacy nat after CleanupRules:\n%s\nwant no PP-IPVS- chain and the iptables mode's jump kept", nat)
	}
	if strings.Contains(legacy.dump("filter"), "PP-IPVS-") {
		t.Errorf("legacy filter keeps PP-IPVS- chains:\n%s", legacy.dump("filter"))
	}
	if after := n.dump(); after != before {
		t.Errorf("CleanupRules changed the running mode's kernel state:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestLeftoversSparesOthersVirtualServers checks that an agent in
// another mode, beside kube-proxy in IPVS mode (a migration), finds no
// IPVS leftovers in kube-proxy's virtual servers, which carry no owner:
// without the IPVS mode's chains, addresses or sets there is nothing of
// it, and the switch removes nothing.
func TestLeftoversSparesOthersVirtualServers(t *testing.T) {
	n := newNode(t, 0, nil)
	kubeProxys := VirtualServer{Addr: netip.MustParseAddr("10.96.0.1"), Port: 443, Protocol: TCP, Scheduler: "rr"}
	if err := n.kern.ipvs.AddVirtualServer(kubeProxys); err != nil {
		t.Fatal(err)
	}
	found, err := n.dps[dataplane.IPv4].Leftovers(context.Background(), false)
	if err != nil || len(found) != 0 {
		t.Errorf("Leftovers = %q, %v; want nothing beside kube-proxy's virtual server", found, err)
	}
	// Once this mode ran, its virtual servers are listed.
	n.mustSync(true, flowCases[0].services(0)...)
	found, err = n.dps[dataplane.IPv4].Leftovers(context.Background(), false)
	if err != nil || !slices.ContainsFunc(found, func(s string) bool { return strings.HasPrefix(s, "virtual server ") }) {
		t.Errorf("Leftovers = %q, %v; want the virtual servers once IPVS mode ran", found, err)
	}
}
