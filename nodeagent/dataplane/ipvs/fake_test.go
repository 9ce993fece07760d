package ipvs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// fakeKernel models one network namespace behind every seam: IPVS, links,
// sysctls, ipsets and iptables (nat and filter), refusing what the kernel
// refuses (a real server of a missing virtual server, a rule matching a
// missing set, a jump to a missing chain). Every change is logged in order.
type fakeKernel struct {
	ipvs   *fakeIPVS
	links  *fakeLinks
	sysctl *fakeSysctl
	ipset  *fakeIPSet
	// iptables holds each family's tables: iptables and ip6tables are
	// separate in the kernel.
	iptables map[dataplane.Family]*fakeIPTables
	// log lists every change, as "ipvs add TCP 10.96.0.10:80".
	log []string
	// fail, when set, is asked before each change (op is the log line)
	// and fails it with the error it returns.
	fail func(op string) error
}

func newFakeKernel(nodeAddrs ...string) *fakeKernel {
	k := &fakeKernel{}
	k.ipvs = &fakeIPVS{k: k, vss: map[vsKey]*fakeVS{}}
	k.links = &fakeLinks{k: k, links: map[string]*fakeLink{}}
	for _, a := range nodeAddrs {
		k.links.node = append(k.links.node, netip.MustParseAddr(a))
	}
	// As the init container (nodeagent --init-only) leaves them.
	k.sysctl = &fakeSysctl{values: map[string]int{}}
	for _, c := range Sysctls(dataplane.IPv4) {
		k.sysctl.values[c.Name] = c.Value
	}
	k.ipset = &fakeIPSet{k: k, sets: map[string]*fakeSet{}}
	k.iptables = map[dataplane.Family]*fakeIPTables{dataplane.IPv4: newFakeIPTables(k, "iptables"), dataplane.IPv6: newFakeIPTables(k, "ip6tables")}
	return k
}

// seams returns the kernel's seams for family, with one iptables backend
// (nft).
func (k *fakeKernel) seams(family dataplane.Family) *seams {
	return &seams{ipvs: k.ipvs, links: k.links, sysctl: k.sysctl, ipset: k.ipset, iptables: map[xtables.Backend]xtables.Runner{xtables.BackendNFT: k.iptables[family]}}
}

// change logs op and asks the failure hook.
func (k *fakeKernel) change(op string) error {
	if k.fail != nil {
		if err := k.fail(op); err != nil {
			return err
		}
	}
	k.log = append(k.log, op)
	return nil
}

// ---- IPVS ----------------------------------------------------------------

type fakeIPVS struct {
	k        *fakeKernel
	vss      map[vsKey]*fakeVS
	timeouts [3]time.Duration
	reads    int // RealServers calls
}

type fakeVS struct {
	vs    VirtualServer
	dests map[netip.AddrPort]*RealServer
}

// count returns how many virtual servers of family the kernel holds, with
// how many real servers, and how many of those are being drained (weight
// 0).
func (f *fakeIPVS) count(family dataplane.Family) (vss, rss, draining int) {
	for k, v := range f.vss {
		if !family.Has(k.addr) {
			continue
		}
		vss++
		for _, rs := range v.dests {
			rss++
			if rs.Weight == 0 {
				draining++
			}
		}
	}
	return vss, rss, draining
}

func (f *fakeIPVS) VirtualServers() ([]VirtualServer, error) {
	out := make([]VirtualServer, 0, len(f.vss))
	for _, k := range slices.SortedFunc(maps.Keys(f.vss), vsKey.compare) {
		out = append(out, f.vss[k].vs)
	}
	return out, nil
}

func (f *fakeIPVS) AddVirtualServer(vs VirtualServer) error {
	if _, ok := f.vss[vs.key()]; ok {
		return syscall.EEXIST
	}
	if err := f.k.change("ipvs add " + vsString(vs)); err != nil {
		return err
	}
	f.vss[vs.key()] = &fakeVS{vs: vs, dests: map[netip.AddrPort]*RealServer{}}
	return nil
}

func (f *fakeIPVS) UpdateVirtualServer(vs VirtualServer) error {
	v, ok := f.vss[vs.key()]
	if !ok {
		return syscall.ESRCH
	}
	if err := f.k.change("ipvs update " + vsString(vs)); err != nil {
		return err
	}
	v.vs = vs
	return nil
}

func (f *fakeIPVS) DeleteVirtualServer(vs VirtualServer) error {
	if _, ok := f.vss[vs.key()]; !ok {
		return syscall.ESRCH
	}
	if err := f.k.change("ipvs delete " + vs.key().String()); err != nil {
		return err
	}
	delete(f.vss, vs.key())
	return nil
}

func (f *fakeIPVS) RealServers(vs VirtualServer) ([]RealServer, error) {
	v, ok := f.vss[vs.key()]
	if !ok {
		return nil, syscall.ESRCH
	}
	f.reads++
	out := make([]RealServer, 0, len(v.dests))
	for _, ap := range slices.SortedFunc(maps.Keys(v.dests), netip.AddrPort.Compare) {
		out = append(out, *v.dests[ap])
	}
	return out, nil
}

func (f *fakeIPVS) AddRealServer(vs VirtualServer, rs RealServer) error {
	v, ok := f.vss[vs.key()]
	if !ok {
		return syscall.ESRCH
	}
	if _, ok := v.dests[rs.addrPort()]; ok {
		return syscall.EEXIST
	}
	if rs.Addr.Is4() != vs.Addr.Is4() {
		return syscall.EAFNOSUPPORT
	}
	if err := f.k.change(fmt.Sprintf("ipvs add-rs %s -> %s w%d", vs.key(), rs.addrPort(), rs.Weight)); err != nil {
		return err
	}
	v.dests[rs.addrPort()] = &RealServer{Addr: rs.Addr, Port: rs.Port, Weight: rs.Weight}
	return nil
}

func (f *fakeIPVS) UpdateRealServer(vs VirtualServer, rs RealServer) error {
	v, ok := f.vss[vs.key()]
	if !ok {
		return syscall.ESRCH
	}
	d, ok := v.dests[rs.addrPort()]
	if !ok {
		return syscall.ENOENT
	}
	if err := f.k.change(fmt.Sprintf("ipvs update-rs %s -> %s w%d", vs.key(), rs.addrPort(), rs.Weight)); err != nil {
		return err
	}
	d.Weight = rs.Weight
	return nil
}

func (f *fakeIPVS) DeleteRealServer(vs VirtualServer, rs RealServer) error {
	v, ok := f.vss[vs.key()]
	if !ok {
		return syscall.ESRCH
	}
	if _, ok := v.dests[rs.addrPort()]; !ok {
		return syscall.ENOENT
	}
	if err := f.k.change(fmt.Sprintf("ipvs delete-rs %s -> %s", vs.key(), rs.addrPort())); err != nil {
		return err
	}
	delete(v.dests, rs.addrPort())
	return nil
}

func (f *fakeIPVS) SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	if err := f.k.change(fmt.Sprintf("ipvs timeouts %v %v %v", tcp, tcpFin, udp)); err != nil {
		return err
	}
	for i, d := range []time.Duration{tcp, tcpFin, udp} {
		if d > 0 {
			f.timeouts[i] = d
		}
	}
	return nil
}

// setConns sets a real server's connection counts, as traffic would.
func (f *fakeIPVS) setConns(vs vsKey, rs netip.AddrPort, active, inactive int) {
	d := f.vss[vs].dests[rs]
	d.ActiveConns, d.InactiveConns = active, inactive
}

func vsString(vs VirtualServer) string {
	s := vs.key().String() + " " + vs.Scheduler
	if vs.Persistent {
		s += " persistent " + strconv.Itoa(int(vs.Timeout))
	}
	return s
}

// dump lists the virtual servers of family and their real servers, as
// ipvsadm -Ln would, sorted.
func (f *fakeIPVS) dump(family dataplane.Family) string {
	var b strings.Builder
	for _, k := range slices.SortedFunc(maps.Keys(f.vss), vsKey.compare) {
		if !family.Has(k.addr) {
			continue
		}
		v := f.vss[k]
		b.WriteString(vsString(v.vs) + "\n")
		for _, ap := range slices.SortedFunc(maps.Keys(v.dests), netip.AddrPort.Compare) {
			fmt.Fprintf(&b, "  -> %s weight %d\n", ap, v.dests[ap].Weight)
		}
	}
	return b.String()
}

// ---- Links ---------------------------------------------------------------

type fakeLinks struct {
	k     *fakeKernel
	links map[string]*fakeLink
	// node are the addresses on the node's other links.
	node []netip.Addr
	// noDummy makes EnsureLink fail as a kernel without the dummy type.
	noDummy bool
}

type fakeLink struct {
	up    bool
	addrs map[netip.Addr]bool
}

func (f *fakeLinks) EnsureLink(name string) error {
	l, ok := f.links[name]
	if !ok {
		if f.noDummy {
			return fmt.Errorf("creating %s: %w: %w", name, ErrNoDummyLink, syscall.EOPNOTSUPP)
		}
		if err := f.k.change("link add " + name); err != nil {
			return err
		}
		l = &fakeLink{addrs: map[netip.Addr]bool{}}
		f.links[name] = l
	}
	if !l.up {
		if err := f.k.change("link up " + name); err != nil {
			return err
		}
		l.up = true
	}
	return nil
}

func (f *fakeLinks) link(name string) (*fakeLink, error) {
	l, ok := f.links[name]
	if !ok {
		return nil, fmt.Errorf("Link not found")
	}
	return l, nil
}

func (f *fakeLinks) LinkAddrs(name string, family dataplane.Family) ([]netip.Addr, error) {
	l, ok := f.links[name]
	if !ok {
		return nil, nil
	}
	var out []netip.Addr
	for a := range l.addrs {
		if family.Has(a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

func (f *fakeLinks) AddAddr(name string, a netip.Addr) error {
	l, err := f.link(name)
	if err != nil {
		return err
	}
	if err := f.k.change("link bind " + a.String()); err != nil {
		return err
	}
	l.addrs[a] = true
	return nil
}

func (f *fakeLinks) DelAddr(name string, a netip.Addr) error {
	l, err := f.link(name)
	if err != nil {
		return err
	}
	if err := f.k.change("link unbind " + a.String()); err != nil {
		return err
	}
	delete(l.addrs, a)
	return nil
}

func (f *fakeLinks) NodeAddrs(_ string, family dataplane.Family) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range f.node {
		if family.Has(a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// local reports whether a is local: a node address or one bound to any
// link we made.
func (f *fakeLinks) local(a netip.Addr) bool {
	if slices.Contains(f.node, a) {
		return true
	}
	for _, l := range f.links {
		if l.addrs[a] {
			return true
		}
	}
	return false
}

// ---- Sysctls -------------------------------------------------------------

// fakeSysctl is a read-only /proc/sys, as the agent's container has: the
// seam has no way to write, and values change only by the test's hand.
type fakeSysctl struct {
	values map[string]int
	reads  int
}

func (f *fakeSysctl) ReadInt(name string) (int, error) {
	f.reads++
	v, ok := f.values[name]
	if !ok {
		return 0, fmt.Errorf("reading /proc/sys/%s: %w", name, fs.ErrNotExist)
	}
	return v, nil
}

// ---- ipset ---------------------------------------------------------------

type fakeIPSet struct {
	k        *fakeKernel
	sets     map[string]*fakeSet
	restores []string
}

type fakeSet struct {
	typ, family string
	members     map[string]bool
}

// Restore applies ipset restore input line by line, stopping at the first
// refused line (the lines before it stay applied, as with the tool).
func (f *fakeIPSet) Restore(_ context.Context, data []byte) error {
	f.restores = append(f.restores, string(data))
	if err := f.k.change("ipset restore"); err != nil {
		return err
	}
	for i, line := range splitLines(data) {
		if err := f.apply(line); err != nil {
			return &xtables.RestoreError{Tool: "fake-ipset", Line: i + 1, Stderr: fmt.Sprintf("Error in line %d: %v", i+1, err), Err: errors.New("exit status 1")}
		}
	}
	return nil
}

func (f *fakeIPSet) apply(line string) error {
	fields := strings.Fields(line)
	exist := len(fields) > 0 && fields[len(fields)-1] == "-exist"
	if exist {
		fields = fields[:len(fields)-1]
	}
	if len(fields) < 2 {
		return fmt.Errorf("bad line %q", line)
	}
	name := fields[1]
	s := f.sets[name]
	switch fields[0] {
	case "create":
		if len(fields) < 3 {
			return fmt.Errorf("create needs a type")
		}
		family := ""
		if i := slices.Index(fields, "family"); i > 0 && i+1 < len(fields) {
			family = fields[i+1]
		}
		if s != nil {
			if exist && s.typ == fields[2] && s.family == family {
				return nil
			}
			return fmt.Errorf("set %s already exists", name)
		}
		f.sets[name] = &fakeSet{typ: fields[2], family: family, members: map[string]bool{}}
	case "add", "del":
		if s == nil {
			return fmt.Errorf("the set with the given name does not exist")
		}
		if len(fields) != 3 {
			return fmt.Errorf("bad %s %q", fields[0], line)
		}
		if err := s.validate(fields[2]); err != nil {
			return err
		}
		switch {
		case fields[0] == "add" && s.members[fields[2]] && !exist:
			return fmt.Errorf("element cannot be added to the set: it's already added")
		case fields[0] == "del" && !s.members[fields[2]] && !exist:
			return fmt.Errorf("element cannot be deleted from the set: it's not added")
		}
		s.members[fields[2]] = fields[0] == "add"
		if fields[0] == "del" {
			delete(s.members, fields[2])
		}
	case "flush", "destroy":
		if s == nil {
			return fmt.Errorf("the set with the given name does not exist")
		}
		if fields[0] == "destroy" {
			delete(f.sets, name)
		} else {
			clear(s.members)
		}
	default:
		return fmt.Errorf("unsupported command %q", fields[0])
	}
	return nil
}

// validate checks that entry has the shape the set's type takes (as the
// kernel would), with addresses of the set's family.
func (s *fakeSet) validate(entry string) error {
	addr := func(x string) error {
		a, err := netip.ParseAddr(x)
		if err != nil {
			return err
		}
		if a.Is4() != (s.family == "inet") {
			return fmt.Errorf("address %s not of family %s", x, s.family)
		}
		return nil
	}
	protoPort := func(x string) error {
		proto, port, ok := strings.Cut(x, ":")
		if !ok || !slices.Contains([]string{"tcp", "udp", "sctp"}, proto) {
			return fmt.Errorf("bad proto:port %q", x)
		}
		_, err := strconv.ParseUint(port, 10, 16)
		return err
	}
	parts := strings.Split(entry, ",")
	want := map[string]int{"hash:ip": 1, "bitmap:port": 1, "hash:ip,port": 2, "hash:ip,port,ip": 3, "hash:ip,port,net": 3}[s.typ]
	if len(parts) != want {
		return fmt.Errorf("entry %q does not fit %s", entry, s.typ)
	}
	switch s.typ {
	case "bitmap:port":
		_, err := strconv.ParseUint(entry, 10, 16)
		return err
	case "hash:ip":
		return addr(entry)
	}
	if err := addr(parts[0]); err != nil {
		return err
	}
	if err := protoPort(parts[1]); err != nil {
		return err
	}
	if len(parts) == 3 {
		if s.typ == "hash:ip,port,net" && strings.Contains(parts[2], "/") {
			p, err := netip.ParsePrefix(parts[2])
			if err != nil || p != p.Masked() {
				return fmt.Errorf("bad net %q", parts[2])
			}
			return addr(p.Addr().String())
		}
		return addr(parts[2])
	}
	return nil
}

// Save prints the sets as `ipset save` does.
func (f *fakeIPSet) Save(context.Context) ([]byte, error) {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(f.sets)) {
		s := f.sets[name]
		fmt.Fprintf(&b, "create %s %s", name, s.typ)
		if s.family != "" {
			fmt.Fprintf(&b, " family %s hashsize 1024 maxelem %d", s.family, maxElem)
		} else {
			b.WriteString(" range 0-65535")
		}
		b.WriteString("\n")
		for _, m := range slices.Sorted(maps.Keys(s.members)) {
			fmt.Fprintf(&b, "add %s %s\n", name, m)
		}
	}
	return []byte(b.String()), nil
}

// dump lists family's sets (by prefix) with their members, sorted.
func (f *fakeIPSet) dump(family dataplane.Family) string {
	prefix := "PP-"
	if family == dataplane.IPv6 {
		prefix = "PP6-"
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(f.sets)) {
		s := f.sets[name]
		if !strings.HasPrefix(name, prefix) || len(s.members) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s (%s)\n", name, s.typ)
		for _, m := range slices.Sorted(maps.Keys(s.members)) {
			b.WriteString("  " + m + "\n")
		}
	}
	return b.String()
}

// ---- iptables ------------------------------------------------------------

var builtinChains = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
}

type fakeIPTables struct {
	k        *fakeKernel
	name     string                         // "iptables" or "ip6tables", for the log
	tables   map[string]map[string][]string // table -> chain -> rules (without "-A CHAIN ")
	restores []string
	ensured  int
}

func newFakeIPTables(k *fakeKernel, name string) *fakeIPTables {
	f := &fakeIPTables{k: k, name: name, tables: map[string]map[string][]string{}}
	for t, chains := range builtinChains {
		f.tables[t] = map[string][]string{}
		for _, c := range chains {
			f.tables[t][c] = nil
		}
	}
	return f
}

// Restore applies --noflush input; a table commits whole or not at all.
func (f *fakeIPTables) Restore(_ context.Context, data []byte, flags ...string) error {
	f.restores = append(f.restores, string(data))
	if !slices.Contains(flags, "--noflush") {
		return fmt.Errorf("fake iptables: restore without --noflush would flush the whole table")
	}
	if err := f.k.change(f.name + " restore"); err != nil {
		return err
	}
	var cur map[string][]string
	var name string
	refuse := func(n int, format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		return &xtables.RestoreError{Tool: "fake-iptables-restore", Line: n, Stderr: err.Error(), Err: errors.New("exit status 2")}
	}
	for i, line := range splitLines(data) {
		n := i + 1
		switch {
		case line == "":
		case strings.HasPrefix(line, "*"):
			name = line[1:]
			if f.tables[name] == nil {
				return refuse(n, "unknown table %s", name)
			}
			cur = maps.Clone(f.tables[name])
		case line == "COMMIT":
			f.tables[name] = cur
			cur = nil
		case strings.HasPrefix(line, ":"):
			c := strings.Fields(line[1:])[0]
			if slices.Contains(builtinChains[name], c) {
				return refuse(n, "must not declare built-in chain %s", c)
			}
			cur[c] = nil // create or flush
		case strings.HasPrefix(line, "-D "):
			c, rest, _ := strings.Cut(line[3:], " ")
			i := slices.Index(cur[c], rest)
			if i < 0 {
				return refuse(n, "delete of a missing rule %q in %s", rest, c)
			}
			cur[c] = slices.Delete(slices.Clone(cur[c]), i, i+1)
		case strings.HasPrefix(line, "-X "):
			c := strings.TrimSpace(line[3:])
			if len(cur[c]) > 0 {
				return refuse(n, "delete of non-empty chain %s", c)
			}
			for other, rules := range cur {
				for _, r := range rules {
					if dptest.RuleTarget(r) == c {
						return refuse(n, "delete of chain %s, which %s still jumps to", c, other)
					}
				}
			}
			delete(cur, c)
		case strings.HasPrefix(line, "-A "):
			c, rest, _ := strings.Cut(line[3:], " ")
			if _, ok := cur[c]; !ok {
				return refuse(n, "append to missing chain %s", c)
			}
			if err := f.check(cur, rest); err != nil {
				return refuse(n, "%v", err)
			}
			cur[c] = append(slices.Clone(cur[c]), rest)
		default:
			return refuse(n, "unsupported line %q", line)
		}
	}
	if cur != nil {
		return refuse(0, "missing COMMIT")
	}
	return nil
}

// check refuses what the kernel would: a jump to a missing chain, a match
// on a missing set, a DROP in nat.
func (f *fakeIPTables) check(chains map[string][]string, rule string) error {
	args := dptest.Tokenize(rule)
	for i, a := range args {
		if a == "--match-set" && i+1 < len(args) {
			if f.k.ipset.sets[args[i+1]] == nil {
				return fmt.Errorf("set %s doesn't exist", args[i+1])
			}
		}
	}
	if t := dptest.RuleTarget(rule); !builtinTarget(t) {
		if _, ok := chains[t]; !ok {
			return fmt.Errorf("jump to missing chain %s", t)
		}
	}
	return nil
}

func (f *fakeIPTables) Save(_ context.Context, table string) ([]byte, error) {
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, c := range slices.Sorted(maps.Keys(f.tables[table])) {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, c := range slices.Sorted(maps.Keys(f.tables[table])) {
		for _, r := range f.tables[table][c] {
			b.WriteString("-A " + c + " " + r + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String()), nil
}

func (f *fakeIPTables) EnsureRule(_ context.Context, table, chain string, rule ...string) error {
	f.ensured++
	chains := f.tables[table]
	if _, ok := chains[chain]; !ok {
		return fmt.Errorf("fake: no chain %s/%s", table, chain)
	}
	text := strings.Join(dptest.QuoteArgs(rule), " ")
	if slices.Contains(chains[chain], text) {
		return nil
	}
	if err := f.check(chains, text); err != nil {
		return err
	}
	if err := f.k.change(f.name + " insert " + table + " " + chain + " " + text); err != nil {
		return err
	}
	chains[chain] = append([]string{text}, chains[chain]...)
	return nil
}

// dump returns table's chains (ours and the built-in ones holding our
// jumps) with their rules, sorted by chain.
func (f *fakeIPTables) dump(table string) string {
	var b strings.Builder
	for _, c := range slices.Sorted(maps.Keys(f.tables[table])) {
		rules := f.tables[table][c]
		if !strings.HasPrefix(c, "PP-") && len(rules) == 0 {
			continue
		}
		b.WriteString(":" + c + "\n")
		for _, r := range rules {
			b.WriteString("  " + r + "\n")
		}
	}
	return b.String()
}

func builtinTarget(t string) bool {
	switch t {
	case "", "ACCEPT", "DROP", "REJECT", "RETURN", "MARK", "MASQUERADE":
		return true
	}
	return false
}

// dump is the whole kernel state of family, for goldens and comparisons:
// virtual servers, the dummy link's addresses, and our sets.
func (k *fakeKernel) dump(family dataplane.Family) string {
	var b strings.Builder
	b.WriteString("# IPVS\n")
	b.WriteString(k.ipvs.dump(family))
	for _, name := range slices.Sorted(maps.Keys(k.links.links)) {
		l := k.links.links[name]
		state := "down"
		if l.up {
			state = "up"
		}
		fmt.Fprintf(&b, "# addresses on %s (%s)\n", name, state)
		for _, a := range slices.SortedFunc(maps.Keys(l.addrs), netip.Addr.Compare) {
			if family.Has(a) {
				b.WriteString(a.String() + "\n")
			}
		}
	}
	b.WriteString("# ipsets\n")
	b.WriteString(k.ipset.dump(family))
	return b.String()
}

// splitLines returns the lines of data, without newlines.
func splitLines(data []byte) []string {
	var out []string
	for len(data) > 0 {
		i := slices.Index(data, '\n')
		if i < 0 {
			out = append(out, string(data))
			break
		}
		out = append(out, string(data[:i]))
		data = data[i+1:]
	}
	return out
}
