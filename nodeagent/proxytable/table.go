// Package proxytable is the node agent's model of its proxy table: the
// entries it was sent, validated, with the version they add up to.
//
// A Table is immutable. Applying a snapshot or delta validates everything
// first and builds a new Table, so a bad response never touches the table
// in force (the agent NACKs it and keeps going).
package proxytable

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Table is a node's proxy table. It is immutable: never modify it or the
// messages it holds.
type Table struct {
	// Version is the table's version (16 hex digits), "" for no table.
	Version string
	// ResourceVersion is the highest resource_version the control plane
	// sent with this table or the tables it was built from by deltas: the
	// table reflects the cluster at least that far. 0 when unknown.
	ResourceVersion uint64
	// Node is the node's info as the control plane sent it.
	Node *pb.NodeInfo
	// Entries holds the Services by key.
	Entries map[string]*pb.ServiceEntry
}

// Empty is the table of an agent that holds nothing.
func Empty() *Table { return &Table{Node: &pb.NodeInfo{}, Entries: map[string]*pb.ServiceEntry{}} }

// Keys returns the entry keys, sorted.
func (t *Table) Keys() []string { return slices.Sorted(maps.Keys(t.Entries)) }

// Hashes returns each entry's hash, for the hello.
func (t *Table) Hashes() map[string]uint64 {
	out := make(map[string]uint64, len(t.Entries))
	for k, e := range t.Entries {
		out[k] = e.GetHash()
	}
	return out
}

// ResponseVersion returns the version a table response carries: its
// snapshot's or its delta's; "" for a response without a table.
func ResponseVersion(resp *pb.SyncResponse) string {
	switch k := resp.GetKind().(type) {
	case *pb.SyncResponse_Snapshot:
		return k.Snapshot.GetVersion()
	case *pb.SyncResponse_Delta:
		return k.Delta.GetVersion()
	}
	return ""
}

// FromSnapshot validates a snapshot and returns its table.
func FromSnapshot(s *pb.Snapshot) (*Table, error) {
	t := &Table{
		Version: s.GetVersion(), ResourceVersion: s.GetResourceVersion(), Node: s.GetNode(),
		Entries: make(map[string]*pb.ServiceEntry, len(s.GetEntries())),
	}
	ve := &ValidationError{}
	if n := len(s.GetZstdEntries()) + len(s.GetZstdEntriesUnhashed()); n > 0 {
		// The client inflates them in place before decoding: left here,
		// they are entries nobody checked, and the rest cannot add up.
		ve.Table = append(ve.Table, fmt.Errorf("%d runs of compressed entries not inflated", n))
	}
	for _, e := range s.GetEntries() {
		if _, dup := t.Entries[e.GetKey()]; dup {
			ve.Entries = append(ve.Entries, &EntryError{Key: e.GetKey(), Err: errors.New("duplicate key")})
			continue
		}
		t.Entries[e.GetKey()] = e
	}
	if err := t.validate(s.GetEntries(), ve); err != nil {
		return nil, err
	}
	return t, nil
}

// Apply validates a delta against t and returns the resulting table and
// the keys it changed (upserted or removed), sorted.
func (t *Table) Apply(d *pb.Delta) (*Table, []string, error) {
	if d.GetBaseVersion() != t.Version {
		return nil, nil, &ValidationError{Table: []error{fmt.Errorf("delta applies to %q, the agent holds %q", d.GetBaseVersion(), t.Version)}}
	}
	// A delta's world is newer than its base's, whatever bound it
	// carries (a replica that served a current agent may know less than
	// the one that made its table): the bound never falls.
	next := &Table{
		Version: d.GetVersion(), ResourceVersion: max(t.ResourceVersion, d.GetResourceVersion()),
		Node: t.Node, Entries: maps.Clone(t.Entries),
	}
	if d.GetNode() != nil {
		next.Node = d.GetNode()
	}
	ve := &ValidationError{}
	changed := make([]string, 0, len(d.GetUpserts())+len(d.GetRemovals()))
	for _, k := range d.GetRemovals() {
		if _, ok := next.Entries[k]; !ok {
			ve.Entries = append(ve.Entries, &EntryError{Key: k, Err: errors.New("removal of an entry the agent does not hold")})
		}
		delete(next.Entries, k)
		changed = append(changed, k)
	}
	for _, e := range d.GetUpserts() {
		next.Entries[e.GetKey()] = e
		changed = append(changed, e.GetKey())
	}
	if err := next.validate(d.GetUpserts(), ve); err != nil {
		return nil, nil, err
	}
	slices.Sort(changed)
	return next, slices.Compact(changed), nil
}

// FromEntries rebuilds a table from stored parts (the agent's cache),
// validating it as if it had been received.
func FromEntries(version string, node *pb.NodeInfo, entries []*pb.ServiceEntry) (*Table, error) {
	return FromSnapshot(&pb.Snapshot{Version: version, Node: node, Entries: entries})
}

// validate checks the given entries and that the whole table adds up to
// its version: the sum of entry hashes and the node hash, as the control
// plane computes it. ve may already hold errors found by the caller; it is
// returned when anything is wrong.
func (t *Table) validate(entries []*pb.ServiceEntry, ve *ValidationError) error {
	for _, e := range entries {
		if err := ValidateEntry(e); err != nil {
			ve.Entries = append(ve.Entries, err)
		}
	}
	if t.Node.GetName() == "" {
		ve.Table = append(ve.Table, errors.New("no node info"))
	}
	if err := validateServiceCIDRs(t.Node.GetServiceCidrs()); err != nil {
		ve.Table = append(ve.Table, err)
	}
	if err := validateNodeIPs(t.Node.GetNodeIps()); err != nil {
		ve.Table = append(ve.Table, err)
	}
	if err := validateControlPlaneAddresses(t.Node.GetControlPlaneAddresses()); err != nil {
		ve.Table = append(ve.Table, err)
	}
	sum := t.Node.GetHash()
	for _, e := range t.Entries {
		sum += e.GetHash()
	}
	if want, err := strconv.ParseUint(t.Version, 16, 64); err != nil || len(t.Version) != 16 || want != sum {
		ve.Table = append(ve.Table, fmt.Errorf("entries add up to version %016x, not %q", sum, t.Version))
	}
	if len(ve.Entries)+len(ve.Table) > 0 {
		return ve
	}
	return nil
}
