package nftables

import (
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
// text); set and elems for element operations; set for opAddSet.
type op struct {
	kind  opKind
	name  string
	vmap  bool
	chain *chain
	rule  *rule
	set   *set
	elems []element
	// owner is the Service the object belongs to, "" for shared ones:
	// what a refused operation is blamed on. Element operations carry
	// the owner of each element in owners instead.
	owner  string
	owners []string
}

// element returns the operation narrowed to its i-th element: what a
// refused element is reported as.
func (o *op) element(i int) *op {
	n := *o
	n.elems, n.owners = o.elems[i:i+1], nil
	if i < len(o.owners) {
		n.owner = o.owners[i]
	}
	return &n
}

// transaction is a list of operations the kernel applies atomically, in
// order, on the family's table. It is what the kernel seam runs, what the
// fake kernel of the tests interprets, and what text renders as nft
// commands: one description for every path.
type transaction struct {
	ops []op
}

func (tx *transaction) add(ops ...op) { tx.ops = append(tx.ops, ops...) }

// empty reports whether tx changes nothing.
func (tx *transaction) empty() bool { return len(tx.ops) == 0 }

// text renders tx as an nft script (nft -f) with the same effect.
func (tx *transaction) text(f dataplane.Family) string {
	var b strings.Builder
	for i := range tx.ops {
		tx.ops[i].writeText(&b, f)
		b.WriteByte('\n')
	}
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
		for i, e := range o.elems {
			if i > 0 {
				b.WriteString(", ")
			}
			if o.kind == opAddElements {
				b.WriteString(o.set.elemText(e))
			} else {
				b.WriteString(e.key.text(o.set.key))
			}
		}
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
	owned := st.elementsBySet()
	writeSet := func(s *set, els []element) {
		word := "set"
		if s.isMap() {
			word = "map"
		}
		b.WriteString("\t" + word + " " + s.name + " {\n")
		for _, line := range s.declaration(f) {
			b.WriteString("\t\t" + line + "\n")
		}
		if len(els) > 0 {
			b.WriteString("\t\telements = {\n")
			for _, e := range els {
				b.WriteString("\t\t\t" + s.elemText(e) + ",\n")
			}
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
		var els []element
		if oe := owned[s.name]; oe != nil {
			els = oe.elems
		}
		writeSet(s, els)
	}
	for _, k := range keys {
		fr := st.services[k]
		for _, s := range fr.sets {
			writeSet(s, fr.setElems[s.name])
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
