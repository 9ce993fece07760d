package proxytable

import (
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestRejectionTextStaysUTF8 quotes a rogue value of two-byte runes, cut
// where a rune would be split: the entry errors a NACK carries must stay
// valid UTF-8, or the NACK cannot be encoded and the agent cannot say
// why it refused the table.
func TestRejectionTextStaysUTF8(t *testing.T) {
	for _, s := range []string{strings.Repeat("é", 5*clipLen), "x" + strings.Repeat("é", 8*clipLen)} {
		for _, cut := range []string{clipText(s), clipMsgs([]string{s})} {
			if !utf8.ValidString(cut) || !strings.HasSuffix(cut, "...") {
				t.Fatalf("cut text is not valid UTF-8 ending in ...: %q", cut[max(0, len(cut)-12):])
			}
		}
		ve := &ValidationError{Entries: []*EntryError{{Key: s, Err: errString(s)}}}
		if _, err := proto.Marshal(&pb.Nack{EntryErrors: EntryErrors(ve)}); err != nil {
			t.Fatalf("a NACK quoting the rogue value cannot be encoded: %v", err)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }
