package nftables

import (
	"maps"
	"slices"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// state is one family's whole ruleset as the Dataplane last programmed it
// (or is about to): the skeleton, each Service's fragment, and which
// Service owns each element of the shared maps. It is computed without
// I/O; Sync turns the difference between two states into a transaction.
type state struct {
	chains   []*chain // the skeleton's
	sets     []*set
	services map[string]*fragment
	// claims holds, for each element of a shared map or set, the
	// Services that want it. Two Services may claim the same key (two
	// Services with the same external IP and port: invalid, but the API
	// server does not stop it); the smallest key wins, as the first rule
	// would in iptables, and syncs never fail over it.
	claims map[elemID]*claim
}

// claim lists the Services wanting an element and the value each wants.
type claim struct {
	owners map[string]verdict
}

// winner returns the owner whose value is programmed.
func (c *claim) winner() (string, verdict, bool) {
	if c == nil || len(c.owners) == 0 {
		return "", verdict{}, false
	}
	best := ""
	for k := range c.owners {
		if best == "" || k < best {
			best = k
		}
	}
	return best, c.owners[best], true
}

func (c *claim) clone() *claim {
	if c == nil {
		return &claim{owners: map[string]verdict{}}
	}
	return &claim{owners: maps.Clone(c.owners)}
}

// buildState computes the ruleset of t for p.
func buildState(t *proxytable.Table, p *params) *state {
	st := &state{services: make(map[string]*fragment, len(t.Entries)), claims: map[elemID]*claim{}}
	st.chains, st.sets = skeleton(p)
	for _, k := range t.Keys() {
		if plan, ok := planService(t.Entries[k], p.family); ok {
			fr := buildService(p, plan)
			st.services[k] = fr
			for _, r := range fr.elems {
				c := st.claims[r.id()]
				if c == nil {
					c = &claim{owners: map[string]verdict{}}
					st.claims[r.id()] = c
				}
				c.owners[k] = r.verdict
			}
		}
	}
	return st
}

// inventory is what a table holds, by name: chains (true for base chains)
// and sets (true for verdict maps).
type inventory struct {
	chains map[string]bool
	sets   map[string]bool
}

// inventory lists st's objects, as they are in the kernel once st is.
func (st *state) inventory() *inventory {
	inv := &inventory{chains: map[string]bool{}, sets: map[string]bool{}}
	for _, c := range st.chains {
		inv.chains[c.name] = c.hook != nil
	}
	for _, s := range st.sets {
		inv.sets[s.name] = s.vmap
	}
	for _, fr := range st.services {
		for _, c := range fr.chains {
			inv.chains[c.name] = false
		}
		for _, s := range fr.sets {
			inv.sets[s.name] = false
		}
	}
	return inv
}

// sharedSet returns the skeleton set named name.
func (st *state) sharedSet(name string) *set {
	for _, s := range st.sets {
		if s.name == name {
			return s
		}
	}
	return nil
}

// ownedElements is a set's elements and the Service owning each.
type ownedElements struct {
	elems  []element
	owners []string
}

// elementsBySet returns the programmed elements of each shared set, in
// the order of the Services owning them (sorted keys), then of their
// fragments: deterministic without sorting tens of thousands of keys.
func (st *state) elementsBySet() map[string]*ownedElements {
	out := map[string]*ownedElements{}
	for _, k := range slices.Sorted(maps.Keys(st.services)) {
		for _, r := range st.services[k].elems {
			if owner, _, _ := st.claims[r.id()].winner(); owner == k {
				oe := out[r.set]
				if oe == nil {
					oe = &ownedElements{}
					out[r.set] = oe
				}
				oe.elems = append(oe.elems, r.element)
				oe.owners = append(oe.owners, k)
			}
		}
	}
	return out
}

// fullTransaction programs next over a table holding existing (nil when
// the table does not exist). Everything is rewritten in one transaction:
// existing chains are flushed and refilled, the shared maps flushed and
// refilled, and objects next does not have deleted once nothing refers to
// them. Affinity sets that stay are neither deleted nor flushed, so
// clients keep their endpoints across full syncs; that is why a full sync
// does not simply delete and recreate the table. With reset (the kernel's
// contents were listed, not known from a previous Sync) the base chains
// and shared maps are deleted and created again, so that a table left by
// another version, with other hooks or key types, is replaced.
func fullTransaction(next *state, existing *inventory, reset bool) *transaction {
	size := 1 + len(next.sets)
	for _, c := range next.chains {
		size += 1 + len(c.rules)
	}
	for _, fr := range next.services {
		size += len(fr.sets)
		for _, c := range fr.chains {
			size += 1 + len(c.rules)
		}
	}
	tx := &transaction{ops: make([]op, 0, size)}
	tx.add(op{kind: opAddTable})
	if existing != nil {
		want := next.inventory()
		wantChains, wantSets := want.chains, want.sets
		names := slices.Sorted(maps.Keys(existing.chains))
		for _, c := range names {
			tx.add(op{kind: opFlushChain, name: c})
		}
		// Map elements refer to chains: flush or delete the maps before
		// deleting chains. Flushed rules no longer refer to anything.
		for _, s := range slices.Sorted(maps.Keys(existing.sets)) {
			_, wanted := wantSets[s]
			switch {
			case !wanted || (reset && !isServiceObject(s)):
				tx.add(op{kind: opDeleteSet, name: s, vmap: existing.sets[s]})
			case !isServiceObject(s):
				tx.add(op{kind: opFlushSet, name: s, vmap: existing.sets[s]})
			}
		}
		for _, c := range names {
			_, wanted := wantChains[c]
			if !wanted || (reset && existing.chains[c]) {
				tx.add(op{kind: opDeleteChain, name: c})
			}
		}
	}
	keys := slices.Sorted(maps.Keys(next.services))
	for _, s := range next.sets {
		tx.add(op{kind: opAddSet, set: s})
	}
	for _, k := range keys {
		for _, s := range next.services[k].sets {
			tx.add(op{kind: opAddSet, set: s, owner: k})
		}
	}
	for _, c := range next.chains {
		tx.add(op{kind: opAddChain, chain: c})
	}
	for _, k := range keys {
		for _, c := range next.services[k].chains {
			tx.add(op{kind: opAddChain, chain: c, owner: k})
		}
	}
	for _, c := range next.chains {
		for i := range c.rules {
			tx.add(op{kind: opAddRule, name: c.name, rule: &c.rules[i]})
		}
	}
	for _, k := range keys {
		for _, c := range next.services[k].chains {
			for i := range c.rules {
				tx.add(op{kind: opAddRule, name: c.name, rule: &c.rules[i], owner: k})
			}
		}
	}
	elems := next.elementsBySet()
	for _, s := range next.sets {
		if oe := elems[s.name]; oe != nil {
			tx.add(op{kind: opAddElements, set: s, elems: oe.elems, owners: oe.owners})
		}
	}
	return tx
}

// change is a partial sync's new fragments: nil for a Service removed (or
// without a cluster IP of the family any more).
type change struct {
	services map[string]*fragment
	claims   map[elemID]*claim
}

// partialTransaction rewrites what the changed Services need, over prev:
// their chains that changed or went away, their affinity sets, and the
// shared map elements they own. It returns an empty transaction when
// nothing changed for this family.
func partialTransaction(prev *state, ch *change) *transaction {
	tx := &transaction{}
	var flush, del, addChains, addRules, delSets, addSets []op
	keys := slices.Sorted(maps.Keys(ch.services))
	for _, k := range keys {
		old, cur := prev.services[k], ch.services[k]
		if old == nil && cur == nil {
			continue
		}
		oldChains, curChains := chainsByName(old), chainsByName(cur)
		if old != nil {
			for _, c := range old.chains {
				n, ok := curChains[c.name]
				switch {
				case !ok:
					flush = append(flush, op{kind: opFlushChain, name: c.name, owner: k})
					del = append(del, op{kind: opDeleteChain, name: c.name, owner: k})
				case !sameRules(c.rules, n.rules):
					flush = append(flush, op{kind: opFlushChain, name: c.name, owner: k})
				}
			}
			for _, s := range old.sets {
				if !hasSet(cur, s.name) {
					delSets = append(delSets, op{kind: opDeleteSet, name: s.name, owner: k})
				}
			}
		}
		if cur != nil {
			for _, s := range cur.sets {
				if !hasSet(old, s.name) {
					addSets = append(addSets, op{kind: opAddSet, set: s, owner: k})
				}
			}
			for _, c := range cur.chains {
				o, ok := oldChains[c.name]
				if !ok {
					addChains = append(addChains, op{kind: opAddChain, chain: c, owner: k})
				}
				if !ok || !sameRules(o.rules, c.rules) {
					for i := range c.rules {
						addRules = append(addRules, op{kind: opAddRule, name: c.name, rule: &c.rules[i], owner: k})
					}
				}
			}
		}
	}

	// Elements: compare what is programmed (prev's winners) with what
	// will be, for every element a changed Service touches.
	delElems, addElems := map[string]*ownedElements{}, map[string]*ownedElements{}
	put := func(m map[string]*ownedElements, set string, e element, owner string) {
		oe := m[set]
		if oe == nil {
			oe = &ownedElements{}
			m[set] = oe
		}
		oe.elems = append(oe.elems, e)
		oe.owners = append(oe.owners, owner)
	}
	for _, id := range sortedIDs(ch.claims) {
		wasOwner, was, had := prev.claims[id].winner()
		nowOwner, now, has := ch.claims[id].winner()
		if had && (!has || was != now) {
			put(delElems, id.set, element{key: id.key, verdict: was}, wasOwner)
		}
		if has && (!had || was != now) {
			put(addElems, id.set, element{key: id.key, verdict: now}, nowOwner)
		}
	}

	// Order matters: references go before what they refer to, new objects
	// before what refers to them.
	for _, s := range prev.sets {
		if oe := delElems[s.name]; oe != nil {
			tx.add(op{kind: opDeleteElements, set: s, elems: oe.elems, owners: oe.owners})
		}
	}
	tx.add(flush...)
	tx.add(del...)
	tx.add(delSets...)
	tx.add(addSets...)
	tx.add(addChains...)
	tx.add(addRules...)
	for _, s := range prev.sets {
		if oe := addElems[s.name]; oe != nil {
			tx.add(op{kind: opAddElements, set: s, elems: oe.elems, owners: oe.owners})
		}
	}
	return tx
}

// computeChange builds the fragments of the changed keys and the claims
// on every element they touch, without modifying prev.
func computeChange(prev *state, t *proxytable.Table, changed []string, p *params) *change {
	ch := &change{services: map[string]*fragment{}, claims: map[elemID]*claim{}}
	for _, k := range changed {
		var fr *fragment
		if e := t.Entries[k]; e != nil {
			if plan, ok := planService(e, p.family); ok {
				fr = buildService(p, plan)
			}
		}
		ch.services[k] = fr
	}
	touch := func(fr *fragment) {
		if fr == nil {
			return
		}
		for _, r := range fr.elems {
			if _, ok := ch.claims[r.id()]; !ok {
				c := prev.claims[r.id()].clone()
				for k := range ch.services {
					delete(c.owners, k)
				}
				ch.claims[r.id()] = c
			}
		}
	}
	for k, fr := range ch.services {
		touch(prev.services[k])
		touch(fr)
	}
	for k, fr := range ch.services {
		if fr == nil {
			continue
		}
		for _, r := range fr.elems {
			ch.claims[r.id()].owners[k] = r.verdict
		}
	}
	return ch
}

// apply makes st the state after ch was programmed.
func (st *state) apply(ch *change) {
	for k, fr := range ch.services {
		if fr == nil {
			delete(st.services, k)
		} else {
			st.services[k] = fr
		}
	}
	for id, c := range ch.claims {
		if len(c.owners) == 0 {
			delete(st.claims, id)
		} else {
			st.claims[id] = c
		}
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func chainsByName(fr *fragment) map[string]*chain {
	if fr == nil {
		return nil
	}
	out := make(map[string]*chain, len(fr.chains))
	for _, c := range fr.chains {
		out[c.name] = c
	}
	return out
}

func hasSet(fr *fragment, name string) bool {
	if fr == nil {
		return false
	}
	return slices.ContainsFunc(fr.sets, func(s *set) bool { return s.name == name })
}

// sameRules compares two rule lists; every expression is a comparable
// value, so == on the interfaces compares them fully.
func sameRules(a, b []rule) bool {
	return slices.EqualFunc(a, b, func(x, y rule) bool { return slices.Equal(x.exprs, y.exprs) })
}

func sortedIDs(m map[elemID]*claim) []elemID {
	ids := slices.Collect(maps.Keys(m))
	slices.SortFunc(ids, func(a, b elemID) int {
		if c := strings.Compare(a.set, b.set); c != 0 {
			return c
		}
		if c := a.key.addr.Compare(b.key.addr); c != 0 {
			return c
		}
		if a.key.proto != b.key.proto {
			return int(a.key.proto) - int(b.key.proto)
		}
		return int(a.key.port) - int(b.key.port)
	})
	return ids
}
