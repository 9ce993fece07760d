package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	nexpr "github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// message is one decoded netlink message of a batch.
type message struct {
	typ, flags uint16
	seq        uint32
	attrs      []attr
}

func decodeBatch(t *testing.T, buf []byte) []message {
	t.Helper()
	var out []message
	for len(buf) > 0 {
		l := int(binary.NativeEndian.Uint32(buf))
		if l < nlmsgHdrLen+nfgenLen || l > len(buf) {
			t.Fatalf("bad message length %d", l)
		}
		out = append(out, message{
			typ: binary.NativeEndian.Uint16(buf[4:]), flags: binary.NativeEndian.Uint16(buf[6:]),
			seq: binary.NativeEndian.Uint32(buf[8:]), attrs: parseAttrs(buf[nlmsgHdrLen+nfgenLen : l]),
		})
		buf = buf[nlmsgAlign(l):]
	}
	return out
}

// TestEncodeBatchFraming checks the batch: BEGIN, the operations with
// consecutive sequence numbers, only the last asking an acknowledgement,
// END; and the operation of each message known for error reports.
func TestEncodeBatchFraming(t *testing.T) {
	st := fullState(dptest.Table(t, dptest.Node(), dptest.ClusterIPTwoEndpoints(), dptest.NodePortService()), testConfig(dataplane.IPv4))
	tx := fullTransaction(st, nil, true)
	b, err := encodeBatch(tx, dataplane.IPv4, 100)
	if err != nil {
		t.Fatal(err)
	}
	msgs := decodeBatch(t, bytes.Join(b.bufs, nil))
	if msgs[0].typ != unix.NFNL_MSG_BATCH_BEGIN || msgs[len(msgs)-1].typ != unix.NFNL_MSG_BATCH_END {
		t.Fatalf("batch not framed by BEGIN and END")
	}
	ops := msgs[1 : len(msgs)-1]
	if len(ops) != len(b.msgOp) || b.first != 101 || b.last != b.first+uint32(len(ops))-1 {
		t.Fatalf("%d messages, msgOp %d, first %d, last %d", len(ops), len(b.msgOp), b.first, b.last)
	}
	for i, m := range ops {
		if m.seq != b.first+uint32(i) {
			t.Fatalf("message %d has seq %d, want %d", i, m.seq, b.first+uint32(i))
		}
		if ack := m.flags&unix.NLM_F_ACK != 0; ack != (i == len(ops)-1) {
			t.Errorf("message %d asks an ack: %v", i, ack)
		}
		if m.typ>>8 != unix.NFNL_SUBSYS_NFTABLES {
			t.Errorf("message %d is not for nf_tables: %#x", i, m.typ)
		}
	}
	if got := tx.op(int(b.msgOp[len(ops)-1])).kind; got != opAddElements {
		t.Errorf("last message's operation is %d, want the elements", got)
	}
}

// TestEncodeElementsSplit checks that a long element list is split over
// messages whose list attribute stays under 64 KiB (its length field is 16
// bits), with every element present and each message's offsets locating
// its elements.
func TestEncodeElementsSplit(t *testing.T) {
	s := &set{name: mapServiceIPs, key: keyAddrProtoPort, vmap: true}
	o := op{kind: opAddElements, set: s}
	for i := range 5000 {
		o.elems = append(o.elems, element{
			key:     elemKey{addr: mustAddr(dptest.AddrAt("10.96.0.0", i)), proto: protoTCP, port: 80},
			verdict: goTo("service-XXXXXXXX-ns/some-rather-long-service-name/tcp/http"),
		})
	}
	b, err := encodeBatch(&transaction{ops: []op{o}}, dataplane.IPv4, 1)
	if err != nil {
		t.Fatal(err)
	}
	msgs := decodeBatch(t, bytes.Join(b.bufs, nil))
	total := 0
	for i, m := range msgs[1 : len(msgs)-1] {
		n := 0
		for _, a := range m.attrs {
			if a.typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				if len(a.data)+nlaHdrLen >= 1<<16 {
					t.Errorf("message %d: element list of %d bytes overflows its length", i, len(a.data))
				}
				n = len(parseAttrs(a.data))
			}
		}
		em, ok := b.elems[i]
		if !ok || em.n() != n || em.first != total {
			t.Errorf("message %d: %d elements, index %+v", i, n, em)
		}
		total += n
	}
	if total != len(o.elems) || len(msgs) < 4 {
		t.Fatalf("%d elements in %d messages, want %d in several", total, len(msgs)-2, len(o.elems))
	}
}

// forEachCaseRule calls f with every rule of every case's full ruleset,
// cascades and endpoint maps alike, and an encoder of the case's family.
func forEachCaseRule(t *testing.T, f func(c dptest.Case, e *encoder, r *rule)) {
	t.Helper()
	for _, c := range dptest.Cases {
		for _, mapMin := range []int{0, 1} {
			cfg := caseConfig(c)
			cfg.EndpointMapMin = mapMin
			st := fullState(dptest.Table(t, dptest.Node(), c.Services()...), cfg)
			e := &encoder{f: c.Family, fam: unix.NFPROTO_IPV4}
			if c.Family == dataplane.IPv6 {
				e.fam = unix.NFPROTO_IPV6
			}
			for _, o := range opsOf(fullTransaction(st, nil, false)) {
				if o.rule != nil {
					f(c, e, o.rule)
				}
			}
		}
	}
}

// TestExprEncodingMatchesGoogle checks that the expressions the encoder
// writes itself are byte for byte what google/nftables/expr marshals, for
// every expression of every case's ruleset (both families, cascades and
// endpoint maps).
func TestExprEncodingMatchesGoogle(t *testing.T) {
	seen := map[string]int{}
	forEachCaseRule(t, func(c dptest.Case, e *encoder, r *rule) {
		var exprs []nexpr.Any
		for _, x := range r.exprs {
			exprs = x.encode(exprs, c.Family)
		}
		for _, x := range exprs {
			e.b = e.b[:0]
			if !e.expr(x) {
				continue
			}
			kind := fmt.Sprintf("%T", x)
			if m, ok := x.(*nexpr.Meta); ok {
				kind += fmt.Sprintf(" SourceRegister=%v", m.SourceRegister)
			}
			seen[kind]++
			data, err := nexpr.Marshal(e.fam, x)
			if err != nil {
				t.Fatal(err)
			}
			want := &encoder{}
			want.attr(unix.NFTA_LIST_ELEM|nlaNested, data)
			if !bytes.Equal(e.b, want.b) {
				t.Errorf("%s: %T %+v encoded as\n%x, google/nftables:\n%x", c.Name, x, x, e.b, want.b)
			}
		}
	})
	// Every kind the encoder writes itself, so that a change to the cases
	// cannot leave one unchecked.
	for _, kind := range []string{
		"*expr.Cmp", "*expr.Meta SourceRegister=false", "*expr.Meta SourceRegister=true",
		"*expr.Numgen", "*expr.Immediate", "*expr.Payload", "*expr.NAT",
	} {
		if seen[kind] == 0 {
			t.Errorf("no %s encoded by the encoder itself and compared (seen: %v)", kind, seen)
		}
	}
}

// TestRexprEncodingMatchesEncode checks that the expressions the encoder
// writes from the model's own values (rexpr) are byte for byte what
// google/nftables/expr marshals from their encode, for every rule of
// every case's ruleset (both families, cascades and endpoint maps).
func TestRexprEncodingMatchesEncode(t *testing.T) {
	seen := map[string]int{}
	forEachCaseRule(t, func(c dptest.Case, e *encoder, r *rule) {
		for _, x := range r.exprs {
			e.b = e.b[:0]
			if err := e.rexpr(x); err != nil {
				t.Fatal(err)
			}
			want := &encoder{}
			for _, n := range x.encode(nil, c.Family) {
				data, err := nexpr.Marshal(e.fam, n)
				if err != nil {
					t.Fatal(err)
				}
				want.attr(unix.NFTA_LIST_ELEM|nlaNested, data)
			}
			seen[fmt.Sprintf("%T", x)]++
			if !bytes.Equal(e.b, want.b) {
				t.Errorf("%s: %T %+v encoded as\n%x, google/nftables:\n%x", c.Name, x, x, e.b, want.b)
			}
		}
	})
	// Every kind written from the model's values, so that a change to the
	// cases cannot leave one unchecked.
	for _, kind := range []string{
		"nftables.protoMatch", "nftables.numgenZero", "nftables.dnatTo", "nftables.dportMatch",
		"nftables.addrMatch", "nftables.verdict",
	} {
		if seen[kind] == 0 {
			t.Errorf("no %s encoded and compared (seen: %v)", kind, seen)
		}
	}
}
