package table

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/wire"
)

// The messages below are assembled with protowire rather than proto.Marshal
// so that each Service part, encoded once in compute, is copied into every
// table that holds it instead of being re-encoded per node. Field numbers
// come from package wire, which checks them against the generated
// descriptors; TestWire checks the result against the generated types.

// entryOverhead bounds what appendEntry adds to the key and the Service:
// tags, lengths, the hash and the trigger time.
const entryOverhead = 48

// appendEntry appends one ServiceEntry, as a length-delimited field num.
func appendEntry(b []byte, num protowire.Number, key string, e compute.Entry, trigger time.Time) []byte {
	var ts []byte
	if !trigger.IsZero() {
		ts = protowire.AppendTag(ts, wire.TimestampSeconds, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(trigger.Unix()))
		if ns := trigger.Nanosecond(); ns != 0 {
			ts = protowire.AppendTag(ts, wire.TimestampNanos, protowire.VarintType)
			ts = protowire.AppendVarint(ts, uint64(ns))
		}
	}
	size := protowire.SizeTag(wire.ServiceEntryKey) + protowire.SizeBytes(len(key)) +
		protowire.SizeTag(wire.ServiceEntryHash) + protowire.SizeFixed64() +
		protowire.SizeTag(wire.ServiceEntryService) + protowire.SizeBytes(e.Size())
	if ts != nil {
		size += protowire.SizeTag(wire.ServiceEntryTriggerTime) + protowire.SizeBytes(len(ts))
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = protowire.AppendTag(b, wire.ServiceEntryKey, protowire.BytesType)
	b = protowire.AppendString(b, key)
	b = protowire.AppendTag(b, wire.ServiceEntryHash, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, e.Hash)
	b = protowire.AppendTag(b, wire.ServiceEntryService, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(e.Size()))
	b = append(b, e.Shared.Bytes...)
	b = append(b, e.Local.Bytes...)
	if ts != nil {
		b = protowire.AppendTag(b, wire.ServiceEntryTriggerTime, protowire.BytesType)
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

// appendVersion appends a string field holding version v as
// compute.FormatVersion renders it (16 hex digits), without building the
// string: two per delta, for every agent reached by every change.
func appendVersion(b []byte, num protowire.Number, v uint64) []byte {
	const digits = "0123456789abcdef"
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, 16)
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>uint(shift)&0xf])
	}
	return b
}

func appendMessage(b []byte, num protowire.Number, m []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

// appendUint appends a varint field, or nothing for 0 (proto3's default).
func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}
