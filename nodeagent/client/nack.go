package client

import (
	"fmt"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Bounds on a NACK's detail. A table of 10,000 invalid entries would
// otherwise NACK with megabytes (each entry's error twice: in the text
// and in its EntryError), past what the control plane accepts from an
// agent (--max-recv-message-bytes, 1 MiB at least): the NACK would end
// the stream instead of being recorded, and the agent would reconnect,
// receive the same table and NACK it again. Bounded, a NACK is at most
// about 160 KiB; the agent's log keeps the whole error.
const (
	maxNackErrorBytes  = 8 << 10
	maxNackEntryErrors = 100
	maxEntryKeyBytes   = 512
	maxEntryErrorBytes = 1 << 10
)

// newNack is the NACK of the response (version, nonce) that failed with
// err, its detail bounded.
func newNack(version, nonce string, err error, entries []*pb.EntryError) *pb.Nack {
	n := &pb.Nack{Version: version, Nonce: nonce, Error: truncate(err.Error(), maxNackErrorBytes)}
	for i, e := range entries {
		if i == maxNackEntryErrors {
			n.EntryErrors = append(n.EntryErrors, &pb.EntryError{Error: fmt.Sprintf("and %d more entries", len(entries)-i)})
			break
		}
		n.EntryErrors = append(n.EntryErrors, &pb.EntryError{
			Key: truncate(e.GetKey(), maxEntryKeyBytes), Error: truncate(e.GetError(), maxEntryErrorBytes),
		})
	}
	return n
}

// truncate cuts s to at most max bytes, on a rune boundary, saying so.
func truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const more = "... (truncated)"
	return proxytable.CutUTF8(s, max-len(more)) + more
}
