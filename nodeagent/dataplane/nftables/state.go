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
	// hairpin counts the Services wanting each element of the hairpin
	// set; an element is programmed while its count is positive.
	hairpin map[elemKey]int32
}

// claim lists the Services wanting an element and the value each wants.
// A slice, not a map: almost every element has one owner, and a map
// per claim costs hundreds of bytes per Service port.
type claim struct {
	owners []claimant
}

// claimant is one Service's claim.
type claimant struct {
	key string
	v   verdict
}

// set records that Service k wants value v.
func (c *claim) set(k string, v verdict) {
	for i := range c.owners {
		if c.owners[i].key == k {
			c.owners[i].v = v
			return
		}
	}
	c.owners = append(c.owners, claimant{key: k, v: v})
}

// drop forgets Service k's claim.
func (c *claim) drop(k string) {
	c.owners = slices.DeleteFunc(c.owners, func(o claimant) bool { return o.key == k })
}

// winner returns the owner whose value is programmed.
func (c *claim) winner() (string, verdict, bool) {
	if c == nil || len(c.owners) == 0 {
		return "", verdict{}, false
	}
	best := 0
	for i := range c.owners {
		if c.owners[i].key < c.owners[best].key {
			best = i
		}
	}
	return c.owners[best].key, c.owners[best].v, true
}

func (c *claim) clone() *claim {
	if c == nil {
		return &claim{}
	}
	return &claim{owners: slices.Clone(c.owners)}
}

// buildState computes the ruleset of t for p.
func buildState(t *proxytable.Table, p *params) *state {
	st := &state{services: make(map[string]*fragment, len(t.Entries))}
	st.chains, st.sets = skeleton(p)
	keys := t.Keys()
	n := 0
	for _, k := range keys {
		if plan, ok := planService(t.Entries[k], p.family); ok {
			fr := buildService(p, plan)
			st.services[k] = fr
			n += len(fr.elems)
		}
	}
	// Sized once: the claims are the state's largest part.
	st.claims = make(map[elemID]*claim, n)
	st.hairpin = map[elemKey]int32{}
	for _, k := range keys {
		if fr := st.services[k]; fr != nil {
			for _, h := range fr.hairpin {
				st.hairpin[h]++
			}
		}
	}
	for _, k := range keys {
		fr := st.services[k]
		if fr == nil {
			continue
		}
		for _, r := range fr.elems {
			c := st.claims[r.id()]
			if c == nil {
				c = &claim{owners: make([]claimant, 0, 1)}
				st.claims[r.id()] = c
			}
			c.set(k, r.verdict)
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
		inv.sets[s.name] = s.isMap()
	}
	for _, fr := range st.services {
		for _, c := range fr.chains {
			inv.chains[c.name] = false
		}
		for _, s := range fr.sets {
			inv.sets[s.name] = s.isMap()
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
	keys := slices.Sorted(maps.Keys(st.services))
	// Count first, so that each set's list is allocated once.
	sizes := map[string]int{}
	for _, k := range keys {
		for _, r := range st.services[k].elems {
			sizes[r.set]++
		}
	}
	for _, k := range keys {
		for _, r := range st.services[k].elems {
			if owner, _, _ := st.claims[r.id()].winner(); owner == k {
				oe := out[r.set]
				if oe == nil {
					oe = &ownedElements{elems: make([]element, 0, sizes[r.set]), owners: make([]string, 0, sizes[r.set])}
					out[r.set] = oe
				}
				oe.elems = append(oe.elems, r.element)
				oe.owners = append(oe.owners, k)
			}
		}
	}
	// The hairpin set: each key once, from the first Service wanting it.
	if len(st.hairpin) > 0 {
		oe := &ownedElements{elems: make([]element, 0, len(st.hairpin)), owners: make([]string, 0, len(st.hairpin))}
		done := make(map[elemKey]struct{}, len(st.hairpin))
		for _, k := range keys {
			for _, h := range st.services[k].hairpin {
				if _, ok := done[h]; !ok {
					done[h] = struct{}{}
					oe.elems = append(oe.elems, element{key: h})
					oe.owners = append(oe.owners, k)
				}
			}
		}
		out[setHairpin] = oe
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
			case !isServiceObject(s) || existing.sets[s]:
				// Shared sets and the Services' endpoint maps are
				// refilled; affinity sets (not maps) keep their clients.
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
	for _, k := range keys {
		fr := next.services[k]
		for _, s := range fr.sets {
			if els := fr.setElems[s.name]; len(els) > 0 {
				tx.add(op{kind: opAddElements, set: s, elems: els, owner: k})
			}
		}
	}
	return tx
}

// change is a partial sync's new fragments: nil for a Service removed (or
// without a cluster IP of the family any more).
type change struct {
	services map[string]*fragment
	claims   map[elemID]*claim
	// hairpin is the change of each hairpin count, and owner the changed
	// Service an element added or deleted is blamed on.
	hairpin      map[elemKey]int32
	hairpinOwner map[elemKey]string
}

// partialTransaction rewrites what the changed Services need, over prev:
// their chains that changed or went away, their affinity sets, and the
// shared map elements they own. It returns an empty transaction when
// nothing changed for this family.
func partialTransaction(prev *state, ch *change) *transaction {
	tx := &transaction{}
	var flush, del, addChains, addRules, delSets, addSets, delOwn, addOwn []op
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
					delSets = append(delSets, op{kind: opDeleteSet, name: s.name, vmap: s.isMap(), owner: k})
					continue
				}
				// A Service's own map that stays: change only the
				// elements that differ (an endpoint moved is one).
				if d := elementsGone(old.setElems[s.name], cur.setElems[s.name]); len(d) > 0 {
					delOwn = append(delOwn, op{kind: opDeleteElements, set: s, elems: d, owner: k})
				}
				if a := elementsGone(cur.setElems[s.name], old.setElems[s.name]); len(a) > 0 {
					addOwn = append(addOwn, op{kind: opAddElements, set: s, elems: a, owner: k})
				}
			}
		}
		if cur != nil {
			for _, s := range cur.sets {
				if !hasSet(old, s.name) {
					addSets = append(addSets, op{kind: opAddSet, set: s, owner: k})
					if els := cur.setElems[s.name]; len(els) > 0 {
						addOwn = append(addOwn, op{kind: opAddElements, set: s, elems: els, owner: k})
					}
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
	hairpin := slices.Collect(maps.Keys(ch.hairpin))
	slices.SortFunc(hairpin, compareKeys)
	for _, h := range hairpin {
		before := prev.hairpin[h]
		after := before + ch.hairpin[h]
		switch {
		case before > 0 && after <= 0:
			put(delElems, setHairpin, element{key: h}, ch.hairpinOwner[h])
		case before <= 0 && after > 0:
			put(addElems, setHairpin, element{key: h}, ch.hairpinOwner[h])
		}
	}

	// Order matters: references go before what they refer to, new objects
	// before what refers to them.
	for _, s := range prev.sets {
		if oe := delElems[s.name]; oe != nil {
			tx.add(op{kind: opDeleteElements, set: s, elems: oe.elems, owners: oe.owners})
		}
	}
	tx.add(delOwn...)
	tx.add(flush...)
	tx.add(del...)
	tx.add(delSets...)
	tx.add(addSets...)
	tx.add(addOwn...)
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
					c.drop(k)
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
			ch.claims[r.id()].set(k, r.verdict)
		}
	}
	ch.hairpin, ch.hairpinOwner = map[elemKey]int32{}, map[elemKey]string{}
	// In key order, so that a refused hairpin element is blamed on the
	// same Service every time.
	for _, k := range sortedKeys(ch.services) {
		fr := ch.services[k]
		if old := prev.services[k]; old != nil {
			for _, h := range old.hairpin {
				ch.hairpin[h]--
				ch.hairpinOwner[h] = k
			}
		}
		if fr != nil {
			for _, h := range fr.hairpin {
				ch.hairpin[h]++
				ch.hairpinOwner[h] = k
			}
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
	for h, d := range ch.hairpin {
		if n := st.hairpin[h] + d; n > 0 {
			st.hairpin[h] = n
		} else {
			delete(st.hairpin, h)
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

// elementsGone returns the elements of a that b does not hold with the
// same value: what to delete going from a to b, or, swapped, to add. Both
// are indexed the same way (an endpoint map's element i is its i-th).
func elementsGone(a, b []element) []element {
	var out []element
	for i, e := range a {
		if i >= len(b) || b[i] != e {
			out = append(out, e)
		}
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
		return compareKeys(a.key, b.key)
	})
	return ids
}

func compareKeys(a, b elemKey) int {
	if c := a.addr.Compare(b.addr); c != 0 {
		return c
	}
	if a.proto != b.proto {
		return int(a.proto) - int(b.proto)
	}
	return int(a.port) - int(b.port)
}
