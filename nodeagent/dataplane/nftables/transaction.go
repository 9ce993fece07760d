package nftables

import (
	"iter"
	"strconv"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// opKind is one kind of transaction operation.
type opKind uint8

const (
	opAddTable opKind = iota
	opDeleteTable
	opAddChain
	opFlushChain
	opDeleteChain
	opAddRule
	opAddSet
	opFlushSet
	opDeleteSet
	opAddElements
	opDeleteElements
)

// op is one operation of a transaction. Which fields are used depends on
// kind: chain for opAddChain; name (a chain) and rule for opAddRule; name
// for flushes and deletions (vmap says whether a set is a map, for the
// text); set and elems (or elemSeq) for element operations; set for
// opAddSet.
type op struct {
	kind  opKind
	name  string
	vmap  bool
	chain *chain
	rule  *rule
	set   *set
	elems []element
	// elemSeq, when set, yields the elements and their owners instead of
	// elems and owners: a full sync's shared sets, read from the state
	// as they are encoded rather than copied into lists (the hairpin
	// set alone holds one element per endpoint).
	elemSeq iter.Seq2[element, string]
	// owner is the Service the object belongs to, "" for shared ones:
	// what a refused operation is blamed on. Element operations carry
	// the owner of each element in owners instead.
	owner  string
	owners []string
}

// eachElem calls yield with each element of an element operation, its
// index in the operation and the Service it is blamed on, until yield
// returns false.
func (o *op) eachElem(yield func(j int, e element, owner string) bool) {
	if o.elemSeq != nil {
		j := 0
		for e, owner := range o.elemSeq {
			if !yield(j, e, owner) {
				return
			}
			j++
		}
		return
	}
	for j, e := range o.elems {
		owner := o.owner
		if j < len(o.owners) {
			owner = o.owners[j]
		}
		if !yield(j, e, owner) {
			return
		}
	}
}

// element returns the operation narrowed to its i-th element: what a
// refused element is reported as.
func (o *op) element(i int) *op {
	n := *o
	n.elems, n.owners, n.elemSeq = nil, nil, nil
	o.eachElem(func(j int, e element, owner string) bool {
		if j == i {
			n.elems, n.owner = []element{e}, owner
			return false
		}
		return true
	})
	return &n
}

// transaction is a list of operations the kernel applies atomically, in
// order, on the family's table. It is what the kernel seam runs, what the
// fake kernel of the tests interprets, and what text renders as nft
// commands: one description for every path.
//
// A partial sync's few operations are a list (ops). A full sync's are
// generated (gen) from the state each time the transaction is read: at
// 250,000 endpoints the list, with copies of the shared sets' elements,
// was 31-70 MiB held beside the state and the batch encoded from it.
type transaction struct {
	ops []op
	// gen, when set, calls yield with each operation in order until it
	// returns false. The op it points to is valid only during the call:
	// generators reuse it.
	gen func(yield func(*op) bool)
}

func (tx *transaction) add(ops ...op) { tx.ops = append(tx.ops, ops...) }

// each calls yield with each operation and its index, in order, until
// yield returns false. The op is valid only during the call.
func (tx *transaction) each(yield func(i int, o *op) bool) {
	if tx.gen == nil {
		for i := range tx.ops {
			if !yield(i, &tx.ops[i]) {
				return
			}
		}
		return
	}
	i := 0
	tx.gen(func(o *op) bool {
		ok := yield(i, o)
		i++
		return ok
	})
}

// op returns a copy of the i-th operation, nil if there is none: what a
// refusal names.
func (tx *transaction) op(i int) *op {
	var found *op
	tx.each(func(j int, o *op) bool {
		if j == i {
			c := *o
			found = &c
			return false
		}
		return true
	})
	return found
}

// empty reports whether tx changes nothing.
func (tx *transaction) empty() bool { return tx.gen == nil && len(tx.ops) == 0 }

// text renders tx as an nft script (nft -f) with the same effect.
func (tx *transaction) text(f dataplane.Family) string {
	var b strings.Builder
	tx.each(func(_ int, o *op) bool {
		o.writeText(&b, f)
		b.WriteByte('\n')
		return true
	})
	return b.String()
}

// text renders one operation as an nft command.
func (o *op) text(f dataplane.Family) string {
	var b strings.Builder
	o.writeText(&b, f)
	return b.String()
}

func (o *op) writeText(b *strings.Builder, f dataplane.Family) {
	table := nftFamily(f) + " " + TableName
	setWord := func(vmap bool) string {
		if vmap {
			return "map"
		}
		return "set"
	}
	switch o.kind {
	case opAddTable:
		b.WriteString("add table " + table)
	case opDeleteTable:
		b.WriteString("delete table " + table)
	case opAddChain:
		b.WriteString("add chain " + table + " " + o.chain.name)
		if h := o.chain.hook; h != nil {
			b.WriteString(" { " + h.text() + " }")
		}
	case opFlushChain:
		b.WriteString("flush chain " + table + " " + o.name)
	case opDeleteChain:
		b.WriteString("delete chain " + table + " " + o.name)
	case opAddRule:
		b.WriteString("add rule " + table + " " + o.name + " " + o.rule.String(f))
	case opAddSet:
		b.WriteString("add " + setWord(o.set.isMap()) + " " + table + " " + o.set.name + " { " + strings.Join(o.set.declaration(f), "; ") + "; }")
	case opFlushSet:
		b.WriteString("flush " + setWord(o.vmap) + " " + table + " " + o.name)
	case opDeleteSet:
		b.WriteString("delete " + setWord(o.vmap) + " " + table + " " + o.name)
	case opAddElements, opDeleteElements:
		if o.kind == opAddElements {
			b.WriteString("add element " + table + " " + o.set.name + " { ")
		} else {
			b.WriteString("delete element " + table + " " + o.set.name + " { ")
		}
		o.eachElem(func(i int, e element, _ string) bool {
			if i > 0 {
				b.WriteString(", ")
			}
			if o.kind == opAddElements {
				b.WriteString(o.set.elemText(e))
			} else {
				b.WriteString(e.key.text(o.set.key))
			}
			return true
		})
		b.WriteString(" }")
	}
}

// text is a base chain's declaration.
func (h *baseHook) text() string {
	return "type " + h.typ + " hook " + h.hook + " priority " + strconv.Itoa(h.priority) + "; policy accept;"
}

// declaration is a set's body, one statement a line.
func (s *set) declaration(f dataplane.Family) []string {
	if s.endpoints {
		// numgen's integer has no type name: nft takes it only by
		// typeof (the kernel stores the typeof in the set's user data).
		return []string{"typeof numgen random mod 1 : " + nftFamily(f) + " daddr . th dport"}
	}
	out := []string{"type " + s.typeText(f)}
	if s.timeout > 0 {
		out = append(out, "flags dynamic,timeout", "timeout "+strconv.Itoa(int(s.timeout.Seconds()))+"s")
	}
	return out
}

// rulesetText renders st as one nft table block, the form nft list shows
// and the goldens hold: sets with their elements, then chains, skeleton
// first and Services in key order. Loaded with nft -f into a namespace
// without the table it programs what a full sync programs.
func rulesetText(st *state, f dataplane.Family) string {
	var b strings.Builder
	b.WriteString("table " + nftFamily(f) + " " + TableName + " {\n")
	writeSet := func(s *set, els iter.Seq2[element, string]) {
		word := "set"
		if s.isMap() {
			word = "map"
		}
		b.WriteString("\t" + word + " " + s.name + " {\n")
		for _, line := range s.declaration(f) {
			b.WriteString("\t\t" + line + "\n")
		}
		first := true
		for e := range els {
			if first {
				b.WriteString("\t\telements = {\n")
				first = false
			}
			b.WriteString("\t\t\t" + s.elemText(e) + ",\n")
		}
		if !first {
			b.WriteString("\t\t}\n")
		}
		b.WriteString("\t}\n")
	}
	writeChain := func(c *chain) {
		b.WriteString("\tchain " + c.name + " {\n")
		if c.hook != nil {
			b.WriteString("\t\t" + c.hook.text() + "\n")
		}
		for _, r := range c.rules {
			b.WriteString("\t\t" + r.String(f) + "\n")
		}
		b.WriteString("\t}\n")
	}
	keys := sortedKeys(st.services)
	for _, s := range st.sets {
		writeSet(s, st.sharedElements(keys, s.name))
	}
	for _, k := range keys {
		fr := st.services[k]
		for _, s := range fr.sets {
			writeSet(s, endpointElements(fr.epMaps[s.name], k))
		}
	}
	for _, c := range st.chains {
		writeChain(c)
	}
	for _, k := range keys {
		for _, c := range st.services[k].chains {
			writeChain(c)
		}
	}
	b.WriteString("}\n")
	return b.String()
}
