package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/proxyplane/proxyplane/internal/failpoint"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Switching modes live. An operator changes the mode (or the iptables
// backend) by editing the configuration and rolling the DaemonSet: the
// agent restarts in the new mode with the old mode's rules still in the
// kernel. Upstream kube-proxy removes the other modes' rules at start,
// before its first sync, so new connections fail until that sync is in.
// The agent makes before it breaks instead: it leaves the old rules in
// force, programs its own mode in full (the first successful sync, from
// the cache or from the control plane), and only then removes what the
// other modes and backends left. Both rule sets send a Service's packets
// to the endpoints of the same table meanwhile, and the kernel keeps an
// established flow's NAT binding (made by whichever rules saw its first
// packet) whatever rules come and go, so no connection, new or
// established, fails. (The kernel applies a binding in NAT hooks that a
// network namespace has only while some NAT chain of the family exists:
// the new mode's are in before the old ones go; upstream's order can
// leave none, and established flows then stop.) A crash at any step
// leaves one complete rule set at least, and the next start finishes the
// job: removal is idempotent. docs/migration.md has the procedure and
// what the kernel tests (switch_kernel_test.go) prove.

// leftover names what one mode, on one iptables backend, may have left
// on the node.
type leftover struct {
	// mode is the dataplane that left it, as --proxy-mode names it.
	mode string
	// backend is the iptables backend whose rules go (iptables and ipvs
	// modes): nft, legacy, or auto for every backend; "" for nftables.
	backend xtables.Backend
	// rulesOnly removes the IPVS mode's iptables rules alone, from
	// backend, and leaves its virtual servers, addresses and sets: those
	// of an agent running IPVS mode on the other backend.
	rulesOnly bool
}

func (l leftover) String() string {
	s := l.mode
	if l.backend != "" {
		s += " (" + string(l.backend) + " iptables)"
	}
	if l.rulesOnly {
		s += " rules"
	}
	return s
}

// leftovers lists what an agent running mode with iptables backend (nft
// or legacy; ignored in nftables mode) removes once its own rules are in
// force: every other mode, on every backend, and its own mode on the
// other backend, since both backends apply to every packet. Never the
// running mode on its own backend. mode "" lists everything, for
// --cleanup.
func leftovers(mode string, backend xtables.Backend) []leftover {
	both := []xtables.Backend{xtables.BackendNFT, xtables.BackendLegacy}
	var out []leftover
	if mode != "nftables" {
		out = append(out, leftover{mode: "nftables"})
	}
	for _, b := range both {
		if mode != "iptables" || b != backend {
			out = append(out, leftover{mode: "iptables", backend: b})
		}
	}
	if mode != "ipvs" {
		// Its virtual servers, addresses and sets are backend-free, and
		// its sets go only once no rule of either backend refers to them.
		return append(out, leftover{mode: "ipvs", backend: xtables.BackendAuto})
	}
	for _, b := range both {
		if b != backend {
			out = append(out, leftover{mode: "ipvs", backend: b, rulesOnly: true})
		}
	}
	return out
}

// openLeftover returns a dataplane of l's mode for family, configured
// as o says but for l's backend, to list and remove what l names. It
// changes nothing in the kernel; it fails when the mode cannot run here
// (no IPVS in the kernel, no tools of the backend), where that mode
// cannot have left anything either.
type openLeftover func(l leftover, family dataplane.Family) (dataplane.Dataplane, error)

// leftoverOpener is openLeftover for o's dataplanes. Legacy iptables is
// looked at only where it holds a table (legacyInUse).
func leftoverOpener(o *Options, legacyInUse func(dataplane.Family) bool) openLeftover {
	return func(l leftover, family dataplane.Family) (dataplane.Dataplane, error) {
		oo := *o
		oo.ProxyMode = l.mode
		if l.backend != "" {
			oo.IPTablesBackend = string(l.backend)
		}
		if l.backend != "" && !legacyInUse(family) {
			switch l.backend {
			case xtables.BackendLegacy:
				return nil, errors.New("legacy iptables holds no table here")
			case xtables.BackendAuto:
				oo.IPTablesBackend = string(xtables.BackendNFT)
			}
		}
		return modes[l.mode](&oo, settingsFor(&oo, family), nil)
	}
}

// legacyTableNames lists, per family, the legacy iptables tables of the
// calling process's network namespace.
var legacyTableNames = map[dataplane.Family]string{
	dataplane.IPv4: "/proc/net/ip_tables_names",
	dataplane.IPv6: "/proc/net/ip6_tables_names",
}

// legacyInUse reports whether legacy iptables holds a nat or filter table
// of family in this network namespace, where a legacy run left its
// chains. Asking iptables-legacy-save instead would create the table it
// lists (the kernel loads and instantiates a missing table on the first
// request), on nodes that never used legacy iptables, at every start.
// When it cannot tell, it says yes: looking is only slower.
func legacyInUse(family dataplane.Family) bool {
	b, err := os.ReadFile(legacyTableNames[family])
	if errors.Is(err, fs.ErrNotExist) {
		return false // ip_tables not even loaded
	}
	if err != nil {
		return true
	}
	return hasLegacyTable(string(b))
}

// hasLegacyTable reads a /proc/net/ip*_tables_names listing.
func hasLegacyTable(names string) bool {
	for name := range strings.FieldsSeq(names) {
		if name == "nat" || name == "filter" {
			return true
		}
	}
	return false
}

// Each dataplane package's Leftovers lists what its Cleanup removes.
type (
	leftoverLister interface {
		Leftovers(ctx context.Context) ([]string, error)
	}
	ipvsLister interface {
		Leftovers(ctx context.Context, rulesOnly bool) ([]string, error)
	}
	rulesCleaner interface {
		CleanupRules(ctx context.Context) error
	}
	// backendUser is a dataplane writing iptables rules, which knows its
	// backend once it has synced.
	backendUser interface {
		IPTablesBackend() xtables.Backend
	}
)

// remove lists and removes what l left in family's part of the kernel,
// logging both, and returns how many objects it removed. A mode that
// cannot run here is skipped, saying why.
func remove(ctx context.Context, open openLeftover, l leftover, family dataplane.Family, log *slog.Logger) (int, error) {
	log = log.With("leftMode", l.mode, "family", family.String())
	if l.backend != "" {
		log = log.With("leftBackend", string(l.backend))
	}
	dp, err := open(l, family)
	if err != nil {
		log.Debug("nothing to clean up", "why", err)
		return 0, nil
	}
	var found []string
	switch lister := dp.(type) {
	case ipvsLister:
		found, err = lister.Leftovers(ctx, l.rulesOnly)
	case leftoverLister:
		found, err = lister.Leftovers(ctx)
	default:
		return 0, fmt.Errorf("the %s dataplane cannot list what it left", l.mode)
	}
	switch {
	case err != nil:
		// Nothing is removed unseen: the listing is what tells this
		// mode's objects from others' (kube-proxy's virtual servers).
		return 0, fmt.Errorf("listing what %s left in %v: %w", l, family, err)
	case len(found) == 0:
		log.Debug("nothing left by that mode")
		return 0, nil
	}
	log.Info("found what another mode left", "found", strings.Join(found, ", "))
	if l.rulesOnly {
		rc, ok := dp.(rulesCleaner)
		if !ok {
			return 0, fmt.Errorf("the %s dataplane cannot clean up its rules alone", l.mode)
		}
		err = rc.CleanupRules(ctx)
	} else {
		c, ok := dp.(dataplane.Cleaner)
		if !ok {
			return 0, fmt.Errorf("the %s dataplane cannot clean up", l.mode)
		}
		err = c.Cleanup(ctx)
	}
	if err != nil {
		return 0, fmt.Errorf("removing what %s left in %v: %w", l, family, err)
	}
	log.Info("removed what another mode left", "removed", len(found))
	return len(found), nil
}

// sweeper removes, after the first successful sync of the running mode,
// what other modes and backends left; see above. It is an AfterSync hook
// and runs on the agent's goroutine, the one that owns the running
// dataplanes, so it may ask them their backend.
type sweeper struct {
	mode     string
	families []dataplane.Family
	// running are the running mode's dataplanes, running[i] families[i]'s.
	running []dataplane.Dataplane
	open    openLeftover
	log     *slog.Logger
	// done is set once a sweep removed everything; a failed one is tried
	// again after the next successful sync.
	done bool
}

// newSweeper returns the sweeper of an agent running o's mode with
// running, one dataplane per family.
func newSweeper(o *Options, families []dataplane.Family, running []dataplane.Dataplane, log *slog.Logger) *sweeper {
	return &sweeper{mode: o.ProxyMode, families: families, running: running, open: leftoverOpener(o, legacyInUse), log: log.With("component", "switch")}
}

// afterSync is the agent's AfterSync hook: the table it follows is in
// force, in full (a dataplane's first successful sync is always full).
func (s *sweeper) afterSync(ctx context.Context, _ *proxytable.Table) {
	if s.done {
		return
	}
	if err := s.sweep(ctx); err != nil {
		metrics.LeftoverCleanupErrorsTotal.Inc()
		s.log.Error("removing what other modes left; retrying after the next sync (this mode's rules are in force meanwhile)", "err", err)
		return
	}
	s.done = true
}

// sweep removes, family by family, what every other mode and backend
// left, never the running mode's own rules. It carries on past failures
// and returns them all.
func (s *sweeper) sweep(ctx context.Context) error {
	var errs []error
	for i, family := range s.families {
		var backend xtables.Backend
		if bu, ok := s.running[i].(backendUser); ok {
			backend = bu.IPTablesBackend()
			if backend != xtables.BackendNFT && backend != xtables.BackendLegacy {
				// Not knowing its own backend, the agent could remove its
				// own rules: it waits for a sync that detects it.
				errs = append(errs, fmt.Errorf("%v: the running %s dataplane has not chosen its iptables backend yet", family, s.mode))
				continue
			}
		}
		for _, l := range leftovers(s.mode, backend) {
			n, err := remove(ctx, s.open, l, family, s.log)
			errs = append(errs, err)
			metrics.LeftoverObjectsRemovedTotal.WithLabelValues(l.mode).Add(float64(n))
			if n > 0 {
				failpoint.Hit(failpoint.MidSweep)
			}
		}
	}
	return errors.Join(errs...)
}

// Cleanup removes what every mode programs in every family of the node,
// on both iptables backends, whichever mode ran before (--cleanup). A
// mode that cannot run here (no IPVS in the kernel, no iptables tools)
// cannot have left anything and is skipped, saying why. It returns every
// failure, joined.
func Cleanup(ctx context.Context, o *Options, log *slog.Logger) error {
	open := leftoverOpener(o, legacyInUse)
	var errs []error
	for _, family := range nodeFamilies(log) {
		for _, l := range leftovers("", "") {
			_, err := remove(ctx, open, l, family, log)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
