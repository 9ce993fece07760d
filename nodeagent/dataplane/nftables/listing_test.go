package nftables

import (
	"slices"
	"strings"
)

// normalizeListing makes "nft list table" output comparable between two
// tables holding the same ruleset programmed in different orders: the
// top-level blocks (sets, maps, chains) are sorted by header, and so are
// the elements of each set. Rule order inside a chain is kept: it is
// semantic.
func normalizeListing(s string) string {
	var blocks []string
	var cur []string
	for _, line := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(line, "table ") || line == "}" || line == "":
			continue
		case strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "\t\t") && strings.HasSuffix(line, "{"):
			cur = []string{line}
		case line == "\t}":
			blocks = append(blocks, normalizeBlock(cur))
			cur = nil
		default:
			cur = append(cur, line)
		}
	}
	slices.Sort(blocks)
	return strings.Join(blocks, "\n")
}

// normalizeBlock sorts a block's elements and drops what the kernel adds
// on its own (a dynamic set's size).
func normalizeBlock(lines []string) string {
	var out []string
	var elems []string
	in := false
	for _, line := range lines {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "size ") {
			continue
		}
		if rest, ok := strings.CutPrefix(t, "elements = {"); ok {
			in, t = true, rest
		}
		if !in {
			out = append(out, line)
			continue
		}
		end := strings.HasSuffix(t, "}")
		t = strings.TrimSuffix(t, "}")
		for _, e := range strings.Split(t, ",") {
			if e = strings.TrimSpace(e); e != "" {
				elems = append(elems, e)
			}
		}
		if end {
			in = false
		}
	}
	slices.Sort(elems)
	if len(elems) > 0 {
		out = append(out, "\t\telements = { "+strings.Join(elems, ", ")+" }")
	}
	return strings.Join(out, "\n")
}
