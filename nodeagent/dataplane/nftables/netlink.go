package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	nexpr "github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// Netlink encoding of a transaction: one nf_tables batch, framed by
// NFNL_MSG_BATCH_BEGIN and _END, which the kernel commits all or nothing.
// Messages are written here rather than through google/nftables' Conn
// because v0.3.0 asks an acknowledgement of every message (at 10k Services,
// hundreds of thousands of acknowledgements that overflow the socket's
// receive buffer, after the kernel committed) and truncates element lists
// above 64 KiB. The frequent expressions are written here too (expr); the
// others are marshalled by google/nftables/expr.

// batch is an encoded transaction.
type batch struct {
	// bufs holds the messages, in order, in chunks that each end on a
	// message boundary; they go to the kernel in one sendmsg, as one
	// buffer (see netlinkKernel.Run). size is their total length.
	bufs [][]byte
	size int
	// first is the sequence number of the first message after
	// BATCH_BEGIN; msgOp[i] is the operation of message first+i.
	first uint32
	msgOp []int32
	// last is the sequence number of the last operation message, the
	// only one that asks an acknowledgement: once it arrives, every error
	// the batch caused has arrived before it.
	last uint32
	// elems maps the element messages (by index) to their elements, so
	// that a refused element is found from the kernel's error offset.
	// offsets holds every element's attribute offset in its message.
	elems   map[int]elemMsg
	offsets []uint32
}

// elemMsg locates a message's elements: the index in its operation of
// the first, and their attribute offsets, offsets[lo:hi] of the batch
// (one list for the batch rather than one per message, which grew by
// doublings).
type elemMsg struct {
	first  int
	lo, hi int
}

// n is the number of elements in the message.
func (m elemMsg) n() int { return m.hi - m.lo }

// element returns the index in the operation of the element of message m
// whose attribute holds offset off of the message, -1 if none does.
func (b *batch) element(m elemMsg, off uint32) int {
	for i := m.hi - 1; i >= m.lo; i-- {
		if b.offsets[i] <= off {
			return m.first + i - m.lo
		}
	}
	return -1
}

// Netlink framing constants.
const (
	nlmsgHdrLen = 16
	nfgenLen    = 4
	nlaHdrLen   = 4
	nlaNested   = unix.NLA_F_NESTED
	// maxElemsNest bounds one message's element list: its length is a
	// 16-bit attribute length, so a longer list would wrap (what
	// google/nftables v0.3.0 does silently above 64 KiB).
	maxElemsNest = 48 << 10
)

// Batch chunks: a message starts a new chunk when less than chunkRoom is
// left in the current one (an element message is at most maxElemsNest
// and one element more; a longer message, a firewall rule with thousands
// of ranges, grows its chunk). Chunks of chunkSize, doubled every
// chunksPerDoubling chunks, keep a batch of any size under the kernel's
// limit of 1,024 buffers a sendmsg (UIO_MAXIOV): 256 MiB in 128 chunks,
// then 2 MiB ones. Chunks rather than one buffer: the batch is never
// copied to grow, and needs no estimate of its size, which at 260,000
// DNAT rules overshot by 75 MiB.
const (
	chunkSize         = 1 << 20
	chunkRoom         = 64 << 10
	chunksPerDoubling = 128
)

// encoder builds a batch.
type encoder struct {
	f   dataplane.Family
	fam byte // NFPROTO_IPV4 or NFPROTO_IPV6
	// b is the chunk being written; full holds the chunks before it.
	b     []byte
	full  [][]byte
	size  int // the bytes in full
	seq   uint32
	msgOp []int32
	// nests holds the start offsets (in b) of open attributes.
	nests []int
	// exprs is scratch space for a rule's expressions.
	exprs  []nexpr.Any
	setIDs uint32
	// lastChunk and lastMsg locate the last operation message: its
	// chunk (an index in full, len(full) for b) and offset.
	lastChunk, lastMsg int
	elems              map[int]elemMsg
	offsets            []uint32
	// chunked writes a batch in chunks (see room).
	chunked bool
}

// encodeBatch encodes tx with sequence numbers from seq on.
func encodeBatch(tx *transaction, f dataplane.Family, seq uint32) (*batch, error) {
	e := &encoder{f: f, fam: unix.NFPROTO_IPV4, seq: seq, chunked: true}
	if f == dataplane.IPv6 {
		e.fam = unix.NFPROTO_IPV6
	}
	e.control(unix.NFNL_MSG_BATCH_BEGIN)
	first := e.seq
	var err error
	tx.each(func(i int, o *op) bool {
		if err = e.op(o, i); err != nil {
			err = fmt.Errorf("encoding %q: %w", o.text(f), err)
			return false
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(e.msgOp) == 0 {
		return &batch{first: first}, nil
	}
	last := e.seq - 1
	e.ackLast()
	e.control(unix.NFNL_MSG_BATCH_END)
	bufs := append(e.full, e.b)
	return &batch{bufs: bufs, size: e.size + len(e.b), first: first, msgOp: e.msgOp, last: last, elems: e.elems, offsets: e.offsets}, nil
}

// room starts a new chunk unless the current one has room for a message,
// when encoding a batch (chunked); a single request is one small buffer.
func (e *encoder) room() {
	if !e.chunked || (e.b != nil && cap(e.b)-len(e.b) >= chunkRoom) {
		return
	}
	if e.b != nil {
		e.full = append(e.full, e.b)
		e.size += len(e.b)
	}
	e.b = make([]byte, 0, chunkSize<<(len(e.full)/chunksPerDoubling))
}

// control writes BATCH_BEGIN or BATCH_END.
func (e *encoder) control(typ uint16) {
	start := e.header(typ, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(e.b[start+nlmsgHdrLen+2:], unix.NFNL_SUBSYS_NFTABLES)
	e.finish(start)
}

// header starts a message and returns its offset.
func (e *encoder) header(typ, flags uint16, family byte) int {
	e.room()
	start := len(e.b)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0) // length, patched by finish
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = binary.NativeEndian.AppendUint16(e.b, flags)
	e.b = binary.NativeEndian.AppendUint32(e.b, e.seq)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0) // port id: the kernel
	e.b = append(e.b, family, unix.NFNETLINK_V0, 0, 0)
	e.seq++
	return start
}

func (e *encoder) finish(start int) {
	binary.NativeEndian.PutUint32(e.b[start:], uint32(len(e.b)-start))
}

// msg starts an nf_tables message for operation i.
func (e *encoder) msg(typ uint16, flags uint16, i int) int {
	e.msgOp = append(e.msgOp, int32(i))
	start := e.header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, unix.NLM_F_REQUEST|flags, e.fam)
	e.lastChunk, e.lastMsg = len(e.full), start
	return start
}

// ackLast asks an acknowledgement of the last message.
func (e *encoder) ackLast() {
	b := e.b
	if e.lastChunk < len(e.full) {
		b = e.full[e.lastChunk]
	}
	flags := binary.NativeEndian.Uint16(b[e.lastMsg+6:])
	binary.NativeEndian.PutUint16(b[e.lastMsg+6:], flags|unix.NLM_F_ACK)
}

func (e *encoder) attr(typ uint16, data []byte) {
	n := nlaHdrLen + len(data)
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(n))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = append(e.b, data...)
	for n%4 != 0 {
		e.b = append(e.b, 0)
		n++
	}
}

func (e *encoder) str(typ uint16, s string) {
	n := nlaHdrLen + len(s) + 1
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(n))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = append(e.b, s...)
	e.b = append(e.b, 0)
	for n%4 != 0 {
		e.b = append(e.b, 0)
		n++
	}
}

func (e *encoder) u32(typ uint16, v uint32) {
	e.b = binary.NativeEndian.AppendUint16(e.b, nlaHdrLen+4)
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = binary.BigEndian.AppendUint32(e.b, v)
}

func (e *encoder) begin(typ uint16) {
	e.nests = append(e.nests, len(e.b))
	e.b = binary.NativeEndian.AppendUint16(e.b, 0)
	e.b = binary.NativeEndian.AppendUint16(e.b, typ|nlaNested)
}

func (e *encoder) end() {
	start := e.nests[len(e.nests)-1]
	e.nests = e.nests[:len(e.nests)-1]
	binary.NativeEndian.PutUint16(e.b[start:], uint16(len(e.b)-start))
}

func (e *encoder) op(o *op, i int) error {
	switch o.kind {
	case opAddTable:
		start := e.msg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE, i)
		e.str(unix.NFTA_TABLE_NAME, TableName)
		e.u32(unix.NFTA_TABLE_FLAGS, 0)
		e.finish(start)
	case opDeleteTable:
		start := e.msg(unix.NFT_MSG_DELTABLE, 0, i)
		e.str(unix.NFTA_TABLE_NAME, TableName)
		e.finish(start)
	case opAddChain:
		start := e.msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, i)
		e.str(unix.NFTA_CHAIN_TABLE, TableName)
		e.str(unix.NFTA_CHAIN_NAME, o.chain.name)
		if h := o.chain.hook; h != nil {
			num, ok := hookNumbers[h.hook]
			if !ok {
				return fmt.Errorf("unknown hook %q", h.hook)
			}
			e.begin(unix.NFTA_CHAIN_HOOK)
			e.u32(unix.NFTA_HOOK_HOOKNUM, num)
			e.u32(unix.NFTA_HOOK_PRIORITY, uint32(int32(h.priority)))
			e.end()
			e.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
			e.str(unix.NFTA_CHAIN_TYPE, h.typ)
		}
		e.finish(start)
	case opFlushChain:
		start := e.msg(unix.NFT_MSG_DELRULE, 0, i)
		e.str(unix.NFTA_RULE_TABLE, TableName)
		e.str(unix.NFTA_RULE_CHAIN, o.name)
		e.finish(start)
	case opDeleteChain:
		start := e.msg(unix.NFT_MSG_DELCHAIN, 0, i)
		e.str(unix.NFTA_CHAIN_TABLE, TableName)
		e.str(unix.NFTA_CHAIN_NAME, o.name)
		e.finish(start)
	case opAddRule:
		start := e.msg(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_APPEND, i)
		e.str(unix.NFTA_RULE_TABLE, TableName)
		e.str(unix.NFTA_RULE_CHAIN, o.name)
		e.begin(unix.NFTA_RULE_EXPRESSIONS)
		for _, x := range o.rule.exprs {
			if err := e.rexpr(x); err != nil {
				return err
			}
		}
		e.end()
		e.finish(start)
	case opAddSet:
		e.addSet(o.set, i)
	case opFlushSet:
		start := e.msg(unix.NFT_MSG_DELSETELEM, 0, i)
		e.str(unix.NFTA_SET_ELEM_LIST_TABLE, TableName)
		e.str(unix.NFTA_SET_ELEM_LIST_SET, o.name)
		e.finish(start)
	case opDeleteSet:
		start := e.msg(unix.NFT_MSG_DELSET, 0, i)
		e.str(unix.NFTA_SET_TABLE, TableName)
		e.str(unix.NFTA_SET_NAME, o.name)
		e.finish(start)
	case opAddElements, opDeleteElements:
		e.elements(o, i)
	default:
		return fmt.Errorf("unknown operation %d", o.kind)
	}
	return nil
}

// rexpr writes the kernel expressions of x. The frequent ones (those of
// a DNAT cascade, a service port's chain and its verdicts) are written
// straight into the batch by the writers below, from x's fields; the
// others go through x.encode and expr. At 260,000 DNAT rules (10,000
// Services x 25 endpoints) the google/nftables/expr values alone, one
// allocation each, were about 80 MiB of garbage per full sync.
// TestRexprEncodingMatchesEncode checks that both ways write the same
// bytes.
func (e *encoder) rexpr(x rexpr) error {
	switch x := x.(type) {
	case protoMatch:
		e.protoMatch(x.proto)
		return nil
	case numgenZero:
		e.numgenExpr(reg1, unix.NFT_NG_RANDOM, x.mod, 0)
		e.cmpExpr(reg1, nexpr.CmpOpEq, zero4[:])
		return nil
	case dnatTo:
		var addr [16]byte
		e.immediateExpr(reg1, addrBytes(x.addr, &addr))
		var port [2]byte
		binary.BigEndian.PutUint16(port[:], x.port)
		e.immediateExpr(reg2, port[:])
		e.natExpr(nexpr.NATTypeDestNAT, natFamily(e.f), reg1, reg2, true)
		return nil
	case dportMatch:
		e.protoMatch(x.proto)
		e.payloadExpr(reg1, nexpr.PayloadBaseTransportHeader, 2, 2)
		var port [2]byte
		binary.BigEndian.PutUint16(port[:], x.port)
		e.cmpExpr(reg1, nexpr.CmpOpEq, port[:])
		return nil
	case addrMatch:
		if x.p.Bits()%8 == 0 {
			op := nexpr.CmpOpEq
			if x.neg {
				op = nexpr.CmpOpNeq
			}
			n := uint32(x.p.Bits() / 8)
			e.payloadExpr(reg1, nexpr.PayloadBaseNetworkHeader, addrOffset(e.f, x.src), n)
			var addr [16]byte
			e.cmpExpr(reg1, op, addrBytes(x.p.Addr(), &addr)[:n])
			return nil
		}
	case verdict:
		if x.kind != verdictNone {
			e.verdictExpr(x)
			return nil
		}
	}
	e.exprs = x.encode(e.exprs[:0], e.f)
	for _, n := range e.exprs {
		if e.expr(n) {
			continue
		}
		data, err := nexpr.Marshal(e.fam, n)
		if err != nil {
			return err
		}
		e.attr(unix.NFTA_LIST_ELEM|nlaNested, data)
	}
	return nil
}

var zero4 [4]byte

// addrBytes is a.AsSlice() in buf, without allocating.
func addrBytes(a netip.Addr, buf *[16]byte) []byte {
	if a.Is4() {
		b := a.As4()
		return append(buf[:0], b[:]...)
	}
	*buf = a.As16()
	return buf[:]
}

// natFamily is the NAT expression's family of f.
func natFamily(f dataplane.Family) uint32 {
	if f == dataplane.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// expr writes the most frequent expressions straight into the batch, with
// the attributes google/nftables/expr would marshal, and reports whether it
// did; the others are marshalled by google/nftables. Its Marshal builds
// each expression's attributes in slices of its own: at 260,000 DNAT rules
// (10,000 Services x 25 endpoints) 250 MiB of garbage per full sync.
func (e *encoder) expr(x nexpr.Any) bool {
	switch x := x.(type) {
	case *nexpr.Cmp:
		e.cmpExpr(x.Register, x.Op, x.Data)
	case *nexpr.Meta:
		e.metaExpr(x.Key, x.Register, x.SourceRegister)
	case *nexpr.Numgen:
		e.numgenExpr(x.Register, x.Type, x.Modulus, x.Offset)
	case *nexpr.Immediate:
		e.immediateExpr(x.Register, x.Data)
	case *nexpr.Payload:
		if x.OperationType != nexpr.PayloadLoad || x.CsumType != 0 {
			return false
		}
		e.payloadExpr(x.DestRegister, x.Base, x.Offset, x.Len)
	case *nexpr.NAT:
		if x.RegAddrMax != 0 || x.RegProtoMax != 0 || x.Random || x.FullyRandom || x.Persistent || x.Prefix {
			return false
		}
		e.natExpr(x.Type, x.Family, x.RegAddrMin, x.RegProtoMin, x.Specified)
	default:
		return false
	}
	return true
}

// The expression writers: each writes one expression, attribute for
// attribute as google/nftables/expr marshals it
// (TestExprEncodingMatchesGoogle).

func (e *encoder) beginExpr(name string) {
	e.begin(unix.NFTA_LIST_ELEM)
	e.str(unix.NFTA_EXPR_NAME, name)
	e.begin(unix.NFTA_EXPR_DATA)
}

func (e *encoder) endExpr() {
	e.end()
	e.end()
}

func (e *encoder) value(typ uint16, data []byte) {
	e.begin(typ)
	e.attr(unix.NFTA_DATA_VALUE, data)
	e.end()
}

func (e *encoder) cmpExpr(reg uint32, op nexpr.CmpOp, data []byte) {
	e.beginExpr("cmp")
	e.u32(unix.NFTA_CMP_SREG, reg)
	e.u32(unix.NFTA_CMP_OP, uint32(op))
	e.value(unix.NFTA_CMP_DATA, data)
	e.endExpr()
}

func (e *encoder) metaExpr(key nexpr.MetaKey, reg uint32, source bool) {
	e.beginExpr("meta")
	e.u32(unix.NFTA_META_KEY, uint32(key))
	if source {
		e.u32(unix.NFTA_META_SREG, reg)
	} else {
		e.u32(unix.NFTA_META_DREG, reg)
	}
	e.endExpr()
}

// protoMatch is "meta l4proto P".
func (e *encoder) protoMatch(proto uint8) {
	e.metaExpr(nexpr.MetaKeyL4PROTO, reg1, false)
	e.cmpExpr(reg1, nexpr.CmpOpEq, []byte{proto})
}

func (e *encoder) numgenExpr(reg, typ, mod, off uint32) {
	e.beginExpr("numgen")
	e.u32(unix.NFTA_NG_DREG, reg)
	e.u32(unix.NFTA_NG_MODULUS, mod)
	e.u32(unix.NFTA_NG_TYPE, typ)
	e.u32(unix.NFTA_NG_OFFSET, off)
	e.endExpr()
}

func (e *encoder) immediateExpr(reg uint32, data []byte) {
	e.beginExpr("immediate")
	e.u32(unix.NFTA_IMMEDIATE_DREG, reg)
	e.value(unix.NFTA_IMMEDIATE_DATA, data)
	e.endExpr()
}

func (e *encoder) payloadExpr(reg uint32, base nexpr.PayloadBase, off, n uint32) {
	e.beginExpr("payload")
	e.u32(unix.NFTA_PAYLOAD_DREG, reg)
	e.u32(unix.NFTA_PAYLOAD_BASE, uint32(base))
	e.u32(unix.NFTA_PAYLOAD_OFFSET, off)
	e.u32(unix.NFTA_PAYLOAD_LEN, n)
	e.endExpr()
}

func (e *encoder) natExpr(typ nexpr.NATType, family, regAddr, regProto uint32, specified bool) {
	e.beginExpr("nat")
	e.u32(unix.NFTA_NAT_TYPE, uint32(typ))
	e.u32(unix.NFTA_NAT_FAMILY, family)
	if regAddr != 0 {
		e.u32(unix.NFTA_NAT_REG_ADDR_MIN, regAddr)
	}
	if regProto != 0 {
		e.u32(unix.NFTA_NAT_REG_PROTO_MIN, regProto)
	}
	if specified {
		e.u32(unix.NFTA_NAT_FLAGS, nexpr.NF_NAT_RANGE_PROTO_SPECIFIED)
	}
	e.endExpr()
}

// verdictExpr is an immediate to the verdict register, as
// google/nftables/expr marshals a Verdict.
func (e *encoder) verdictExpr(v verdict) {
	e.beginExpr("immediate")
	e.u32(unix.NFTA_IMMEDIATE_DREG, regVerdict)
	e.begin(unix.NFTA_IMMEDIATE_DATA)
	e.begin(unix.NFTA_DATA_VERDICT)
	e.u32(unix.NFTA_VERDICT_CODE, uint32(verdictCodes[v.kind]))
	if v.chain != "" {
		e.str(unix.NFTA_VERDICT_CHAIN, v.chain)
	}
	e.end()
	e.end()
	e.endExpr()
}

// hookNumbers are the netfilter hooks of the inet families.
var hookNumbers = map[string]uint32{
	"prerouting":  unix.NF_INET_PRE_ROUTING,
	"input":       unix.NF_INET_LOCAL_IN,
	"forward":     unix.NF_INET_FORWARD,
	"output":      unix.NF_INET_LOCAL_OUT,
	"postrouting": unix.NF_INET_POST_ROUTING,
}

// nft's datatype numbers, which the kernel stores for nft to display.
const (
	typeIPv4Addr    = 7
	typeIPv6Addr    = 8
	typeInetProto   = 12
	typeInetService = 13
	typeInteger     = 4
	typeBits        = 6 // a concatenation shifts each type by this
)

// keyType returns the set key's datatype and length.
func keyType(f dataplane.Family, k keyKind) (typ, length uint32) {
	addr, alen := uint32(typeIPv4Addr), uint32(4)
	if f == dataplane.IPv6 {
		addr, alen = typeIPv6Addr, 16
	}
	switch k {
	case keyAddr:
		return addr, alen
	case keyProtoPort:
		return typeInetProto<<typeBits | typeInetService, 8
	case keyIndex:
		return typeInteger, 4
	case keyHairpin:
		return addr<<(3*typeBits) | addr<<(2*typeBits) | typeInetProto<<typeBits | typeInetService, 2*alen + 8
	}
	return addr<<(2*typeBits) | typeInetProto<<typeBits | typeInetService, alen + 8
}

// udataEndpoints is the user data nft 1.0.6 writes for an endpoint map,
// "typeof numgen random mod 1 : ip daddr . th dport" (ip6 for IPv6):
// the key's byte order (host) and the typeof expressions, which nft reads
// back to display the map and to accept it in a "dnat ... map" rule.
// Captured from nft --debug=mnl; only the daddr's payload differs: its
// protocol (nft's proto_desc_id, PROTO_DESC_IP 12 or PROTO_DESC_IP6 13)
// and its field in that header (IPHDR_DADDR 12, IP6HDR_DADDR 9).
var (
	udataEndpointsV4 = udataEndpoints(0x0c, 0x0c)
	udataEndpointsV6 = udataEndpoints(0x0d, 0x09)
)

func udataEndpoints(protoDesc, daddrField byte) []byte {
	return []byte{
		0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00,
		0x03, 0x1a, 0x00, 0x04, 0x17, 0x00, 0x00, 0x00, 0x01, 0x12, 0x00, 0x04,
		0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x00, 0x00, 0x00, 0x02, 0x04,
		0x00, 0x00, 0x00, 0x00, 0x04, 0x34, 0x00, 0x04, 0x0d, 0x00, 0x00, 0x00,
		0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c,
		0x00, 0x04, protoDesc, 0x00, 0x00, 0x00, 0x01, 0x04, daddrField, 0x00, 0x00, 0x00,
		0x01, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x04,
		0x0b, 0x00, 0x00, 0x00, 0x01, 0x04, 0x02, 0x00, 0x00, 0x00, 0x06, 0x04,
		0x00, 0x00, 0x00, 0x00,
	}
}

// Set user data nft reads back to display a set: the key's byte order
// (NFTNL_UDATA_SET_KEYBYTEORDER), 2 for big endian, as nft writes it for an
// address set. Concatenations carry none.
var udataKeyBigEndian = []byte{0, 4, 2, 0, 0, 0}

func (e *encoder) addSet(s *set, i int) {
	start := e.msg(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, i)
	e.str(unix.NFTA_SET_TABLE, TableName)
	e.str(unix.NFTA_SET_NAME, s.name)
	flags := uint32(0)
	if s.isMap() {
		flags |= unix.NFT_SET_MAP
	}
	if s.timeout > 0 {
		flags |= unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL
	}
	e.u32(unix.NFTA_SET_FLAGS, flags)
	typ, length := keyType(e.f, s.key)
	e.u32(unix.NFTA_SET_KEY_TYPE, typ)
	e.u32(unix.NFTA_SET_KEY_LEN, length)
	if s.vmap {
		e.u32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		e.u32(unix.NFTA_SET_DATA_LEN, 0)
	}
	if s.endpoints {
		addr, alen := keyType(e.f, keyAddr)
		e.u32(unix.NFTA_SET_DATA_TYPE, addr<<typeBits|typeInetService)
		e.u32(unix.NFTA_SET_DATA_LEN, alen+4)
	}
	e.setIDs++
	e.u32(unix.NFTA_SET_ID, e.setIDs)
	if s.timeout > 0 {
		e.attr(unix.NFTA_SET_TIMEOUT, binary.BigEndian.AppendUint64(nil, uint64(s.timeout.Milliseconds())))
	}
	switch {
	case s.endpoints && e.f == dataplane.IPv6:
		e.attr(unix.NFTA_SET_USERDATA, udataEndpointsV6)
	case s.endpoints:
		e.attr(unix.NFTA_SET_USERDATA, udataEndpointsV4)
	case s.key == keyAddr:
		e.attr(unix.NFTA_SET_USERDATA, udataKeyBigEndian)
	}
	e.finish(start)
}

// Netfilter verdicts (NF_DROP, NF_ACCEPT).
const (
	nfDrop   = 0
	nfAccept = 1
)

// verdictCodes are the kernel's verdict numbers.
var verdictCodes = map[verdictKind]int32{
	verdictAccept: nfAccept,
	verdictDrop:   nfDrop,
	verdictReturn: unix.NFT_RETURN,
	verdictJump:   unix.NFT_JUMP,
	verdictGoto:   unix.NFT_GOTO,
}

// elements writes element additions or deletions, split over as many
// messages as the 16-bit length of the element list needs; an operation
// without elements writes none.
func (e *encoder) elements(o *op, i int) {
	typ := uint16(unix.NFT_MSG_NEWSETELEM)
	flags := uint16(unix.NLM_F_CREATE)
	if o.kind == opDeleteElements {
		typ, flags = unix.NFT_MSG_DELSETELEM, 0
	}
	if e.elems == nil {
		e.elems = map[int]elemMsg{}
	}
	var key [40]byte // the longest key, IPv6 hairpin's
	start, list := -1, 0
	var m elemMsg
	closeMsg := func() {
		e.end()
		e.finish(start)
		m.hi = len(e.offsets)
		e.elems[len(e.msgOp)-1] = m
		start = -1
	}
	o.eachElem(func(j int, el element, _ string) bool {
		if start < 0 {
			start = e.msg(typ, flags, i)
			m = elemMsg{first: j, lo: len(e.offsets)}
			e.str(unix.NFTA_SET_ELEM_LIST_TABLE, TableName)
			e.str(unix.NFTA_SET_ELEM_LIST_SET, o.set.name)
			e.begin(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
			list = len(e.b)
		}
		e.offsets = append(e.offsets, uint32(len(e.b)-start))
		e.begin(unix.NFTA_LIST_ELEM)
		e.begin(unix.NFTA_SET_ELEM_KEY)
		e.attr(unix.NFTA_DATA_VALUE, el.key.bytes(o.set.key, key[:0]))
		e.end()
		if o.set.vmap && o.kind == opAddElements {
			e.begin(unix.NFTA_SET_ELEM_DATA)
			e.begin(unix.NFTA_DATA_VERDICT)
			e.u32(unix.NFTA_VERDICT_CODE, uint32(verdictCodes[el.verdict.kind]))
			if el.verdict.chain != "" {
				e.str(unix.NFTA_VERDICT_CHAIN, el.verdict.chain)
			}
			e.end()
			e.end()
		}
		if o.set.endpoints && o.kind == opAddElements {
			e.begin(unix.NFTA_SET_ELEM_DATA)
			e.attr(unix.NFTA_DATA_VALUE, endpointBytes(el.endpoint, key[:0]))
			e.end()
		}
		e.end()
		if len(e.b)-list >= maxElemsNest {
			closeMsg()
		}
		return true
	})
	if start >= 0 {
		closeMsg()
	}
}
