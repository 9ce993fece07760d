package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// flow is a new connection's first packet as the node sees it.
type flow struct {
	src, dst string
	proto    Protocol
	dport    uint16
	// fromNode: the node itself opens the connection (nat OUTPUT, then
	// IPVS in LOCAL_OUT); otherwise the packet arrives from a pod or a
	// client (nat PREROUTING, routing, filter INPUT, IPVS in LOCAL_IN).
	fromNode bool
}

func (f flow) String() string {
	from := ""
	if f.fromNode {
		from = " (node)"
	}
	return fmt.Sprintf("%s %s -> %s%s", f.proto, f.src, netip.AddrPortFrom(netip.MustParseAddr(f.dst), f.dport), from)
}

// Verdicts of a traced packet.
const (
	accepted = "ACCEPT" // IPVS sent it to dest
	dropped  = "DROP"   // a filter rule dropped it
	rejected = "REJECT" // a filter rule, or IPVS with no real server, refused it
	local    = "LOCAL"  // delivered to the node's own sockets
	routed   = "ROUTED" // not local: forwarded on, not ours to handle
)

// outcome is where one possible path of a packet ends.
type outcome struct {
	dest    string // real server "ip:port" IPVS chose, "" if none
	verdict string
	masq    bool // masqueraded in POSTROUTING
}

func (o outcome) String() string {
	s := o.verdict
	if o.dest != "" {
		s += " " + o.dest
	}
	if o.masq {
		s += " masq"
	}
	return s
}

// tracer walks a packet through a fakeKernel the way netfilter and IPVS
// would: nat PREROUTING (or OUTPUT), the routing decision (local: a node
// address or one bound to the dummy link), filter INPUT, IPVS (any real
// server of weight > 0, or a refusal without one), nat POSTROUTING.
type tracer struct {
	tb testing.TB
	k  *fakeKernel
	// family of the flow being traced: its iptables tables.
	family dataplane.Family
}

func (tr *tracer) ipt() *fakeIPTables { return tr.k.iptables[tr.family] }

type pkt struct {
	src, dst netip.Addr
	proto    Protocol
	dport    uint16
	mark     uint32
	masq     bool
}

// trace returns every outcome the flow can have, sorted.
func (tr *tracer) trace(f flow) []outcome {
	tr.tb.Helper()
	p := pkt{src: netip.MustParseAddr(f.src), dst: netip.MustParseAddr(f.dst), proto: f.proto, dport: f.dport}
	tr.family = dataplane.IPv4
	if p.dst.Is6() {
		tr.family = dataplane.IPv6
	}
	natHook := "PREROUTING"
	if f.fromNode {
		natHook = "OUTPUT"
	}
	p, verdict := tr.chain("nat", natHook, p, 0)
	if verdict != "ACCEPT" {
		return []outcome{{verdict: verdict}}
	}
	isLocal := tr.k.links.local(p.dst)
	if !f.fromNode {
		if !isLocal {
			return []outcome{{verdict: routed}}
		}
		if _, v := tr.chain("filter", "INPUT", p, 0); v != "ACCEPT" {
			return []outcome{{verdict: v}}
		}
	}
	vs := tr.k.ipvs.vss[vsKey{p.dst, p.proto, p.dport}]
	if vs == nil {
		if isLocal {
			return []outcome{{verdict: local}}
		}
		return []outcome{{verdict: routed}}
	}
	var outs []outcome
	for _, ap := range slices.SortedFunc(mapKeys(vs.dests), netip.AddrPort.Compare) {
		if vs.dests[ap].Weight == 0 {
			continue
		}
		q := p
		q.dst, q.dport = ap.Addr(), ap.Port()
		q, v := tr.chain("nat", "POSTROUTING", q, 0)
		if v != "ACCEPT" {
			tr.tb.Fatalf("trace %v: POSTROUTING gave %s", f, v)
		}
		outs = append(outs, outcome{dest: ap.String(), verdict: accepted, masq: q.masq})
	}
	if len(outs) == 0 {
		// ip_vs_leave: no real server, so an ICMP port unreachable.
		return []outcome{{verdict: rejected}}
	}
	return outs
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// chain evaluates chain and returns the packet and its verdict: ACCEPT
// when a built-in chain falls through, "" when a user chain does (or
// RETURNs).
func (tr *tracer) chain(table, chain string, p pkt, depth int) (pkt, string) {
	if depth > 10 {
		tr.tb.Fatalf("trace: chain depth exceeded at %s/%s", table, chain)
	}
	rules, ok := tr.ipt().tables[table][chain]
	if !ok {
		tr.tb.Fatalf("trace: no chain %s/%s", table, chain)
	}
	for _, rule := range rules {
		var v string
		p, v = tr.rule(table, rule, p, depth)
		switch v {
		case "":
		case "RETURN":
			return p, tr.fallThrough(table, chain)
		default:
			return p, v
		}
	}
	return p, tr.fallThrough(table, chain)
}

func (tr *tracer) fallThrough(table, chain string) string {
	if slices.Contains(builtinChains[table], chain) {
		return "ACCEPT"
	}
	return ""
}

// rule applies one rule; the verdict is "" to go on with the next rule.
func (tr *tracer) rule(table, rule string, p pkt, depth int) (pkt, string) {
	args := dptest.Tokenize(rule)
	neg := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		val := func() string {
			i++
			if i >= len(args) {
				tr.tb.Fatalf("trace: %q: %s needs a value", rule, a)
			}
			return args[i]
		}
		match := true
		switch a {
		case "!":
			neg = true
			continue
		case "-m", "--comment":
			val()
			continue
		case "-p":
			match = val() == p.proto.lower()
		case "-s":
			match = dptest.PrefixOf(val()).Contains(p.src)
		case "-d":
			match = dptest.PrefixOf(val()).Contains(p.dst)
		case "--src-type", "--dst-type":
			if val() != "LOCAL" {
				tr.tb.Fatalf("trace: unsupported addrtype in %q", rule)
			}
			addr := p.src
			if a == "--dst-type" {
				addr = p.dst
			}
			match = tr.k.links.local(addr) || addr.IsLoopback()
		case "--ctstate":
			match = slices.Contains(strings.Split(val(), ","), "NEW")
		case "--mark":
			v, m, _ := strings.Cut(val(), "/")
			vv, _ := strconv.ParseUint(v, 0, 32)
			mm := uint64(0xffffffff)
			if m != "" {
				mm, _ = strconv.ParseUint(m, 0, 32)
			}
			match = uint64(p.mark)&mm == vv
		case "--match-set":
			name := val()
			match = tr.inSet(name, val(), p)
		case "-j":
			return tr.target(table, val(), args[i+1:], p, depth)
		default:
			tr.tb.Fatalf("trace: unsupported option %q in %q", a, rule)
		}
		if neg {
			match, neg = !match, false
		}
		if !match {
			return p, ""
		}
	}
	return p, ""
}

func (tr *tracer) target(table, target string, args []string, p pkt, depth int) (pkt, string) {
	switch target {
	case "ACCEPT", "DROP", "REJECT", "RETURN":
		return p, target
	case "MARK":
		v, _ := strconv.ParseUint(args[1], 0, 32)
		switch args[0] {
		case "--or-mark":
			p.mark |= uint32(v)
		case "--xor-mark":
			p.mark ^= uint32(v)
		default:
			tr.tb.Fatalf("trace: bad MARK %v", args)
		}
		return p, ""
	case "MASQUERADE":
		p.masq = true
		return p, "ACCEPT"
	}
	return tr.chain(table, target, p, depth+1)
}

// inSet matches p against set name with direction flags dirs ("dst,dst",
// "dst,dst,src", "dst"), as the set match does for each set type.
func (tr *tracer) inSet(name, dirs string, p pkt) bool {
	s := tr.k.ipset.sets[name]
	if s == nil {
		tr.tb.Fatalf("trace: no set %s", name)
	}
	d := strings.Split(dirs, ",")
	ip := func(i int) netip.Addr {
		if d[i] == "src" {
			return p.src
		}
		return p.dst
	}
	port := func(i int) string {
		if d[i] == "src" {
			tr.tb.Fatalf("trace: source ports are not modelled (%s %s)", name, dirs)
		}
		return strconv.Itoa(int(p.dport))
	}
	switch s.typ {
	case "hash:ip":
		return s.members[ip(0).String()]
	case "bitmap:port":
		return s.members[port(0)]
	case "hash:ip,port":
		return s.members[ip(0).String()+","+p.proto.lower()+":"+port(1)]
	case "hash:ip,port,ip":
		return s.members[ip(0).String()+","+p.proto.lower()+":"+port(1)+","+ip(2).String()]
	case "hash:ip,port,net":
		head := ip(0).String() + "," + p.proto.lower() + ":" + port(1) + ","
		for m := range s.members {
			if rest, ok := strings.CutPrefix(m, head); ok && dptest.PrefixOf(rest).Contains(ip(2)) {
				return true
			}
		}
		return false
	}
	tr.tb.Fatalf("trace: unsupported set type %s", s.typ)
	return false
}
