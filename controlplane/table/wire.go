package table

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/proxyplane/proxyplane/controlplane/compute"
)

// The messages below are assembled with protowire rather than proto.Marshal
// so that each Service part, encoded once in compute, is copied into every
// table that holds it instead of being re-encoded per node. Field numbers
// follow proto/proxyplane/v1; TestWire checks the result against the
// generated types.

const (
	entryKey, entryHash, entryService, entryTrigger = 1, 2, 3, 4
	snapVersion, snapNode, snapEntries              = 1, 2, 3
	deltaBase, deltaVersion, deltaNode              = 1, 2, 3
	deltaUpserts, deltaRemovals                     = 4, 5
	tsSeconds, tsNanos                              = 1, 2

	// entryOverhead bounds what appendEntry adds to the key and the
	// Service: tags, lengths, the hash and the trigger time.
	entryOverhead = 48
)

// appendEntry appends one ServiceEntry, as a length-delimited field num.
func appendEntry(b []byte, num protowire.Number, key string, e compute.Entry, trigger time.Time) []byte {
	var ts []byte
	if !trigger.IsZero() {
		ts = protowire.AppendTag(ts, tsSeconds, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(trigger.Unix()))
		if ns := trigger.Nanosecond(); ns != 0 {
			ts = protowire.AppendTag(ts, tsNanos, protowire.VarintType)
			ts = protowire.AppendVarint(ts, uint64(ns))
		}
	}
	size := protowire.SizeTag(entryKey) + protowire.SizeBytes(len(key)) +
		protowire.SizeTag(entryHash) + protowire.SizeFixed64() +
		protowire.SizeTag(entryService) + protowire.SizeBytes(e.Size())
	if ts != nil {
		size += protowire.SizeTag(entryTrigger) + protowire.SizeBytes(len(ts))
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = protowire.AppendTag(b, entryKey, protowire.BytesType)
	b = protowire.AppendString(b, key)
	b = protowire.AppendTag(b, entryHash, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, e.Hash)
	b = protowire.AppendTag(b, entryService, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(e.Size()))
	b = append(b, e.Shared.Bytes...)
	b = append(b, e.Local.Bytes...)
	if ts != nil {
		b = protowire.AppendTag(b, entryTrigger, protowire.BytesType)
		b = protowire.AppendBytes(b, ts)
	}
	return b
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendMessage(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}
