package nftables

import (
	"iter"
	"maps"
	"net/netip"
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
	hairpin map[hairpinKey]int32
	// fingerprint is that of the parameters the fragments were built
	// for (params.fingerprint).
	fingerprint string
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
func buildState(t *proxytable.Table, p *params) *state { return rebuildState(t, p, nil) }

// rebuildState computes the ruleset of t for p, taking from prev (nil
// for none) the fragment of every Service whose entry is the one prev's
// was built from, when prev was built for the same parameters: a fragment
// is a function of the two alone, and a table keeps the entries a delta
// does not change. A periodic full sync of an unchanged table then holds
// one set of fragments, not two (at 5,000 Services x 50 endpoints, 37
// MiB), and builds none. When every fragment is prev's, prev is the
// state: its claims and counts are those of the same fragments.
func rebuildState(t *proxytable.Table, p *params, prev *state) *state {
	st := &state{services: make(map[string]*fragment, len(t.Entries)), fingerprint: p.fingerprint()}
	var reuse map[string]*fragment
	if prev != nil && prev.fingerprint == st.fingerprint {
		reuse = prev.services
	}
	keys := t.Keys()
	n, reused := 0, 0
	for _, k := range keys {
		e := t.Entries[k]
		fr := reuse[k]
		if fr != nil && fr.entry == e {
			reused++
		} else {
			fr = fragmentOf(e, p)
		}
		if fr != nil {
			st.services[k] = fr
			n += len(fr.elems)
		}
	}
	if reuse != nil && reused == len(reuse) && len(st.services) == reused {
		return prev
	}
	st.chains, st.sets = skeleton(p)
	// Sized once: a map grown by doublings holds up to twice the room
	// it needs, and leaves the smaller tables as garbage.
	st.claims = make(map[elemID]*claim, n)
	eps := 0
	for _, fr := range st.services {
		eps += len(fr.hairpin)
	}
	st.hairpin = make(map[hairpinKey]int32, eps)
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

// sharedElements yields the programmed elements of the shared set named
// set with the Service owning each, in the order of the Services owning
// them (keys, sorted), then of their fragments: deterministic without
// sorting tens of thousands of keys, and read from the state rather than
// copied (the hairpin set holds one element per endpoint).
func (st *state) sharedElements(keys []string, set string) iter.Seq2[element, string] {
	if set == setHairpin {
		return st.hairpinElements(keys)
	}
	return func(yield func(element, string) bool) {
		for _, k := range keys {
			for _, r := range st.services[k].elems {
				if r.set != set {
					continue
				}
				if owner, _, _ := st.claims[r.id()].winner(); owner == k && !yield(r.element, k) {
					return
				}
			}
		}
	}
}

// hairpinElements yields the hairpin set's elements, each once, from the
// first Service wanting it. Only keys more than one Service wants need
// remembering: a count of one is its only Service.
func (st *state) hairpinElements(keys []string) iter.Seq2[element, string] {
	return func(yield func(element, string) bool) {
		var done map[hairpinKey]struct{}
		for _, k := range keys {
			for _, h := range st.services[k].hairpin {
				if st.hairpin[h] > 1 {
					if _, ok := done[h]; ok {
						continue
					}
					if done == nil {
						done = map[hairpinKey]struct{}{}
					}
					done[h] = struct{}{}
				}
				if !yield(element{key: h.elemKey()}, k) {
					return
				}
			}
		}
	}
}

// endpointElements yields the elements of an endpoint map holding eps,
// each owned by Service k.
func endpointElements(eps []netip.AddrPort, k string) iter.Seq2[element, string] {
	return func(yield func(element, string) bool) {
		for i, ep := range eps {
			if !yield(endpointElement(i, ep), k) {
				return
			}
		}
	}
}

// endpointElement is an endpoint map's element of index i.
func endpointElement(i int, ep netip.AddrPort) element {
	return element{key: elemKey{index: uint32(i)}, endpoint: ep}
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
//
// The operations are generated from next each time the transaction is
// read (see transaction), not held.
func fullTransaction(next *state, existing *inventory, reset bool) *transaction {
	return &transaction{gen: func(yield func(*op) bool) { fullOps(next, existing, reset, yield) }}
}

// fullOps calls yield with each operation of fullTransaction until it
// returns false. One op is reused: yield must not keep it.
func fullOps(next *state, existing *inventory, reset bool, yield func(*op) bool) {
	var o op
	emit := func(x op) bool {
		o = x
		return yield(&o)
	}
	if !emit(op{kind: opAddTable}) {
		return
	}
	if existing != nil {
		want := next.inventory()
		wantChains, wantSets := want.chains, want.sets
		names := slices.Sorted(maps.Keys(existing.chains))
		for _, c := range names {
			if !emit(op{kind: opFlushChain, name: c}) {
				return
			}
		}
		// Map elements refer to chains: flush or delete the maps before
		// deleting chains. Flushed rules no longer refer to anything.
		for _, s := range slices.Sorted(maps.Keys(existing.sets)) {
			_, wanted := wantSets[s]
			switch {
			case !wanted || (reset && !isServiceObject(s)):
				if !emit(op{kind: opDeleteSet, name: s, vmap: existing.sets[s]}) {
					return
				}
			case !isServiceObject(s) || existing.sets[s]:
				// Shared sets and the Services' endpoint maps are
				// refilled; affinity sets (not maps) keep their clients.
				if !emit(op{kind: opFlushSet, name: s, vmap: existing.sets[s]}) {
					return
				}
			}
		}
		for _, c := range names {
			_, wanted := wantChains[c]
			if !wanted || (reset && existing.chains[c]) {
				if !emit(op{kind: opDeleteChain, name: c}) {
					return
				}
			}
		}
	}
	keys := slices.Sorted(maps.Keys(next.services))
	for _, s := range next.sets {
		if !emit(op{kind: opAddSet, set: s}) {
			return
		}
	}
	for _, k := range keys {
		for _, s := range next.services[k].sets {
			if !emit(op{kind: opAddSet, set: s, owner: k}) {
				return
			}
		}
	}
	for _, c := range next.chains {
		if !emit(op{kind: opAddChain, chain: c}) {
			return
		}
	}
	for _, k := range keys {
		for _, c := range next.services[k].chains {
			if !emit(op{kind: opAddChain, chain: c, owner: k}) {
				return
			}
		}
	}
	for _, c := range next.chains {
		for i := range c.rules {
			if !emit(op{kind: opAddRule, name: c.name, rule: &c.rules[i]}) {
				return
			}
		}
	}
	for _, k := range keys {
		for _, c := range next.services[k].chains {
			for i := range c.rules {
				if !emit(op{kind: opAddRule, name: c.name, rule: &c.rules[i], owner: k}) {
					return
				}
			}
		}
	}
	for _, s := range next.sets {
		els := next.sharedElements(keys, s.name)
		for range els {
			// Only a set with elements gets an operation.
			if !emit(op{kind: opAddElements, set: s, elemSeq: els}) {
				return
			}
			break
		}
	}
	for _, k := range keys {
		fr := next.services[k]
		for _, s := range fr.sets {
			if eps := fr.epMaps[s.name]; len(eps) > 0 {
				if !emit(op{kind: opAddElements, set: s, elemSeq: endpointElements(eps, k), owner: k}) {
					return
				}
			}
		}
	}
}

// change is a partial sync's new fragments: nil for a Service removed (or
// without a cluster IP of the family any more).
type change struct {
	services map[string]*fragment
	claims   map[elemID]*claim
	// hairpin is the change of each hairpin count, and owner the changed
	// Service an element added or deleted is blamed on.
	hairpin      map[hairpinKey]int32
	hairpinOwner map[hairpinKey]string
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
				if d := endpointsGone(old.epMaps[s.name], cur.epMaps[s.name]); len(d) > 0 {
					delOwn = append(delOwn, op{kind: opDeleteElements, set: s, elems: d, owner: k})
				}
				if a := endpointsGone(cur.epMaps[s.name], old.epMaps[s.name]); len(a) > 0 {
					addOwn = append(addOwn, op{kind: opAddElements, set: s, elems: a, owner: k})
				}
			}
		}
		if cur != nil {
			for _, s := range cur.sets {
				if !hasSet(old, s.name) {
					addSets = append(addSets, op{kind: opAddSet, set: s, owner: k})
					if eps := cur.epMaps[s.name]; len(eps) > 0 {
						addOwn = append(addOwn, op{kind: opAddElements, set: s, elemSeq: endpointElements(eps, k), owner: k})
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
	slices.SortFunc(hairpin, compareHairpin)
	for _, h := range hairpin {
		before := prev.hairpin[h]
		after := before + ch.hairpin[h]
		switch {
		case before > 0 && after <= 0:
			put(delElems, setHairpin, element{key: h.elemKey()}, ch.hairpinOwner[h])
		case before <= 0 && after > 0:
			put(addElems, setHairpin, element{key: h.elemKey()}, ch.hairpinOwner[h])
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
			fr = fragmentOf(e, p)
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
	ch.hairpin, ch.hairpinOwner = map[hairpinKey]int32{}, map[hairpinKey]string{}
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

// endpointsGone returns the elements of an endpoint map holding a that
// one holding b does not hold with the same value: what to delete going
// from a to b, or, swapped, to add. An element's key is its index, so
// endpoints are compared index by index.
func endpointsGone(a, b []netip.AddrPort) []element {
	var out []element
	for i, ep := range a {
		if i >= len(b) || b[i] != ep {
			out = append(out, endpointElement(i, ep))
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
