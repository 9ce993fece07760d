package nftables

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"
	"time"

	nexpr "github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// The ruleset model. Everything the Dataplane writes is described here
// once, as structured matches, statements and verdicts, and read three
// ways: rendered to nft syntax (goldens, error messages, the nft -f floor
// of the benchmarks), encoded to netlink (what the kernel gets), and
// interpreted by the tests' packet tracer and fake kernel. The vocabulary
// is deliberately small: exactly the expressions the ruleset uses.

// chain is a chain of the table: a base chain when hook is set.
type chain struct {
	name  string
	hook  *baseHook
	rules []rule
}

// baseHook attaches a base chain to a netfilter hook.
type baseHook struct {
	typ      string // "filter" or "nat"
	hook     string // "prerouting", "input", "forward", "output", "postrouting"
	priority int
}

// rule is a sequence of expressions: matches, then statements, usually
// ending with a verdict.
type rule struct {
	exprs []rexpr
}

// rexpr is one expression of a rule.
type rexpr interface {
	// text appends the expression in nft syntax.
	text(b *strings.Builder, f dataplane.Family)
	// encode appends the kernel expressions that implement it, exactly
	// as nft 1.0.6 would generate them from the text.
	encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any
}

func newRule(exprs ...rexpr) rule { return rule{exprs: exprs} }

// String renders the rule in nft syntax.
func (r rule) String(f dataplane.Family) string {
	var b strings.Builder
	for i, e := range r.exprs {
		if i > 0 {
			b.WriteByte(' ')
		}
		e.text(&b, f)
	}
	return b.String()
}

// Registers as nft allocates them: 128-bit NFT_REG_1 and NFT_REG_2, and
// the 32-bit registers concatenations use.
const (
	regVerdict = 0
	reg1       = 1
	reg2       = 2
	reg32x01   = 9  // NFT_REG32_01
	reg32x02   = 10 // NFT_REG32_02
	reg3       = 3
	reg32x03   = 11 // NFT_REG32_03
	reg32x05   = 13 // NFT_REG32_05
	reg32x09   = 17 // NFT_REG32_09
)

// addrMatch is "ip saddr 10.0.0.0/8", "ip6 daddr != ::1".
type addrMatch struct {
	src bool
	neg bool
	p   netip.Prefix
}

func (m addrMatch) text(b *strings.Builder, f dataplane.Family) {
	b.WriteString(nftFamily(f))
	if m.src {
		b.WriteString(" saddr ")
	} else {
		b.WriteString(" daddr ")
	}
	if m.neg {
		b.WriteString("!= ")
	}
	if m.p.IsSingleIP() {
		b.WriteString(m.p.Addr().String())
	} else {
		b.WriteString(m.p.String())
	}
}

// addrOffset is where the address lies in the network header.
func addrOffset(f dataplane.Family, src bool) uint32 {
	switch {
	case f == dataplane.IPv4 && src:
		return 12
	case f == dataplane.IPv4:
		return 16
	case src:
		return 8
	}
	return 24
}

func (m addrMatch) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	addr := m.p.Addr().AsSlice()
	op := nexpr.CmpOpEq
	if m.neg {
		op = nexpr.CmpOpNeq
	}
	bits := m.p.Bits()
	off := addrOffset(f, m.src)
	if bits%8 == 0 {
		// nft loads only the prefix's bytes when it ends on a byte.
		n := uint32(bits / 8)
		return append(dst,
			&nexpr.Payload{DestRegister: reg1, Base: nexpr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&nexpr.Cmp{Op: op, Register: reg1, Data: addr[:n]})
	}
	mask := make([]byte, len(addr))
	for i := range bits {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return append(dst,
		&nexpr.Payload{DestRegister: reg1, Base: nexpr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))},
		&nexpr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: uint32(len(addr)), Mask: mask, Xor: make([]byte, len(addr))},
		&nexpr.Cmp{Op: op, Register: reg1, Data: addr})
}

// protoMatch is "meta l4proto tcp".
type protoMatch struct{ proto uint8 }

func (m protoMatch) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString("meta l4proto ")
	b.WriteString(protoName(m.proto))
}

func (m protoMatch) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	return append(dst,
		&nexpr.Meta{Key: nexpr.MetaKeyL4PROTO, Register: reg1},
		&nexpr.Cmp{Op: nexpr.CmpOpEq, Register: reg1, Data: []byte{m.proto}})
}

// dportMatch is "tcp dport 80": the protocol, then the port.
type dportMatch struct {
	proto uint8
	port  uint16
}

func (m dportMatch) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString(protoName(m.proto))
	b.WriteString(" dport ")
	b.WriteString(strconv.Itoa(int(m.port)))
}

func (m dportMatch) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	dst = protoMatch{m.proto}.encode(dst, f)
	return append(dst,
		&nexpr.Payload{DestRegister: reg1, Base: nexpr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&nexpr.Cmp{Op: nexpr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, m.port)})
}

// fibLocal is "fib daddr type local" (or saddr): is the address one of
// the node's own, by the routing table, whatever interface it is on.
type fibLocal struct{ src bool }

// rtnLocal is RTN_LOCAL, compared in host byte order as nft does.
const rtnLocal = 2

func (m fibLocal) text(b *strings.Builder, _ dataplane.Family) {
	if m.src {
		b.WriteString("fib saddr type local")
	} else {
		b.WriteString("fib daddr type local")
	}
}

func (m fibLocal) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	return append(dst,
		&nexpr.Fib{Register: reg1, ResultADDRTYPE: true, FlagSADDR: m.src, FlagDADDR: !m.src},
		&nexpr.Cmp{Op: nexpr.CmpOpEq, Register: reg1, Data: binary.NativeEndian.AppendUint32(nil, rtnLocal)})
}

// ctState is "ct state new".
type ctState struct{}

// ctNewBit is NF_CT_STATE_BIT(IP_CT_NEW), in host order.
const ctNewBit = 8

func (m ctState) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString("ct state new")
}

func (m ctState) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	return append(dst,
		&nexpr.Ct{Register: reg1, Key: nexpr.CtKeySTATE},
		&nexpr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, ctNewBit), Xor: make([]byte, 4)},
		&nexpr.Cmp{Op: nexpr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)})
}

// markClear is "mark and 0x4000 == 0".
type markClear struct{ mark uint32 }

func (m markClear) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString("mark and ")
	b.WriteString(hexMark(m.mark))
	b.WriteString(" == 0")
}

func (m markClear) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	return append(dst,
		&nexpr.Meta{Key: nexpr.MetaKeyMARK, Register: reg1},
		&nexpr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, m.mark), Xor: make([]byte, 4)},
		&nexpr.Cmp{Op: nexpr.CmpOpEq, Register: reg1, Data: make([]byte, 4)})
}

// markSet is "mark set mark or 0x4000" (or xor).
type markSet struct {
	xor  bool
	mark uint32
}

func (m markSet) text(b *strings.Builder, _ dataplane.Family) {
	if m.xor {
		b.WriteString("mark set mark xor ")
	} else {
		b.WriteString("mark set mark or ")
	}
	b.WriteString(hexMark(m.mark))
}

func (m markSet) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	// nft turns both into (mark & mask) ^ xor.
	mask := ^m.mark
	if m.xor {
		mask = 0xffffffff
	}
	return append(dst,
		&nexpr.Meta{Key: nexpr.MetaKeyMARK, Register: reg1},
		&nexpr.Bitwise{
			SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, mask), Xor: binary.NativeEndian.AppendUint32(nil, m.mark),
		},
		&nexpr.Meta{Key: nexpr.MetaKeyMARK, SourceRegister: true, Register: reg1})
}

func hexMark(m uint32) string { return "0x" + strconv.FormatUint(uint64(m), 16) }

// setMatch is "ip saddr @set": the address is in a set.
type setMatch struct {
	src bool
	set string
}

func (m setMatch) text(b *strings.Builder, f dataplane.Family) {
	b.WriteString(nftFamily(f))
	if m.src {
		b.WriteString(" saddr @")
	} else {
		b.WriteString(" daddr @")
	}
	b.WriteString(m.set)
}

func (m setMatch) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	return append(dst,
		&nexpr.Payload{DestRegister: reg1, Base: nexpr.PayloadBaseNetworkHeader, Offset: addrOffset(f, m.src), Len: addrLen(f)},
		&nexpr.Lookup{SourceRegister: reg1, SetName: m.set})
}

func addrLen(f dataplane.Family) uint32 {
	if f == dataplane.IPv6 {
		return 16
	}
	return 4
}

// numgenZero is "numgen random mod N == 0": true with probability 1/N. A
// cascade of them picks an endpoint with affinity (see endpointRules,
// and dnatMap without affinity); an anonymous
// "numgen ... vmap" per Service, as kube-proxy writes, makes the kernel
// walk the pending transaction for every anonymous set, which is
// quadratic in the number of Services.
type numgenZero struct{ mod uint32 }

func (m numgenZero) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString("numgen random mod ")
	b.WriteString(strconv.FormatUint(uint64(m.mod), 10))
	b.WriteString(" == 0")
}

func (m numgenZero) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	return append(dst,
		&nexpr.Numgen{Register: reg1, Type: unix.NFT_NG_RANDOM, Modulus: m.mod},
		&nexpr.Cmp{Op: nexpr.CmpOpEq, Register: reg1, Data: make([]byte, 4)})
}

// setUpdate is "update @set { ip saddr }": add the source to a dynamic
// set, or refresh its timeout.
type setUpdate struct{ set string }

func (m setUpdate) text(b *strings.Builder, f dataplane.Family) {
	b.WriteString("update @")
	b.WriteString(m.set)
	b.WriteString(" { ")
	b.WriteString(nftFamily(f))
	b.WriteString(" saddr }")
}

func (m setUpdate) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	return append(dst,
		&nexpr.Payload{DestRegister: reg1, Base: nexpr.PayloadBaseNetworkHeader, Offset: addrOffset(f, true), Len: addrLen(f)},
		&nexpr.Dynset{SrcRegKey: reg1, SetName: m.set, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// vmapLookup is "ip daddr . meta l4proto . th dport vmap @map" (keyAddr
// set) or "meta l4proto . th dport vmap @map": a verdict map lookup.
type vmapLookup struct {
	withAddr bool
	set      string
}

func (m vmapLookup) text(b *strings.Builder, f dataplane.Family) {
	if m.withAddr {
		b.WriteString(nftFamily(f))
		b.WriteString(" daddr . ")
	}
	b.WriteString("meta l4proto . th dport vmap @")
	b.WriteString(m.set)
}

func (m vmapLookup) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	protoReg, portReg := uint32(reg1), uint32(reg32x01)
	if m.withAddr {
		// The address fills NFT_REG_1 (one 32-bit register for IPv4,
		// four for IPv6); the next fields follow.
		protoReg, portReg = reg32x01, reg32x02
		if f == dataplane.IPv6 {
			protoReg, portReg = reg2, reg32x05
		}
		dst = append(dst, &nexpr.Payload{DestRegister: reg1, Base: nexpr.PayloadBaseNetworkHeader, Offset: addrOffset(f, false), Len: addrLen(f)})
	}
	return append(dst,
		&nexpr.Meta{Key: nexpr.MetaKeyL4PROTO, Register: protoReg},
		&nexpr.Payload{DestRegister: portReg, Base: nexpr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&nexpr.Lookup{SourceRegister: reg1, DestRegister: regVerdict, IsDestRegSet: true, SetName: m.set})
}

// dnatTo is "dnat to 10.0.0.1:8080"; the rule must match the protocol
// first (nft requires it for a port).
type dnatTo struct {
	addr netip.Addr
	port uint16
}

func (s dnatTo) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString("dnat to ")
	b.WriteString(netip.AddrPortFrom(s.addr, s.port).String())
}

func (s dnatTo) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	fam := uint32(unix.NFPROTO_IPV4)
	if f == dataplane.IPv6 {
		fam = unix.NFPROTO_IPV6
	}
	return append(dst,
		&nexpr.Immediate{Register: reg1, Data: s.addr.AsSlice()},
		&nexpr.Immediate{Register: reg2, Data: binary.BigEndian.AppendUint16(nil, s.port)},
		&nexpr.NAT{Type: nexpr.NATTypeDestNAT, Family: fam, RegAddrMin: reg1, RegProtoMin: reg2, Specified: true})
}

// dnatMap is "dnat ip addr . port to numgen random mod N map @endpoints":
// the random choice of an endpoint and its DNAT in one rule, from a named
// map of the Service's endpoints (index : address . port); the rule must
// match the protocol first. An endpoint that changes address is a map
// element changed, which the kernel commits without validating the
// table's chain graph (only rules, and verdict elements, make it walk
// every chain); the per-endpoint chains this replaces made that walk
// 250,000 chains longer at 5,000 Services x 50 endpoints. Named, not
// anonymous: anonymous maps make a large commit quadratic (see numgenZero).
type dnatMap struct {
	set string
	mod uint32
}

func (s dnatMap) text(b *strings.Builder, f dataplane.Family) {
	b.WriteString("dnat ")
	b.WriteString(nftFamily(f))
	b.WriteString(" addr . port to numgen random mod ")
	b.WriteString(strconv.FormatUint(uint64(s.mod), 10))
	b.WriteString(" map @")
	b.WriteString(s.set)
}

func (s dnatMap) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	fam, portReg := uint32(unix.NFPROTO_IPV4), uint32(reg32x01)
	if f == dataplane.IPv6 {
		fam, portReg = unix.NFPROTO_IPV6, reg2
	}
	return append(dst,
		&nexpr.Numgen{Register: reg1, Type: unix.NFT_NG_RANDOM, Modulus: s.mod},
		&nexpr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: s.set},
		&nexpr.NAT{Type: nexpr.NATTypeDestNAT, Family: fam, RegAddrMin: reg1, RegProtoMin: portReg, Specified: true})
}

// hairpinMatch is "ct status dnat ip saddr . ip daddr . meta l4proto . th
// dport @hairpin-connections", kube-proxy's hairpin test: a connection
// DNATed to an endpoint from that endpoint itself, which must be
// masqueraded or the pod would answer itself directly.
type hairpinMatch struct{ set string }

// ipsDstNAT is IPS_DST_NAT, the conntrack status bit of a DNATed
// connection, in host order.
const ipsDstNAT = 0x20

func (m hairpinMatch) text(b *strings.Builder, f dataplane.Family) {
	ip := nftFamily(f)
	b.WriteString("ct status dnat " + ip + " saddr . " + ip + " daddr . meta l4proto . th dport @")
	b.WriteString(m.set)
}

func (m hairpinMatch) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	dstReg, protoReg, portReg := uint32(reg32x01), uint32(reg32x02), uint32(reg32x03)
	if f == dataplane.IPv6 {
		dstReg, protoReg, portReg = reg2, reg3, reg32x09
	}
	return append(dst,
		&nexpr.Ct{Register: reg1, Key: nexpr.CtKeySTATUS},
		&nexpr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: make([]byte, 4)},
		&nexpr.Cmp{Op: nexpr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		&nexpr.Payload{DestRegister: reg1, Base: nexpr.PayloadBaseNetworkHeader, Offset: addrOffset(f, true), Len: addrLen(f)},
		&nexpr.Payload{DestRegister: dstReg, Base: nexpr.PayloadBaseNetworkHeader, Offset: addrOffset(f, false), Len: addrLen(f)},
		&nexpr.Meta{Key: nexpr.MetaKeyL4PROTO, Register: protoReg},
		&nexpr.Payload{DestRegister: portReg, Base: nexpr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&nexpr.Lookup{SourceRegister: reg1, SetName: m.set})
}

// masquerade is "masquerade fully-random" (or plain).
type masquerade struct{ fullyRandom bool }

func (s masquerade) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString("masquerade")
	if s.fullyRandom {
		b.WriteString(" fully-random")
	}
}

func (s masquerade) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	return append(dst, &nexpr.Masq{FullyRandom: s.fullyRandom})
}

// reject is "reject": ICMP (ICMPv6) port unreachable, whatever the
// protocol, as upstream's reject-chain.
type reject struct{}

func (s reject) text(b *strings.Builder, _ dataplane.Family) {
	b.WriteString("reject")
}

// ICMP codes for port unreachable.
const (
	icmpPortUnreach   = 3
	icmpv6PortUnreach = 4
)

func (s reject) encode(dst []nexpr.Any, f dataplane.Family) []nexpr.Any {
	code := uint8(icmpPortUnreach)
	if f == dataplane.IPv6 {
		code = icmpv6PortUnreach
	}
	return append(dst, &nexpr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: code})
}

// verdictKind is what a verdict does.
type verdictKind uint8

const (
	verdictNone verdictKind = iota
	verdictAccept
	verdictDrop
	verdictReturn
	verdictJump
	verdictGoto
)

// verdict ends a rule, or is the value of a verdict map element.
type verdict struct {
	kind  verdictKind
	chain string // for jump and goto
}

func jump(c string) verdict           { return verdict{kind: verdictJump, chain: c} }
func goTo(c string) verdict           { return verdict{kind: verdictGoto, chain: c} }
func verdictOf(k verdictKind) verdict { return verdict{kind: k} }

func (v verdict) text(b *strings.Builder, _ dataplane.Family) { b.WriteString(v.String()) }

// String is the verdict in nft syntax.
func (v verdict) String() string {
	switch v.kind {
	case verdictAccept:
		return "accept"
	case verdictDrop:
		return "drop"
	case verdictReturn:
		return "return"
	case verdictJump:
		return "jump " + v.chain
	case verdictGoto:
		return "goto " + v.chain
	}
	return ""
}

func (v verdict) nexpr() *nexpr.Verdict {
	switch v.kind {
	case verdictAccept:
		return &nexpr.Verdict{Kind: nexpr.VerdictAccept}
	case verdictDrop:
		return &nexpr.Verdict{Kind: nexpr.VerdictDrop}
	case verdictReturn:
		return &nexpr.Verdict{Kind: nexpr.VerdictReturn}
	case verdictJump:
		return &nexpr.Verdict{Kind: nexpr.VerdictJump, Chain: v.chain}
	}
	return &nexpr.Verdict{Kind: nexpr.VerdictGoto, Chain: v.chain}
}

func (v verdict) encode(dst []nexpr.Any, _ dataplane.Family) []nexpr.Any {
	return append(dst, v.nexpr())
}

// keyKind is the key type of a set or verdict map.
type keyKind uint8

const (
	keyAddr          keyKind = iota // ipv4_addr / ipv6_addr
	keyAddrProtoPort                // addr . inet_proto . inet_service
	keyProtoPort                    // inet_proto . inet_service
	keyIndex                        // numgen's integer, an endpoint map's
	keyHairpin                      // addr . addr . inet_proto . inet_service
)

// set is a named set, verdict map or endpoint map.
type set struct {
	name string
	key  keyKind
	vmap bool
	// endpoints makes a map from keyIndex to an endpoint's address .
	// port, which dnatMap looks up.
	endpoints bool
	// timeout makes a dynamic set whose elements expire, for affinity.
	timeout time.Duration
}

// isMap reports whether the set is a map (nft's "map", not "set").
func (s *set) isMap() bool { return s.vmap || s.endpoints }

// elemKey is one key of a set or map; the fields its keyKind does not use
// are zero. keyHairpin uses addr twice.
type elemKey struct {
	addr  netip.Addr
	proto uint8
	port  uint16
	index uint32 // keyIndex
}

// element is one set element, with its verdict in a verdict map, or its
// endpoint in an endpoint map.
type element struct {
	key      elemKey
	verdict  verdict
	endpoint netip.AddrPort
}

// text renders the key in nft syntax.
func (k elemKey) text(kind keyKind) string {
	switch kind {
	case keyAddr:
		return k.addr.String()
	case keyProtoPort:
		return protoName(k.proto) + " . " + strconv.Itoa(int(k.port))
	case keyIndex:
		return strconv.FormatUint(uint64(k.index), 10)
	case keyHairpin:
		return k.addr.String() + " . " + k.addr.String() + " . " + protoName(k.proto) + " . " + strconv.Itoa(int(k.port))
	}
	return k.addr.String() + " . " + protoName(k.proto) + " . " + strconv.Itoa(int(k.port))
}

// bytes encodes the key as the kernel stores it: each field of a
// concatenation padded to a 32-bit register.
func (k elemKey) bytes(kind keyKind, dst []byte) []byte {
	switch kind {
	case keyIndex:
		// numgen's result, compared in host byte order.
		return binary.NativeEndian.AppendUint32(dst, k.index)
	case keyHairpin:
		dst = append(dst, k.addr.AsSlice()...)
	}
	if kind != keyProtoPort {
		dst = append(dst, k.addr.AsSlice()...)
	}
	if kind != keyAddr {
		dst = append(dst, k.proto, 0, 0, 0)
		dst = binary.BigEndian.AppendUint16(dst, k.port)
		dst = append(dst, 0, 0)
	}
	return dst
}

// elemText renders an element in nft syntax.
func (s *set) elemText(e element) string {
	switch {
	case s.vmap:
		return e.key.text(s.key) + " : " + e.verdict.String()
	case s.endpoints:
		return e.key.text(s.key) + " : " + e.endpoint.Addr().String() + " . " + strconv.Itoa(int(e.endpoint.Port()))
	}
	return e.key.text(s.key)
}

// endpointBytes encodes an endpoint map's value as the kernel stores it:
// the address, then the port padded to a 32-bit register.
func endpointBytes(ep netip.AddrPort, dst []byte) []byte {
	dst = append(dst, ep.Addr().AsSlice()...)
	dst = binary.BigEndian.AppendUint16(dst, ep.Port())
	return append(dst, 0, 0)
}

// typeText is the set's "type" line.
func (s *set) typeText(f dataplane.Family) string {
	addr := "ipv4_addr"
	if f == dataplane.IPv6 {
		addr = "ipv6_addr"
	}
	var t string
	switch s.key {
	case keyAddr:
		t = addr
	case keyProtoPort:
		t = "inet_proto . inet_service"
	case keyHairpin:
		t = addr + " . " + addr + " . inet_proto . inet_service"
	default:
		t = addr + " . inet_proto . inet_service"
	}
	if s.vmap {
		t += " : verdict"
	}
	return t
}
