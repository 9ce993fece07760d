package nftables

import (
	"encoding/binary"
	"fmt"

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
	buf []byte
	// first is the sequence number of the first message after
	// BATCH_BEGIN; msgOp[i] is the operation of message first+i.
	first uint32
	msgOp []int
	// last is the sequence number of the last operation message, the
	// only one that asks an acknowledgement: once it arrives, every error
	// the batch caused has arrived before it.
	last uint32
	// elems maps the element messages (by index) to their elements, so
	// that a refused element is found from the kernel's error offset.
	elems map[int]elemMsg
}

// elemMsg locates a message's elements: the index in its operation of
// the first, and each one's attribute offset in the message.
type elemMsg struct {
	first   int
	offsets []uint32
}

// element returns the index in the operation of the element whose
// attribute holds offset off of the message, -1 if none does.
func (m elemMsg) element(off uint32) int {
	for i := len(m.offsets) - 1; i >= 0; i-- {
		if m.offsets[i] <= off {
			return m.first + i
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

// encoder builds a batch.
type encoder struct {
	f     dataplane.Family
	fam   byte // NFPROTO_IPV4 or NFPROTO_IPV6
	b     []byte
	seq   uint32
	msgOp []int
	// nests holds the start offsets of open attributes.
	nests []int
	// exprs is scratch space for a rule's expressions.
	exprs  []nexpr.Any
	setIDs uint32
	// lastMsg is the offset of the last operation message.
	lastMsg int
	elems   map[int]elemMsg
}

// encodeBatch encodes tx with sequence numbers from seq on.
func encodeBatch(tx *transaction, f dataplane.Family, seq uint32) (*batch, error) {
	e := &encoder{f: f, fam: unix.NFPROTO_IPV4, seq: seq}
	if f == dataplane.IPv6 {
		e.fam = unix.NFPROTO_IPV6
	}
	// About 256 bytes a message and 64 an element: one allocation of
	// the batch rather than doublings (the kernel needs it whole).
	size := 256*len(tx.ops) + 64
	for i := range tx.ops {
		size += 64 * len(tx.ops[i].elems)
		if r := tx.ops[i].rule; r != nil {
			size += 128 * len(r.exprs)
		}
	}
	e.b = make([]byte, 0, size)
	e.control(unix.NFNL_MSG_BATCH_BEGIN)
	first := e.seq
	for i := range tx.ops {
		if err := e.op(&tx.ops[i], i); err != nil {
			return nil, fmt.Errorf("encoding %q: %w", tx.ops[i].text(f), err)
		}
	}
	if len(e.msgOp) == 0 {
		return &batch{first: first}, nil
	}
	last := e.seq - 1
	e.ackLast()
	e.control(unix.NFNL_MSG_BATCH_END)
	return &batch{buf: e.b, first: first, msgOp: e.msgOp, last: last, elems: e.elems}, nil
}

// control writes BATCH_BEGIN or BATCH_END.
func (e *encoder) control(typ uint16) {
	start := e.header(typ, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(e.b[start+nlmsgHdrLen+2:], unix.NFNL_SUBSYS_NFTABLES)
	e.finish(start)
}

// header starts a message and returns its offset.
func (e *encoder) header(typ, flags uint16, family byte) int {
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
	e.msgOp = append(e.msgOp, i)
	e.lastMsg = len(e.b)
	return e.header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, unix.NLM_F_REQUEST|flags, e.fam)
}

// ackLast asks an acknowledgement of the last message.
func (e *encoder) ackLast() {
	flags := binary.NativeEndian.Uint16(e.b[e.lastMsg+6:])
	binary.NativeEndian.PutUint16(e.b[e.lastMsg+6:], flags|unix.NLM_F_ACK)
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
		e.exprs = e.exprs[:0]
		for _, x := range o.rule.exprs {
			e.exprs = x.encode(e.exprs, e.f)
		}
		for _, x := range e.exprs {
			if e.expr(x) {
				continue
			}
			data, err := nexpr.Marshal(e.fam, x)
			if err != nil {
				return err
			}
			e.attr(unix.NFTA_LIST_ELEM|nlaNested, data)
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

// expr writes the most frequent expressions straight into the batch, with
// the attributes google/nftables/expr would marshal, and reports whether it
// did; the others are marshalled by google/nftables. Its Marshal builds
// each expression's attributes in slices of its own: at 260,000 DNAT rules
// (10,000 Services x 25 endpoints) 250 MiB of garbage per full sync.
func (e *encoder) expr(x nexpr.Any) bool {
	begin := func(name string) {
		e.begin(unix.NFTA_LIST_ELEM)
		e.str(unix.NFTA_EXPR_NAME, name)
		e.begin(unix.NFTA_EXPR_DATA)
	}
	end := func() {
		e.end()
		e.end()
	}
	value := func(typ uint16, data []byte) {
		e.begin(typ)
		e.attr(unix.NFTA_DATA_VALUE, data)
		e.end()
	}
	switch x := x.(type) {
	case *nexpr.Cmp:
		begin("cmp")
		e.u32(unix.NFTA_CMP_SREG, x.Register)
		e.u32(unix.NFTA_CMP_OP, uint32(x.Op))
		value(unix.NFTA_CMP_DATA, x.Data)
	case *nexpr.Meta:
		begin("meta")
		e.u32(unix.NFTA_META_KEY, uint32(x.Key))
		if x.SourceRegister {
			e.u32(unix.NFTA_META_SREG, x.Register)
		} else {
			e.u32(unix.NFTA_META_DREG, x.Register)
		}
	case *nexpr.Numgen:
		begin("numgen")
		e.u32(unix.NFTA_NG_DREG, x.Register)
		e.u32(unix.NFTA_NG_MODULUS, x.Modulus)
		e.u32(unix.NFTA_NG_TYPE, x.Type)
		e.u32(unix.NFTA_NG_OFFSET, x.Offset)
	case *nexpr.Immediate:
		begin("immediate")
		e.u32(unix.NFTA_IMMEDIATE_DREG, x.Register)
		value(unix.NFTA_IMMEDIATE_DATA, x.Data)
	case *nexpr.Payload:
		if x.OperationType != nexpr.PayloadLoad || x.CsumType != 0 {
			return false
		}
		begin("payload")
		e.u32(unix.NFTA_PAYLOAD_DREG, x.DestRegister)
		e.u32(unix.NFTA_PAYLOAD_BASE, uint32(x.Base))
		e.u32(unix.NFTA_PAYLOAD_OFFSET, x.Offset)
		e.u32(unix.NFTA_PAYLOAD_LEN, x.Len)
	case *nexpr.NAT:
		if x.RegAddrMax != 0 || x.RegProtoMax != 0 || x.Random || x.FullyRandom || x.Persistent || x.Prefix {
			return false
		}
		begin("nat")
		e.u32(unix.NFTA_NAT_TYPE, uint32(x.Type))
		e.u32(unix.NFTA_NAT_FAMILY, x.Family)
		if x.RegAddrMin != 0 {
			e.u32(unix.NFTA_NAT_REG_ADDR_MIN, x.RegAddrMin)
		}
		if x.RegProtoMin != 0 {
			e.u32(unix.NFTA_NAT_REG_PROTO_MIN, x.RegProtoMin)
		}
		if x.Specified {
			e.u32(unix.NFTA_NAT_FLAGS, nexpr.NF_NAT_RANGE_PROTO_SPECIFIED)
		}
	default:
		return false
	}
	end()
	return true
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
// Captured from nft --debug=mnl; only the daddr's protocol differs.
var (
	udataEndpointsV4 = udataEndpoints(0x0c, 0x0c)
	udataEndpointsV6 = udataEndpoints(0x0d, 0x09)
)

func udataEndpoints(base, proto byte) []byte {
	return []byte{
		0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00,
		0x03, 0x1a, 0x00, 0x04, 0x17, 0x00, 0x00, 0x00, 0x01, 0x12, 0x00, 0x04,
		0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x00, 0x00, 0x00, 0x02, 0x04,
		0x00, 0x00, 0x00, 0x00, 0x04, 0x34, 0x00, 0x04, 0x0d, 0x00, 0x00, 0x00,
		0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c,
		0x00, 0x04, base, 0x00, 0x00, 0x00, 0x01, 0x04, proto, 0x00, 0x00, 0x00,
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
// messages as the 16-bit length of the element list needs.
func (e *encoder) elements(o *op, i int) {
	typ := uint16(unix.NFT_MSG_NEWSETELEM)
	flags := uint16(unix.NLM_F_CREATE)
	if o.kind == opDeleteElements {
		typ, flags = unix.NFT_MSG_DELSETELEM, 0
	}
	var key []byte
	if e.elems == nil {
		e.elems = map[int]elemMsg{}
	}
	for j := 0; j < len(o.elems); {
		start := e.msg(typ, flags, i)
		m := elemMsg{first: j}
		e.str(unix.NFTA_SET_ELEM_LIST_TABLE, TableName)
		e.str(unix.NFTA_SET_ELEM_LIST_SET, o.set.name)
		e.begin(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		list := len(e.b)
		for ; j < len(o.elems) && len(e.b)-list < maxElemsNest; j++ {
			el := o.elems[j]
			m.offsets = append(m.offsets, uint32(len(e.b)-start))
			e.begin(unix.NFTA_LIST_ELEM)
			e.begin(unix.NFTA_SET_ELEM_KEY)
			key = el.key.bytes(o.set.key, key[:0])
			e.attr(unix.NFTA_DATA_VALUE, key)
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
				key = endpointBytes(el.endpoint, key[:0])
				e.attr(unix.NFTA_DATA_VALUE, key)
				e.end()
			}
			e.end()
		}
		e.end()
		e.finish(start)
		e.elems[len(e.msgOp)-1] = m
	}
}
