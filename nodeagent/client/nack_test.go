package client

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestNackBounded: a table whose every entry is invalid NACKs with a
// message the control plane accepts (1 MiB is the least it may be set
// to), however large the table and its errors; a small NACK is as is.
func TestNackBounded(t *testing.T) {
	var entries []*pb.EntryError
	var text []string
	for i := range 10000 {
		e := &pb.EntryError{Key: fmt.Sprintf("default/svc-%05d", i), Error: strings.Repeat("é", 800)}
		entries = append(entries, e)
		text = append(text, e.Key+": "+e.Error)
	}
	n := newNack("v", "n", errors.New(strings.Join(text, "; ")), entries)
	if size := proto.Size(&pb.SyncRequest{Kind: &pb.SyncRequest_Nack{Nack: n}}); size > 256<<10 {
		t.Errorf("NACK of 10,000 invalid entries is %d bytes, want at most 256 KiB", size)
	}
	if got := len(n.GetEntryErrors()); got != maxNackEntryErrors+1 {
		t.Errorf("%d entry errors, want %d and a count of the rest", got, maxNackEntryErrors+1)
	}
	if last := n.GetEntryErrors()[maxNackEntryErrors].GetError(); last != "and 9900 more entries" {
		t.Errorf("last entry error %q", last)
	}
	for _, s := range []string{n.GetError(), n.GetEntryErrors()[0].GetError()} {
		if !utf8.ValidString(s) || !strings.HasSuffix(s, "(truncated)") {
			t.Errorf("truncated text is not valid UTF-8 ending in (truncated): ...%q", s[max(0, len(s)-40):])
		}
	}

	small := newNack("v", "n", errors.New("bad"), []*pb.EntryError{{Key: "default/a", Error: "bad port"}})
	if want := (&pb.Nack{Version: "v", Nonce: "n", Error: "bad", EntryErrors: []*pb.EntryError{{Key: "default/a", Error: "bad port"}}}); !proto.Equal(small, want) {
		t.Errorf("small NACK %v, want %v", small, want)
	}
}
