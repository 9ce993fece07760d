package iptables

import (
	"slices"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// FuzzRender renders fuzzed tables (dptest.FuzzTables) as a full sync and
// checks that the restore input, read as iptables-restore reads it, holds
// exactly the rules of the same table under plain names: names reach
// comments and chain hashes only, so no name, valid or not, adds a line,
// an argument or a chain. The input must also apply to the kernel model,
// and leave the built-in chains (INPUT above all) without a rule.
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
		cfg := testConfig(dataplane.IPv4)
		got, want := renderFull(fuzzed, cfg), renderFull(plain, cfg)
		if g, w := dptest.NormalizeRestore(string(got.data)), dptest.NormalizeRestore(string(want.data)); !slices.Equal(g, w) {
			t.Fatalf("names changed the rules (table valid: %v):\n%s", valid, dptest.LineDiff(strings.Join(w, "\n"), strings.Join(g, "\n")))
		}
		k := newFakeKernel()
		if n, err := k.apply(string(got.data)); err != nil {
			t.Fatalf("the kernel model refuses line %d: %v", n, err)
		}
		for table, chains := range builtinChains {
			for _, c := range chains {
				if rules := k.tables[table].chains[c]; len(rules) > 0 {
					t.Fatalf("the restore input wrote to built-in chain %s %s: %q", table, c, rules)
				}
			}
		}
	})
}
