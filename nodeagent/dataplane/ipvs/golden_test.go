package ipvs

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current code")

// runChecks traces each check's packet on its node.
func runChecks(t *testing.T, nodes [2]*node, checks []check) {
	t.Helper()
	for _, c := range checks {
		tr := &tracer{tb: t, k: nodes[c.node].kern}
		got, want := sortOutcomes(tr.trace(c.flow)), sortOutcomes(c.want)
		if !slices.Equal(got, want) {
			t.Errorf("node-%d: %v: got %s, want %s", c.node, c.flow, formatOutcomes(got), formatOutcomes(want))
		}
	}
}

// TestFlowCases programs each flow-suite case on both nodes with full
// syncs, compares the kernel state (virtual and real servers, addresses,
// set members, both families) with testdata/<service>.node-<k>.golden,
// and traces the case's packets through it. A case about a change then
// applies it as a partial sync and does the same with the .after goldens.
func TestFlowCases(t *testing.T) {
	for _, c := range flowCases {
		t.Run(c.name, func(t *testing.T) {
			nodes := [2]*node{newNode(t, 0, nil), newNode(t, 1, nil)}
			for k, n := range nodes {
				n.mustSync(true, c.services(k)...)
				dptest.Golden(t, fmt.Sprintf("%s.node-%d", c.svc, k), n.dump(), *update)
			}
			runChecks(t, nodes, c.checks)
			if c.update == nil {
				return
			}
			for k, n := range nodes {
				if c.conns != nil {
					c.conns(n.kern)
				}
				n.mustSync(false, c.update(k)...)
				dptest.Golden(t, fmt.Sprintf("%s.node-%d.after", c.svc, k), n.dump(), *update)
			}
			runChecks(t, nodes, c.after)
		})
	}
}

// TestFlowCasesTogether programs every case's Service at once, as the flow
// suite does, and traces every case's packets: no case disturbs another.
func TestFlowCasesTogether(t *testing.T) {
	nodes := [2]*node{newNode(t, 0, nil), newNode(t, 1, nil)}
	for k, n := range nodes {
		var all []*pb.Service
		for _, c := range flowCases {
			all = append(all, c.services(k)...)
		}
		n.mustSync(true, all...)
	}
	for _, c := range flowCases {
		t.Run(c.name, func(t *testing.T) { runChecks(t, nodes, c.checks) })
	}
}

// TestRulesGolden pins the iptables rules of each configuration that
// changes them: they depend on the configuration only, never on Services.
func TestRulesGolden(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  func(*Config)
	}{
		{"rules", nil},
		{"rules-local-none", func(c *Config) { c.LocalMode = dataplane.LocalNone; c.NoRandomFully = true }},
		{"rules-masquerade-all", func(c *Config) { c.MasqueradeAll = true; c.LocalMode = dataplane.LocalNodeCIDR; c.MasqueradeBit = 5 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t, 0, tt.cfg)
			n.mustSync(true)
			var b strings.Builder
			for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
				ipt := n.kern.iptables[f]
				fmt.Fprintf(&b, "## %v nat\n%s## %v filter\n%s", f, ipt.dump("nat"), f, ipt.dump("filter"))
			}
			dptest.Golden(t, tt.name, b.String(), *update)
			// The rules do not depend on the Services.
			before := len(n.kern.iptables[dataplane.IPv4].restores)
			n.mustSync(true, flowCases[0].services(0)...)
			if r := n.kern.iptables[dataplane.IPv4].restores; len(r) != before+1 || r[len(r)-1] != r[before-1] {
				t.Errorf("rules changed with the Services")
			}
		})
	}
}

// TestRulesIgnoreServices checks the restore input is the same whatever
// the table, and that a partial sync does not write it.
func TestRulesIgnoreServices(t *testing.T) {
	n := newNode(t, 0, nil)
	n.mustSync(true)
	n.mustSync(false, flowCases[0].services(0)...)
	if got := len(n.kern.iptables[dataplane.IPv4].restores); got != 1 {
		t.Errorf("iptables restores after a full and a partial sync = %d, want 1", got)
	}
}
