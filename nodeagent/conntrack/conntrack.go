package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// inetFamily returns the family's netlink constant; ok is false for an
// invalid family. The kernel keeps one conntrack table per family and
// lists them separately, so the agent runs one Cleaner per family, as it
// runs one dataplane per family.
func inetFamily(f dataplane.Family) (netlink.InetFamily, bool) {
	switch f {
	case dataplane.IPv4:
		return unix.AF_INET, true
	case dataplane.IPv6:
		return unix.AF_INET6, true
	}
	return 0, false
}

// maxListAttempts bounds the dumps Clean makes when the kernel reports a
// dump interrupted by table changes (NLM_F_DUMP_INTR): on a busy node one
// retry usually reads a consistent table, and after a few Clean works with
// the flows it did read rather than spin.
const maxListAttempts = 3

// kernel is the part of the netlink conntrack API the Cleaner uses;
// *netlink.Handle implements it. Both methods dump the whole table of one
// family; an interrupted dump returns what it read along with an error
// matching netlink.ErrDumpInterrupted.
type kernel interface {
	// ConntrackTableList returns the flows of family in table.
	ConntrackTableList(table netlink.ConntrackTableType, family netlink.InetFamily) ([]*netlink.ConntrackFlow, error)
	// ConntrackDeleteFilters deletes the flows of family in table that
	// any filter matches and returns how many it deleted (a flow that
	// expired before its deletion counts as deleted). It is idempotent.
	ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error)
}

// Cleaner deletes stale UDP conntrack flows of one IP family; see the
// package documentation for which flows and why. It keeps no state between
// calls, so it works the same after an agent restart.
type Cleaner struct {
	family dataplane.Family
	kernel kernel
	log    *slog.Logger
}

// New returns a Cleaner of the network namespace of the calling thread
// (the host's, for the agent). Each Clean opens its own netlink sockets,
// so there is nothing to close. A nil log means slog.Default().
func New(family dataplane.Family, log *slog.Logger) *Cleaner {
	// A zero Handle opens a socket per request, as netlink's package-level
	// functions and kube-proxy do.
	return newCleaner(family, &netlink.Handle{}, log)
}

// NewWithHandle returns a Cleaner that works through h, for example a
// handle opened in another network namespace with
//
//	netlink.NewHandleAt(nsHandle, unix.NETLINK_NETFILTER)
//
// h stays the caller's to close, after the last Clean. A nil log means
// slog.Default().
func NewWithHandle(family dataplane.Family, h *netlink.Handle, log *slog.Logger) *Cleaner {
	return newCleaner(family, h, log)
}

// newCleaner is the seam: tests pass a fake kernel.
func newCleaner(family dataplane.Family, k kernel, log *slog.Logger) *Cleaner {
	if log == nil {
		log = slog.Default()
	}
	return &Cleaner{family: family, kernel: k, log: log.With("family", family.String())}
}

// Clean deletes the stale UDP flows of the Cleaner's family: the flows to a
// UDP frontend of t (cluster IP, external IP or load balancer IP and port,
// or a NodePort) that are not DNATed to one of its endpoints, which is all
// of them when it has none. Call it after the rules for t are in force: a
// flow deleted earlier could be recreated by the old rules. It returns how
// many flows it deleted.
//
// When t has no UDP service port of the family, Clean returns at once
// without reading the kernel's table. Otherwise it lists
// the table, and only when some flow is stale asks the kernel to delete
// the flows that are stale by then (a second dump).
//
// Errors: a *ListError when the table could not be read (nothing was
// deleted), a *DeleteError when deleting failed for some flows (deleted
// counts the others). When the kernel cut a dump short (IsInterrupted), the
// flows read were cleaned and deleted is accurate; flows not read are left
// for the next Clean. A canceled ctx stops Clean between flows and returns
// ctx's error. Clean is idempotent. It is not safe for concurrent use: the
// agent's sync loop owns the Cleaner.
func (c *Cleaner) Clean(ctx context.Context, t *proxytable.Table) (deleted int, err error) {
	start := time.Now()
	inet, ok := inetFamily(c.family)
	if !ok {
		return 0, fmt.Errorf("cleaning conntrack: invalid family %v", c.family)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("cleaning %v conntrack: %w", c.family, err)
	}
	ix := newIndex(t, c.family)
	if ix.empty() {
		return 0, nil
	}

	flows, listErr := c.list(inet)
	if listErr != nil && !IsInterrupted(listErr) {
		return 0, listErr
	}
	stale := 0
	for _, f := range flows {
		if ix.stale(flowOf(f)) {
			stale++
		}
	}
	if stale == 0 {
		c.log.Debug("no stale conntrack flows", "flows", len(flows), "took", time.Since(start))
		return 0, listErr
	}

	filter := &staleFilter{ix: ix, done: ctx.Done(), log: c.log, debug: c.log.Enabled(ctx, slog.LevelDebug)}
	n, delErr := c.kernel.ConntrackDeleteFilters(netlink.ConntrackTable, inet, filter)
	deleted = int(n)
	if err := ctx.Err(); err != nil {
		return deleted, fmt.Errorf("cleaning %v conntrack: %w", c.family, err)
	}
	if delErr != nil {
		delErr = &DeleteError{Family: c.family, Err: delErr}
	}
	c.log.Debug("deleted stale conntrack flows", "flows", len(flows), "stale", stale, "deleted", deleted, "took", time.Since(start))
	return deleted, errors.Join(listErr, delErr)
}

// list dumps the family's table, retrying interrupted dumps. After the last
// attempt it returns the flows read and a *ListError matching
// IsInterrupted.
func (c *Cleaner) list(inet netlink.InetFamily) ([]*netlink.ConntrackFlow, error) {
	var (
		flows []*netlink.ConntrackFlow
		err   error
	)
	for range maxListAttempts {
		flows, err = c.kernel.ConntrackTableList(netlink.ConntrackTable, inet)
		if err == nil {
			return flows, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, &ListError{Family: c.family, Err: err}
		}
	}
	c.log.Debug("conntrack dump interrupted, cleaning the flows read", "attempts", maxListAttempts, "flows", len(flows))
	return flows, &ListError{Family: c.family, Err: err}
}

// staleFilter matches the flows index.stale condemns when the kernel is
// asked to delete them, not the flows listed earlier: a flow created since
// the list is judged on its own (it was DNATed by the new rules and so is
// kept), and one that became stale since is deleted too.
type staleFilter struct {
	ix *index
	// done is the Clean context's: once closed nothing more matches, which
	// is the only way to stop a netlink delete part way.
	done  <-chan struct{}
	log   *slog.Logger
	debug bool
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (f *staleFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	select {
	case <-f.done:
		return false
	default:
	}
	ff := flowOf(fl)
	if !f.ix.stale(ff) {
		return false
	}
	if f.debug {
		f.log.Debug("deleting stale conntrack flow", "origSrc", netip.AddrPortFrom(addrOf(fl.Forward.SrcIP), fl.Forward.SrcPort),
			"origDst", ff.origDst, "replySrc", ff.replySrc)
	}
	return true
}
