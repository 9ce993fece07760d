package adminclient

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Cell makes a value safe to print in a table: node names, NACK text
// and addresses come from agents and replicas. A tab or line break would
// shift columns, so it becomes a space. Every other control character
// (C0, DEL, C1: ESC[2J, OSC 8 links, a title change) and every
// bidirectional override, which could clear the screen or hide and
// reorder what the operator reads, is printed as a visible Go-style
// escape (\x1b, \u202e), as are bytes that are not UTF-8; the value
// stays readable and nothing reaches the terminal but printable text.
func Cell(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case r < 0x100 && UnsafeRune(r):
			fmt.Fprintf(&b, "\\x%02x", r)
		case UnsafeRune(r):
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// EscapeJSON rewrites every rune from DEL up that is unsafe to show
// (UnsafeRune) in encoded JSON as a \u escape. Outside strings JSON is
// ASCII, so every such rune is inside a string, where the escape means
// the same rune: the document decodes to the same values. Below DEL,
// encoding/json has escaped every control character inside strings, and
// those left (newlines, spaces) are its indentation; it has also turned
// invalid UTF-8 into U+FFFD.
func EscapeJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		// Every unsafe rune is in the Basic Multilingual Plane: one
		// \u escape, no surrogate pair.
		if r >= 0x7f && UnsafeRune(r) {
			out = fmt.Appendf(out, "\\u%04x", r)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

// UnsafeRune reports whether r may change what a terminal shows rather
// than show itself: a control character (Unicode category Cc: C0, DEL,
// C1), a bidirectional control (U+061C, U+200E-F, U+202A-E, U+2066-9),
// or a line or paragraph separator.
func UnsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029'
}
