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
	d := xxhash.New()
	_, _ = d.WriteString(key)
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
	// Each part is hashed as it is found: a streaming digest over the
	// part's fields gives what Part gives over them laid end to end.
	var shared, local xxhash.Digest
	shared.Reset()
	local.Reset()
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return 0, fmt.Errorf("splitting service %s: %w", key, protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return 0, fmt.Errorf("splitting service %s: %w", key, protowire.ParseError(m))
		}
		if num == localEndpointsField {
			_, _ = local.Write(rest[:n+m])
		} else {
			_, _ = shared.Write(rest[:n+m])
		}
		rest = rest[n+m:]
	}
	return Combine(key, shared.Sum64(), local.Sum64()), nil
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
