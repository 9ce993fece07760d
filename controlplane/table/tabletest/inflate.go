// Package tabletest inflates the control plane's compressed snapshots for
// tests, as an agent does (nodeagent/client.Inflate, which the control
// plane's packages may not import), so that a test can compare what went
// on the wire with the plain snapshot of the same table.
package tabletest

import (
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/wire"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
)

// InflateSnapshot returns the encoded Snapshot b with its compressed
// entries inflated in place, and each unhashed entry's hash, computed from
// its content, put in after its key.
func InflateSnapshot(t testing.TB, b []byte) []byte {
	t.Helper()
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	var out []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("snapshot: %v", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			t.Fatalf("snapshot: %v", protowire.ParseError(m))
		}
		switch num {
		case wire.SnapshotZstdEntries:
			frame, _ := protowire.ConsumeBytes(b[n:])
			if out, err = dec.DecodeAll(frame, out); err != nil {
				t.Fatalf("inflating: %v", err)
			}
		case wire.SnapshotZstdEntriesUnhashed:
			frame, _ := protowire.ConsumeBytes(b[n:])
			content, err := dec.DecodeAll(frame, nil)
			if err != nil {
				t.Fatalf("inflating: %v", err)
			}
			out = appendHashed(t, out, content)
		default:
			out = append(out, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return out
}

// appendHashed appends the unhashed entries b to out with the hash of
// each, computed from its content (tablehash), put in after its key.
func appendHashed(t testing.TB, out, b []byte) []byte {
	t.Helper()
	var s pb.Snapshot
	if err := proto.Unmarshal(b, &s); err != nil {
		t.Fatalf("unhashed entries: %v", err)
	}
	for _, e := range s.GetEntries() {
		if e.GetHash() != 0 {
			t.Fatalf("unhashed entry %s carries hash %016x", e.GetKey(), e.GetHash())
		}
		h, err := tablehash.Entry(e.GetKey(), e.GetService())
		if err != nil {
			t.Fatal(err)
		}
		e.Hash = h
	}
	plain, err := proto.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	return append(out, plain...)
}
