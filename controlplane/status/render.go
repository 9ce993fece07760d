package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
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
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\t%s\n", adminclient.Cell(r.Node), replicaCell(r), orDash(r.AckedVersion), lagCell(r), nackCell(r))
	}
	_, err := io.WriteString(tw, b.String())
	if err := errors.Join(err, tw.Flush()); err != nil {
		return err
	}
	return writeSections(w, rep)
}

// writeSections prints, after the nodes, the drift repairs when any node
// reported one, and the latest changes when there are any.
func writeSections(w io.Writer, rep *Report) error {
	if slices.ContainsFunc(rep.Nodes, func(r Row) bool { return len(r.Drift) > 0 }) {
		if _, err := io.WriteString(w, "\nDRIFT REPAIRED: rules changed behind the agent's back, which it put back\n"); err != nil {
			return err
		}
		if err := WriteDrift(w, rep.Nodes); err != nil {
			return err
		}
	}
	if len(rep.Changes) > 0 {
		if _, err := io.WriteString(w, "\nCONVERGENCE: time from each change's start until that share of the agents whose table it alters had acknowledged it\n"); err != nil {
			return err
		}
		return WriteChanges(w, rep.Changes)
	}
	return nil
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
	_, err := w.Write(adminclient.EscapeJSON(b.Bytes()))
	return err
}

func replicaCell(r Row) string {
	if !r.Connected {
		return "not connected"
	}
	s := r.Replica
	if len(r.AlsoConnected) > 0 {
		s += " (also " + strings.Join(r.AlsoConnected, ", ") + ")"
	}
	return adminclient.Cell(s)
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
	msg := []rune(adminclient.Cell(strings.Join(strings.Fields(r.NackError), " ")))
	if len(msg) > maxNackText {
		msg = append(msg[:maxNackText], '…')
	}
	return adminclient.Cell(r.NackedVersion) + ": " + string(msg)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return adminclient.Cell(s)
}
