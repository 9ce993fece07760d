package hashtable

import (
	"google.golang.org/protobuf/encoding/protowire"
)

// helloEntryHashes is Hello.entry_hashes' field number
// (proto/proxyplane/v1/sync.proto); a map field is a repeated message of
// key = 1 and value = 2. hello_test.go checks the encoding against the
// generated type.
const helloEntryHashes = 4

// HelloParts returns the table's entry hashes encoded as Hello.entry_hashes
// fields, in parts to be sent one after the other (in any order) after the
// hello's other fields. Each part is a bucket's, encoded once and shared by
// every table and agent holding that bucket: after a control plane
// restart thousands of agents send their hashes at once, and encoding
// 10,000 hashes per agent would take gigabytes. The parts must not be
// modified.
func (t *Table) HelloParts() [][]byte {
	parts := make([][]byte, 0, nBuckets)
	for _, b := range t.buckets {
		if b == nil {
			continue
		}
		parts = append(parts, b.encoded())
	}
	return parts
}

func (b *bucket) encoded() []byte {
	if p := b.hello.Load(); p != nil {
		return *p
	}
	var out []byte
	for k, h := range b.entries {
		n := protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeFixed64()
		out = protowire.AppendTag(out, helloEntryHashes, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(n))
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendString(out, k)
		out = protowire.AppendTag(out, 2, protowire.Fixed64Type)
		out = protowire.AppendFixed64(out, h)
	}
	// Two agents may encode the same bucket at once; either result is
	// right, and the first stored wins.
	b.hello.CompareAndSwap(nil, &out)
	return *b.hello.Load()
}
