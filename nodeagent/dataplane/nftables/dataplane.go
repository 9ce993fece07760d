package nftables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// mode is kube-proxy's --proxy-mode name for this dataplane.
const mode = "nftables"

// Dataplane programs one IP family of a node's proxy table into its own
// nf_tables table over netlink: a dataplane.Driver running this package's
// backend. Every Sync is one nf_tables transaction. A partial sync
// rewrites the changed Services' chains and map elements; a full sync
// rewrites the whole table and deletes what it does not use, keeping the
// affinity sets that stay. Errors are a *TransactionError (nothing
// changed) or a *SocketError, wrapped.
type Dataplane struct {
	*dataplane.Driver
	b *backend
}

// New returns a Dataplane for cfg whose syncs observe hears of (observe
// may be nil). It checks the configuration; it opens no socket and
// changes nothing in the kernel until the first Sync.
func New(cfg Config, observe dataplane.Observer) (*Dataplane, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newDataplane(cfg, newNetlinkKernel(cfg.Family, cfg.NetNS), observe), nil
}

// newDataplane is New's seam: the kernel is given.
func newDataplane(cfg Config, k kernel, observe dataplane.Observer) *Dataplane {
	b := &backend{cfg: cfg, k: k}
	return &Dataplane{Driver: dataplane.NewDriver(b, mode, cfg.Family, observe), b: b}
}

// Ruleset returns the nft script of the table as the last successful Sync
// left it ("" before the first one): what "nft list table" would show,
// for debugging endpoints. Not safe for concurrent use with Sync.
func (d *Dataplane) Ruleset() string {
	if d.b.last == nil {
		return ""
	}
	return rulesetText(d.b.last, d.b.cfg.Family)
}

// backend is the nftables dataplane.Backend and DriftChecker: it renders
// the table into states and transactions and runs them through the
// kernel seam.
type backend struct {
	cfg Config
	k   kernel

	// The fields below belong to the Driver's Sync caller.
	//
	// p is what Prepare resolved for the sync under way.
	p params
	// state is what the kernel holds from our last successful
	// transaction; nil when unknown (before the first sync, after Forget),
	// in which case the next full sync lists the table first.
	state *state
	// last is the state the last successful sync wrote, kept by Forget:
	// what Ruleset shows.
	last *state
	// gen is a ruleset generation at which the kernel held state; genOK
	// vouches for it: no commit but ours came between our knowing what
	// the table held and reading gen (see run and Drifted).
	gen   uint32
	genOK bool
	// driftDetail is what the last Drifted that found drift saw.
	driftDetail string
}

var (
	_ dataplane.Backend        = (*backend)(nil)
	_ dataplane.DriftChecker   = (*backend)(nil)
	_ dataplane.DriftDescriber = (*backend)(nil)
)

// Prepare implements dataplane.Backend: the parameters every Service's
// rules depend on (the settings and, in NodeCIDR mode, the node's pod
// CIDR).
func (b *backend) Prepare(_ context.Context, t *proxytable.Table) (string, error) {
	b.p = newParams(&b.cfg, t.Node)
	return b.p.fingerprint(), nil
}

// Full implements dataplane.Backend: one transaction rewriting the whole
// table. With a known state it is computed from memory (transactions are
// atomic, and the Driver asked Drifted whether anyone else changed the
// table); otherwise the table is listed first and its base chains and
// shared maps are recreated (see fullTransaction).
func (b *backend) Full(ctx context.Context, t *proxytable.Table) error {
	next := rebuildState(t, &b.p, b.last)
	var existing *inventory
	reset, gen, genOK := false, b.gen, b.genOK
	if b.state != nil {
		existing = b.state.inventory()
	} else {
		// The generation is read before listing: a commit between the
		// two makes the next check list again rather than miss it.
		var err error
		gen, err = b.k.Gen(ctx)
		genOK = err == nil
		if existing, err = b.k.List(ctx); err != nil {
			return fmt.Errorf("listing the %v table: %w", b.cfg.Family, err)
		}
		reset = true
	}
	if err := b.run(ctx, fullTransaction(next, existing, reset), false, gen, genOK); err != nil {
		return err
	}
	b.state, b.last = next, next
	return nil
}

// Partial implements dataplane.Backend: one transaction rewriting the
// changed Services' chains, sets and map elements, none when nothing of
// this family changed.
func (b *backend) Partial(ctx context.Context, t *proxytable.Table, changed []string) error {
	ch := computeChange(b.state, t, changed, &b.p)
	if err := b.run(ctx, partialTransaction(b.state, ch), true, b.gen, b.genOK); err != nil {
		return err
	}
	b.state.apply(ch)
	return nil
}

// run runs tx, and on success records the generation it left: trusted
// (genOK) when it follows gen, the generation at which the kernel was
// known to hold what tx was computed from, by exactly one commit, ours.
func (b *backend) run(ctx context.Context, tx *transaction, partial bool, gen uint32, genOK bool) error {
	if err := b.k.Run(ctx, tx); err != nil {
		var te *TransactionError
		if errors.As(err, &te) {
			te.Partial = partial
		}
		return err
	}
	if tx.empty() {
		return nil // nothing sent: the generation is what it was
	}
	// A failure here fails nothing: the transaction is in. Not knowing
	// the generation only makes the next full sync list the table.
	cur, err := b.k.Gen(ctx)
	b.gen, b.genOK = cur, err == nil && genOK && cur == nextGen(gen)
	return nil
}

// nextGen is the generation after g: nf_tables skips 0 when it wraps.
func nextGen(g uint32) uint32 {
	if g+1 == 0 {
		return 1
	}
	return g + 1
}

// Cleanup implements dataplane.Cleaner: it deletes the family's table,
// and with it every chain, map and set in it, in one transaction.
func (b *backend) Cleanup(ctx context.Context) error {
	existing, err := b.k.List(ctx)
	if err != nil {
		return fmt.Errorf("listing the table: %w", err)
	}
	if existing == nil {
		return nil
	}
	tx := &transaction{}
	tx.add(op{kind: opDeleteTable})
	if err := b.k.Run(ctx, tx); err != nil {
		return err
	}
	b.last = nil
	return nil
}

// Leftovers lists what Cleanup would remove: the family's table, with
// how many chains and sets it holds, or nothing when there is none. For
// logs; read-only.
func (d *Dataplane) Leftovers(ctx context.Context) ([]string, error) {
	inv, err := d.b.k.List(ctx)
	if err != nil || inv == nil {
		return nil, err
	}
	return []string{fmt.Sprintf("table %v %s (%d chains, %d sets and maps)", d.b.cfg.Family, TableName, len(inv.chains), len(inv.sets))}, nil
}

// Forget implements dataplane.Backend: the next full sync lists the table.
func (b *backend) Forget() {
	b.state, b.genOK = nil, false
}

// Drifted implements dataplane.DriftChecker. The Driver asks before a
// full sync whether the table may have changed behind our back (an
// operator's nft command, a CNI reinstall deleting the table or a chain),
// which a full sync from memory would trip over: it flushes the chains and
// maps it believes exist. Rules and elements need no checking, as that
// full sync flushes and refills them all anyway.
//
// First the ruleset generation: when it is still the one vouched for,
// nothing changed anywhere (one small netlink round trip). Any other
// commit in the namespace bumps it too (kubelet's and a CNI's iptables-nft
// rules, firewalld), so a changed generation only says "maybe": then the
// table's chains and sets are listed (names only) and compared with the
// state's inventory, and drift is reported only when they differ.
// Reporting drift on every changed generation would cost the same listing
// (the full sync would list instead) but recreate the base chains and
// shared maps for nothing, and make the drift count, a signal of
// tampering, count every other program's commits.
func (b *backend) Drifted(ctx context.Context) (bool, error) {
	if b.state == nil {
		return false, nil // Full lists the table anyway
	}
	gen, err := b.k.Gen(ctx)
	if err != nil {
		return false, err
	}
	if b.genOK && gen == b.gen {
		return false, nil
	}
	inv, err := b.k.List(ctx)
	if err != nil {
		return false, fmt.Errorf("listing the %v table: %w", b.cfg.Family, err)
	}
	if want := b.state.inventory(); !inv.equal(want) {
		b.driftDetail = fmt.Sprintf("%v table %s: %s", b.cfg.Family, TableName, inv.diff(want))
		return true, nil
	}
	// The table held state at gen: the listing came after reading it.
	b.gen, b.genOK = gen, true
	return false, nil
}

// DriftDetail implements dataplane.DriftDescriber: what the last Drifted
// that found drift saw.
func (b *backend) DriftDetail() string { return b.driftDetail }

// diff describes how inv, the kernel's, differs from want, ours.
func (inv *inventory) diff(want *inventory) string {
	switch {
	case inv == nil:
		return "deleted"
	case want == nil:
		return "present, but not ours"
	}
	var parts []string
	for _, d := range []struct {
		what       string
		have, want map[string]bool
	}{{"chains", inv.chains, want.chains}, {"sets and maps", inv.sets, want.sets}} {
		var missing, added, changed []string
		for name, v := range d.want {
			hv, ok := d.have[name]
			switch {
			case !ok:
				missing = append(missing, name)
			case hv != v:
				changed = append(changed, name)
			}
		}
		for name := range d.have {
			if _, ok := d.want[name]; !ok {
				added = append(added, name)
			}
		}
		for _, l := range []struct {
			how   string
			names []string
		}{{"deleted", missing}, {"added", added}, {"changed", changed}} {
			if len(l.names) > 0 {
				parts = append(parts, fmt.Sprintf("%s %s %s", d.what, l.how, shortList(l.names)))
			}
		}
	}
	return strings.Join(parts, "; ")
}

// shortList lists up to three names, sorted, and how many more.
func shortList(names []string) string {
	slices.Sort(names)
	if len(names) <= 3 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:3], ", "), len(names)-3)
}

// equal reports whether inv and o hold the same objects of the same
// kinds; a nil inventory (no table) equals only another.
func (inv *inventory) equal(o *inventory) bool {
	if inv == nil || o == nil {
		return inv == o
	}
	return maps.Equal(inv.chains, o.chains) && maps.Equal(inv.sets, o.sets)
}
