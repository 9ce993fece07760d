// Package tablehash defines the content hashes of a proxy table, shared by
// the control plane, which computes them once per Service view, and the
// node agent, which recomputes them from what it received or loaded: a
// hash is only worth reporting back to a replica if it says what the agent
// really holds.
//
// Hashes must be equal on every replica and across restarts, so they use a
// fixed, unseeded function (xxHash64) over deterministic protobuf
// encodings. They detect change and forgery of an entry under another's
// hash; they are not a MAC: whoever can write a table can also hash it.
package tablehash

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// deterministic is the encoding every hashed part is made with.
var deterministic = proto.MarshalOptions{Deterministic: true}

// localEndpointsField is Service.local_endpoints, the only node-specific
// part of an entry, from the generated descriptor rather than by hand.
var localEndpointsField = (&pb.Service{}).ProtoReflect().Descriptor().Fields().ByName("local_endpoints").Number()

// Part returns the hash of an encoded part of a Service.
func Part(b []byte) uint64 { return xxhash.Sum64(b) }

// Combine derives a ServiceEntry's hash from its key and the hashes of its
// two parts: the shared one (every field but local_endpoints) and the local
// one (local_endpoints only, empty for most nodes).
func Combine(key string, shared, local uint64) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(key)
	return combined(&d, shared, local)
}

// combined ends Combine's digest d, which holds the key.
func combined(d *xxhash.Digest, shared, local uint64) uint64 {
	var b [17]byte // a zero byte keeps the key from running into the hashes
	binary.LittleEndian.PutUint64(b[1:], shared)
	binary.LittleEndian.PutUint64(b[9:], local)
	_, _ = d.Write(b[:])
	return d.Sum64()
}

// Entry returns the hash the control plane gives the entry of key holding
// s. It encodes s once and splits the encoding by top-level field: Go's
// deterministic encoding writes each field independently, in field number
// order with unknown fields last, so the shared part is exactly what
// encoding s without local_endpoints gives, as the control plane does, and
// fields a newer control plane added (numbered after every field this
// binary knows, as protobuf evolution requires) land in it as they did
// there.
func Entry(key string, s *pb.Service) (uint64, error) {
	b, err := deterministic.Marshal(s)
	if err != nil {
		return 0, fmt.Errorf("encoding service %s: %w", key, err)
	}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(key)
	return encodedEntry(&d, key, b)
}

// EncodedEntry returns the hash of the entry of key whose Service is
// encoded as b, split by top-level field as Entry splits its encoding: the
// same hash when b is the deterministic encoding, in any order of its
// parts. The agent hashes what it received this way, without re-encoding
// it (compressed runs without hashes, Snapshot.zstd_entries_unhashed); the
// checks on receipt still recompute Entry, so bytes that are not the
// deterministic encoding of what they decode to are refused there.
func EncodedEntry(key, b []byte) (uint64, error) {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.Write(key)
	return encodedEntry(&d, key, b)
}

// encodedEntry is EncodedEntry with the key in d already; key names the
// entry in errors only.
func encodedEntry[K string | []byte](d *xxhash.Digest, key K, b []byte) (uint64, error) {
	// Most often every shared field comes first and local_endpoints,
	// when there, last (package compute writes them so, and it is field
	// order): each part is then one stretch of b, hashed at once. Else
	// each part is hashed as it is found: a streaming digest over the
	// part's fields gives what Part gives over them laid end to end.
	sharedEnd, localStart := -1, -1
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return 0, fmt.Errorf("splitting service %s: %w", key, protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[off+n:])
		if m < 0 {
			return 0, fmt.Errorf("splitting service %s: %w", key, protowire.ParseError(m))
		}
		switch {
		case num == localEndpointsField && localStart < 0:
			localStart, sharedEnd = off, off
		case num != localEndpointsField && localStart >= 0:
			return streamed(d, b), nil // a shared field after a local one
		}
		off += n + m
	}
	if localStart < 0 {
		sharedEnd, localStart = len(b), len(b)
	}
	return combined(d, xxhash.Sum64(b[:sharedEnd]), xxhash.Sum64(b[localStart:])), nil
}

// streamed ends digest d, which holds the key, over the well-formed
// encoded Service b whose parts are interleaved.
func streamed(d *xxhash.Digest, b []byte) uint64 {
	var shared, local xxhash.Digest
	shared.Reset()
	local.Reset()
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if num == localEndpointsField {
			_, _ = local.Write(rest[:n+m])
		} else {
			_, _ = shared.Write(rest[:n+m])
		}
		rest = rest[n+m:]
	}
	return combined(d, shared.Sum64(), local.Sum64())
}

// Node returns the hash of n as the control plane computes it: of its
// deterministic encoding with the hash field cleared. n is not modified.
func Node(n *pb.NodeInfo) (uint64, error) {
	c := proto.CloneOf(n)
	c.Hash = 0
	b, err := deterministic.Marshal(c)
	if err != nil {
		return 0, fmt.Errorf("encoding node info: %w", err)
	}
	return xxhash.Sum64(b), nil
}
