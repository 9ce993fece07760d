package cache

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// TestRoundTripControlPlaneAddresses checks that the control plane
// addresses learned with a table survive a restart: an agent whose seed
// addresses are all stale reaches the control plane from its cache.
func TestRoundTripControlPlaneAddresses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache.db")
	c, _ := mustOpen(t, path)
	learned := []string{"192.168.0.10:9640", "[fd00::10]:9640"}
	node := testNode()
	node.ControlPlaneAddresses = learned
	h, err := tablehash.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	node.Hash = h
	e := entry("default/kubernetes", 1)
	want, err := proxytable.FromEntries(fmt.Sprintf("%016x", node.GetHash()+e.GetHash()), node, []*pb.ServiceEntry{e})
	if err != nil {
		t.Fatalf("building table: %v", err)
	}
	if err := c.Save(want, nil, true); err != nil {
		t.Fatalf("Save: %v", err)
	}
	_, got := reload(t, c, path)
	equalTables(t, got, want)
	if a := got.Node.GetControlPlaneAddresses(); !slices.Equal(a, learned) {
		t.Errorf("control plane addresses after a restart = %q, want %q", a, learned)
	}
}
