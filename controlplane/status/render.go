package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// maxNackText is how much of a NACK's error a table row shows; -o json
// has all of it.
const maxNackText = 60

// WriteTable prints one line per node under a header:
//
//	NODE    REPLICA         ACKED             LAG  LAST NACK
//	node-0  10.0.0.5:9640   0d87f81ad851cfb5  0s   -
//	node-1  not connected   21af2fdb213a065f  -    -
//
// LAG is how long the agent has been behind its replica's current world.
// A replica that still counts an older stream of the node is added in
// parentheses.
func WriteTable(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	var b strings.Builder
	b.WriteString("NODE\tREPLICA\tACKED\tLAG\tLAST NACK\n")
	for _, r := range rep.Nodes {
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\t%s\n", cell(r.Node), replicaCell(r), orDash(r.AckedVersion), lagCell(r), nackCell(r))
	}
	_, err := io.WriteString(tw, b.String())
	return errors.Join(err, tw.Flush())
}

// WriteJSON prints the report as indented JSON, for scripts. Every
// control character is written as a \u escape: encoding/json escapes
// only those below U+0020, and DEL, the C1 controls (U+009B is a CSI on
// its own) and the bidirectional overrides an agent puts in a NACK would
// otherwise reach the terminal of whoever reads the output.
func WriteJSON(w io.Writer, rep *Report) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	_, err := w.Write(escapeJSON(b.Bytes()))
	return err
}

// escapeJSON rewrites every rune from DEL up that is unsafe to show
// (unsafeRune) in encoded JSON as a \u escape. Outside strings JSON is
// ASCII, so every such rune is inside a string, where the escape means
// the same rune: the document decodes to the same values. Below DEL,
// encoding/json has escaped every control character inside strings, and
// those left (newlines, spaces) are its indentation; it has also turned
// invalid UTF-8 into U+FFFD.
func escapeJSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		// Every unsafe rune is in the Basic Multilingual Plane: one
		// \u escape, no surrogate pair.
		if r >= 0x7f && unsafeRune(r) {
			out = fmt.Appendf(out, "\\u%04x", r)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

func replicaCell(r Row) string {
	if !r.Connected {
		return "not connected"
	}
	s := r.Replica
	if len(r.AlsoConnected) > 0 {
		s += " (also " + strings.Join(r.AlsoConnected, ", ") + ")"
	}
	return cell(s)
}

func lagCell(r Row) string {
	if r.Lag == nil {
		return "-"
	}
	d := time.Duration(*r.Lag)
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

func nackCell(r Row) string {
	if r.NackedVersion == "" {
		return "-"
	}
	// Escaped before it is cut, so that an escape cannot widen the
	// column past maxNackText.
	msg := []rune(cell(strings.Join(strings.Fields(r.NackError), " ")))
	if len(msg) > maxNackText {
		msg = append(msg[:maxNackText], '…')
	}
	return cell(r.NackedVersion) + ": " + string(msg)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return cell(s)
}

// cell makes a value safe to print in the table: node names, NACK text
// and addresses come from agents and replicas. A tab or line break would
// shift columns, so it becomes a space. Every other control character
// (C0, DEL, C1: ESC[2J, OSC 8 links, a title change) and every
// bidirectional override, which could clear the screen or hide and
// reorder what the operator reads, is printed as a visible Go-style
// escape (\x1b, \u202e), as are bytes that are not UTF-8; the value
// stays readable and nothing reaches the terminal but printable text.
func cell(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case r == '\t' || r == '\n' || r == '\r':
			b.WriteByte(' ')
		case r < 0x100 && unsafeRune(r):
			fmt.Fprintf(&b, "\\x%02x", r)
		case unsafeRune(r):
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// unsafeRune reports whether r may change what a terminal shows rather
// than show itself: a control character (Unicode category Cc: C0, DEL,
// C1), a bidirectional control (U+061C, U+200E-F, U+202A-E, U+2066-9),
// or a line or paragraph separator.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029'
}
