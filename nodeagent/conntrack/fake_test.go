package conntrack

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
)

// fakeKernel is a conntrack table in memory, behaving as netlink's
// conntrack calls do: a list returns a family's flows (with what it read
// when the dump is interrupted), a delete dumps the family again and
// deletes what any filter matches.
type fakeKernel struct {
	flows map[netlink.InetFamily][]*netlink.ConntrackFlow
	// listErrs are returned by successive lists; an ErrDumpInterrupted
	// comes with the flows, as netlink returns a partial dump.
	listErrs []error
	// undeletable flows match filters but their deletion fails.
	undeletable map[*netlink.ConntrackFlow]bool
	// beforeDelete runs at the start of each delete, to change the table
	// or the world between Clean's list and its delete.
	beforeDelete func()

	lists, deletes int
}

var _ kernel = (*fakeKernel)(nil)

func newFakeKernel(flows ...*netlink.ConntrackFlow) *fakeKernel {
	f := &fakeKernel{flows: map[netlink.InetFamily][]*netlink.ConntrackFlow{}, undeletable: map[*netlink.ConntrackFlow]bool{}}
	f.add(flows...)
	return f
}

// add records flows under the family of their addresses.
func (f *fakeKernel) add(flows ...*netlink.ConntrackFlow) {
	for _, fl := range flows {
		fam := netlink.InetFamily(fl.FamilyType)
		f.flows[fam] = append(f.flows[fam], fl)
	}
}

func (f *fakeKernel) ConntrackTableList(table netlink.ConntrackTableType, family netlink.InetFamily) ([]*netlink.ConntrackFlow, error) {
	f.lists++
	if table != netlink.ConntrackTable {
		return nil, fmt.Errorf("fake: table %d", table)
	}
	var err error
	if len(f.listErrs) > 0 {
		err, f.listErrs = f.listErrs[0], f.listErrs[1:]
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	return slices.Clone(f.flows[family]), err
}

func (f *fakeKernel) ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error) {
	f.deletes++
	if table != netlink.ConntrackTable {
		return 0, fmt.Errorf("fake: table %d", table)
	}
	if f.beforeDelete != nil {
		f.beforeDelete()
	}
	var (
		kept    []*netlink.ConntrackFlow
		deleted uint
		failed  int
	)
	for _, fl := range f.flows[family] {
		match := slices.ContainsFunc(filters, func(flt netlink.CustomConntrackFilter) bool { return flt.MatchConntrackFlow(fl) })
		switch {
		case !match:
			kept = append(kept, fl)
		case f.undeletable[fl]:
			kept = append(kept, fl)
			failed++
		default:
			deleted++
		}
	}
	f.flows[family] = kept
	if failed > 0 {
		return deleted, fmt.Errorf("failed to delete %d conntrack flows with %d filters", failed, len(filters))
	}
	return deleted, nil
}
