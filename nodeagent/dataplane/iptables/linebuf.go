package iptables

import (
	"bufio"
	"bytes"
	"io"
)

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

// restoreWriter receives restore input as a ruleset writes it, buffered,
// and counts its lines. To locate a failing line it keeps that line's
// text and owner (the Service that wrote it) instead: the input is never
// kept whole. After a write error it writes nothing more.
type restoreWriter struct {
	w     *bufio.Writer
	n     int64
	err   error
	lines int // written so far
	// find is the 1-based line to keep; 0 for none.
	find                int
	found               bool
	foundKey, foundText string
}

func newRestoreWriter(w io.Writer, find int) *restoreWriter {
	return &restoreWriter{w: bufio.NewWriterSize(w, 64<<10), find: find}
}

// fail records err unless an error came first.
func (o *restoreWriter) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// finish flushes the input and returns its size and the first error.
func (o *restoreWriter) finish() (int64, error) {
	if o.err == nil {
		o.fail(o.w.Flush())
	}
	return o.n, o.err
}

// owned writes n lines, b, written by key.
func (o *restoreWriter) owned(key string, b []byte, n int) {
	if o.err != nil || n == 0 {
		return
	}
	if o.lines < o.find && o.find <= o.lines+n {
		o.keep(key, b, o.find-o.lines)
	}
	m, err := o.w.Write(b)
	o.n += int64(m)
	o.fail(err)
	o.lines += n
}

// keep keeps line i (1-based) of b as the line found.
func (o *restoreWriter) keep(key string, b []byte, i int) {
	for ; i > 1; i-- {
		_, b, _ = bytes.Cut(b, []byte("\n"))
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	o.found, o.foundKey, o.foundText = true, key, string(line)
}

// raw writes one line of no Service.
func (o *restoreWriter) raw(s string) {
	if o.err != nil {
		return
	}
	if o.lines+1 == o.find {
		o.found, o.foundKey, o.foundText = true, "", s
	}
	m, _ := o.w.WriteString(s)
	err := o.w.WriteByte('\n')
	o.n += int64(m + 1)
	o.fail(err)
	o.lines++
}

// chainDecl writes the declaration of key's chain c.
func (o *restoreWriter) chainDecl(key, c string) {
	if o.err != nil {
		return
	}
	if o.lines+1 == o.find {
		o.found, o.foundKey, o.foundText = true, key, chainLine(c)
	}
	m1, _ := o.w.WriteString(":")
	m2, _ := o.w.WriteString(c)
	m3, err := o.w.WriteString(" - [0:0]\n")
	o.n += int64(m1 + m2 + m3)
	o.fail(err)
	o.lines++
}

// add writes l's lines, each owned by the key of the span it falls in
// ("" before the first).
func (o *restoreWriter) add(l *lineBuffer) {
	if o.err != nil || l.lines == 0 {
		return
	}
	if o.lines < o.find && o.find <= o.lines+l.lines {
		i := o.find - o.lines - 1 // 0-based in l
		key := ""
		for _, s := range l.spans {
			if s.line > i {
				break
			}
			key = s.key
		}
		o.keep(key, l.b, i+1)
	}
	m, err := o.w.Write(l.b)
	o.n += int64(m)
	o.fail(err)
	o.lines += l.lines
}
