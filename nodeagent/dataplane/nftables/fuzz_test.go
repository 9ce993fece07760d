package nftables

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// serviceObjectName matches the names hashName makes, to mask: the
// hashed part and the readable rest, up to the first character nft would
// not take in an identifier.
var serviceObjectName = regexp.MustCompile(`\b(service|local|external|firewall|endpoint|endpoints|affinity)-[A-Z2-7]{8}-[A-Za-z0-9_./-]*`)

// nftIdentifier is what every object name must be.
var nftIdentifier = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_./-]{0,254}$`)

// normalizeNFT returns the lines of an nft script with the Service object
// names masked, sorted.
func normalizeNFT(text string) []string {
	lines := strings.Split(serviceObjectName.ReplaceAllString(text, "${1}-H"), "\n")
	slices.Sort(lines)
	return lines
}

// FuzzRender builds fuzzed tables (dptest.FuzzTables) as a full sync and
// checks that the ruleset, as nft script, has exactly the lines of the
// same table under plain names, that every chain and set name is an nft
// identifier (no name can add a line to the script or be cut short in the
// kernel), and that the kernel model takes the transaction.
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
		st := fullState(fuzzed, cfg)
		got, want := rulesetText(st, dataplane.IPv4), rulesetText(fullState(plain, cfg), dataplane.IPv4)
		if g, w := normalizeNFT(got), normalizeNFT(want); !slices.Equal(g, w) {
			t.Fatalf("names changed the rules (table valid: %v):\n%s", valid, dptest.LineDiff(strings.Join(w, "\n"), strings.Join(g, "\n")))
		}
		for _, fr := range st.services {
			for _, c := range fr.chains {
				if !nftIdentifier.MatchString(c.name) {
					t.Fatalf("chain name %q is not an nft identifier", c.name)
				}
			}
			for _, s := range fr.sets {
				if !nftIdentifier.MatchString(s.name) {
					t.Fatalf("set name %q is not an nft identifier", s.name)
				}
			}
		}
		d := newTestDataplane(cfg, newFakeKernel(dataplane.IPv4))
		if err := d.Sync(context.Background(), fuzzed, nil, true); err != nil {
			t.Fatalf("the kernel model refuses the sync: %v", err)
		}
	})
}
