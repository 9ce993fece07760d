package iptables

import "sort"

// lineBuffer accumulates iptables-restore lines and remembers which Service
// wrote which lines, so that a restore error's line number can name the
// Service (and the NACK can pin the failure to its entry).
type lineBuffer struct {
	b     []byte
	lines int
	spans []span
}

// span says that lines from line on (0-based, relative to the buffer)
// belong to key; "" means no Service.
type span struct {
	line int
	key  string
}

// owner attributes the lines written next to key.
func (l *lineBuffer) owner(key string) {
	if n := len(l.spans); n > 0 && l.spans[n-1].key == key {
		return
	}
	if n := len(l.spans); n > 0 && l.spans[n-1].line == l.lines {
		l.spans[n-1].key = key
		return
	}
	l.spans = append(l.spans, span{line: l.lines, key: key})
}

// write appends one line made of args separated by spaces.
func (l *lineBuffer) write(args ...string) {
	for i, a := range args {
		if i > 0 {
			l.b = append(l.b, ' ')
		}
		l.b = append(l.b, a...)
	}
	l.b = append(l.b, '\n')
	l.lines++
}

// writeN appends one line made of the concatenated parts, separated by
// spaces; it saves building one slice of arguments per rule.
func (l *lineBuffer) writeN(parts ...[]string) {
	first := true
	for _, p := range parts {
		for _, a := range p {
			if !first {
				l.b = append(l.b, ' ')
			}
			first = false
			l.b = append(l.b, a...)
		}
	}
	l.b = append(l.b, '\n')
	l.lines++
}

// mark returns the buffer's current position, for truncate.
func (l *lineBuffer) mark() bufMark { return bufMark{len(l.b), l.lines, len(l.spans)} }

// since returns the bytes written after m.
func (l *lineBuffer) since(m bufMark) []byte { return l.b[m.bytes:] }

// truncate forgets everything written after m.
func (l *lineBuffer) truncate(m bufMark) {
	l.b, l.lines, l.spans = l.b[:m.bytes], m.lines, l.spans[:m.spans]
}

type bufMark struct{ bytes, lines, spans int }

// assembler concatenates buffers into restore input and keeps the line
// ownership, now absolute (1-based, as iptables-restore reports lines).
type assembler struct {
	b     []byte
	lines int
	spans []span
}

func (a *assembler) raw(s string) {
	a.b = append(a.b, s...)
	a.b = append(a.b, '\n')
	a.lines++
	a.spans = append(a.spans, span{line: a.lines, key: ""})
}

func (a *assembler) add(l *lineBuffer) {
	if l.lines == 0 {
		return
	}
	base := a.lines
	a.spans = append(a.spans, span{line: base + 1, key: ""})
	for _, s := range l.spans {
		a.spans = append(a.spans, span{line: base + 1 + s.line, key: s.key})
	}
	a.b = append(a.b, l.b...)
	a.lines += l.lines
}

// lineOwners maps 1-based input lines to Service keys.
type lineOwners []span

// owner returns the key that wrote line, or "".
func (o lineOwners) owner(line int) string {
	i := sort.Search(len(o), func(i int) bool { return o[i].line > line })
	if i == 0 {
		return ""
	}
	return o[i-1].key
}
