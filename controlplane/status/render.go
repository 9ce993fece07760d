package status

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
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

// WriteJSON prints the report as indented JSON, for scripts.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	return nil
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
	msg := strings.Join(strings.Fields(r.NackError), " ")
	if utf8.RuneCountInString(msg) > maxNackText {
		msg = string([]rune(msg)[:maxNackText]) + "…"
	}
	return cell(r.NackedVersion + ": " + msg)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return cell(s)
}

// cell keeps a value from breaking the table: node names and addresses
// come from agents and flags, and a tab or newline would shift columns.
func cell(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}
