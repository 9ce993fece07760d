package nftables

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// TestKernelReplacesPreviousLayout checks an agent's upgrade in place: the
// table the previous release programmed (one chain per endpoint, hairpin
// rules in them; testdata/previous-layout holds its listings of three
// cases) is replaced by the first full sync of a new agent, which lists
// the kernel's table rather than knowing it, with exactly the rules a
// fresh node gets.
func TestKernelReplacesPreviousLayout(t *testing.T) {
	requireKernel(t)
	tp := nstest.New(t, nstest.Options{Nodes: 2, Pods: 1})
	upgraded, fresh := tp.Node(0).NS(), tp.Node(1).NS()
	for _, c := range dptest.Cases {
		previous, err := os.ReadFile(filepath.Join("testdata", "previous-layout", c.Name+".nft"))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Run(c.Name, func(t *testing.T) {
			for _, ns := range []string{upgraded, fresh} {
				if _, err := tp.Exec(ns, "nft", "delete", "table", nftFamily(c.Family), TableName); err != nil {
					t.Logf("no table to delete yet: %v", err)
				}
			}
			nftLoad(t, tp, upgraded, string(previous))
			tbl := dptest.Table(t, dptest.Node(), c.Services()...)
			for _, ns := range []string{upgraded, fresh} {
				cfg := caseConfig(c)
				cfg.NetNS = nsPath(ns)
				d, err := New(cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := d.Sync(context.Background(), tbl, nil, true); err != nil {
					t.Fatalf("Sync in %s: %v", ns, err)
				}
			}
			got, want := listTable(t, tp, upgraded, c.Family), listTable(t, tp, fresh, c.Family)
			if normalizeListing(got) != normalizeListing(want) {
				t.Errorf("the upgraded node's table differs from a fresh node's:\n%s", dptest.LineDiff(normalizeListing(want), normalizeListing(got)))
			}
		})
	}
}
