package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// wantedText renders the whole wanted kernel state of t: virtual servers
// with their real servers, bound addresses, and the `ipset restore` input
// that creates and fills the sets. Names appear nowhere in it.
func wantedText(t *proxytable.Table, cfg Config) string {
	p := newParams(&cfg, t.Node, []netip.Addr{netip.MustParseAddr("192.168.0.2")})
	d := aggregate(planAll(t, p))
	var lines []string
	for _, v := range d.vss {
		lines = append(lines, fmt.Sprintf("vs %+v -> %v", v.vs, v.dests))
	}
	for a := range d.addrs {
		lines = append(lines, "bind "+a.String())
	}
	var empty [numSets]members
	for id := range numSets {
		empty[id] = members{}
	}
	lines = append(lines, strings.Split(string(renderIPSet(p.family, &empty, &d.sets, true)), "\n")...)
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// FuzzRender plans fuzzed tables (dptest.FuzzTables) and checks that the
// kernel state they want (virtual servers, addresses, set members and the
// ipset input) is exactly that of the same table under plain names: IPVS
// mode renders no name into the kernel, and its iptables rules depend on
// the configuration only.
func FuzzRender(f *testing.F) {
	for i, names := range dptest.FuzzNameSeeds {
		f.Add(names, []byte{byte(i), 2, 1, 1, 1, 0, 1, 3, 0, 1, 2, 2, 1})
		f.Add(names, []byte{2, 1, 0, 0, 0, 1, 1, 2, 3, 1})
	}
	f.Fuzz(func(t *testing.T, names string, data []byte) {
		fuzzed, plain, valid, ok := dptest.FuzzTables(names, data)
		if !ok {
			return
		}
		cfg := testConfig(dataplane.IPv4, 0)
		got, want := wantedText(fuzzed, cfg), wantedText(plain, cfg)
		if got != want {
			t.Fatalf("names changed the kernel state (table valid: %v):\n%s", valid, dptest.LineDiff(want, got))
		}
		if !strings.Contains(want, "vs {") {
			t.Fatalf("no virtual server planned for a table of Services with ports:\n%s", want)
		}
	})
}
