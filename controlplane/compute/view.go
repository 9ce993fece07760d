package compute

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Service is one proxied Service with every view that a node can have of
// it. It is immutable once built, except for the memo of encoded parts,
// which is safe for concurrent use.
type Service struct {
	// Key is "namespace/name".
	Key string
	// TriggerTime is the newest last-change-trigger-time of its slices.
	TriggerTime time.Time

	base  *pb.Service // every field but the endpoints; never mutated
	ports []servicePort

	// others is the entry of every node for which the Service has nothing
	// special: no hint names the node or its zone, and it hosts no
	// endpoint that a Local policy uses. It is built with the Service and
	// read without a lock: thousands of stream goroutines ask for it at
	// once.
	others Entry
	// topo holds what makes some nodes see something else; nil for a
	// Uniform Service, as most are, which so holds no map or lock of its
	// own (six maps a Service were 9.6 MiB of live heap at 10,000
	// Services, which the collector's headroom doubles in RSS).
	topo *topology
}

// topology is what a Service that is not Uniform needs to give nodes
// their views: the names and zones that get their own view (see class),
// the entries of the hinted zones, and the memos of the views of the
// nodes that are Special.
type topology struct {
	// hintedNodes, hintedZones and localNodes are sorted sets of names,
	// without "".
	hintedNodes, hintedZones, localNodes []string
	// zones[i] is the entry of a node of zone hintedZones[i] for which
	// Special is false. Built with the Service and read without a lock.
	zones []Entry

	mu     sync.Mutex      // guards the memos below, built when first asked
	shared map[class]*Part // classes that name a node
	local  map[string]*Part
}

// Part is an encoded piece of a Service message and its hash. Parts are
// shared by every node that sees them and must not be modified.
type Part struct {
	// Bytes is a protobuf encoding of a Service message (or of some of its
	// fields); parts concatenate into a valid Service.
	Bytes []byte
	// Hash is xxHash64 of Bytes.
	Hash uint64
}

var emptyPart = &Part{Hash: xxhash.Sum64(nil)}

// Entry is one node's view of a Service.
type Entry struct {
	// Shared is the part common to the node's topology class.
	Shared *Part
	// Local is the node-specific part; empty for most nodes.
	Local *Part
	// Hash is the entry's content hash (ServiceEntry.hash).
	Hash uint64
}

// Size is the encoded size of the Service message.
func (e Entry) Size() int { return len(e.Shared.Bytes) + len(e.Local.Bytes) }

// class identifies a shared view: the node's name when hints name it, its
// zone when hints name that zone, else empty. Upstream's endpoint choice
// treats all other names and zones alike, so the empty class stands for
// every other node.
type class struct{ node, zone string }

// index finds which nodes and zones can see something different, and
// precomputes the entries of the nodes that are not Special. Names go
// into sorted slices, not sets: most Services have none, and a hinted
// one a few zones.
func (s *Service) index() {
	var hintedNodes, hintedZones, localNodes []string
	for i := range s.ports {
		p := &s.ports[i]
		for _, f := range p.families {
			for j := range f.endpoints {
				e := &f.endpoints[j]
				if p.usesCluster && f.allReadyHaveNodeHints {
					hintedNodes = append(hintedNodes, e.nodeHints...)
				}
				if p.usesCluster && f.allReadyHaveZoneHints {
					hintedZones = append(hintedZones, e.zoneHints...)
				}
				if p.usesLocal && e.nodeName != "" && (e.ready || e.usableTerminating()) {
					localNodes = append(localNodes, e.nodeName)
				}
			}
		}
	}
	s.others = newEntry(s.Key, newPart(s.sharedView(class{}, nil)), emptyPart)
	hintedNodes, hintedZones, localNodes = nameSet(hintedNodes), nameSet(hintedZones), nameSet(localNodes)
	if len(hintedNodes)+len(hintedZones)+len(localNodes) == 0 {
		return
	}
	t := &topology{hintedNodes: hintedNodes, hintedZones: hintedZones, localNodes: localNodes}
	t.zones = make([]Entry, len(hintedZones))
	for i, z := range hintedZones {
		t.zones[i] = newEntry(s.Key, newPart(s.sharedView(class{zone: z}, nil)), emptyPart)
	}
	s.topo = t
}

// nameSet sorts names and removes duplicates and "" (an empty hint names
// no node or zone); nil when none is left.
func nameSet(names []string) []string {
	names = slices.DeleteFunc(names, func(n string) bool { return n == "" })
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return slices.Clip(slices.Compact(names))
}

// has reports whether the sorted set names holds name.
func has(names []string, name string) bool {
	_, ok := slices.BinarySearch(names, name)
	return ok
}

// Uniform reports whether every node sees the same entry.
func (s *Service) Uniform() bool { return s.topo == nil }

// Special reports whether the node called name may see s differently from
// the other nodes of its zone: hints name it, or it hosts endpoints that a
// Local traffic policy uses.
func (s *Service) Special(name string) bool {
	t := s.topo
	return t != nil && (has(t.hintedNodes, name) || has(t.localNodes, name))
}

// SpecialNodes returns the names of the nodes for which Special is true,
// in no particular order.
func (s *Service) SpecialNodes() []string {
	t := s.topo
	if t == nil {
		return []string{}
	}
	out := make([]string, 0, len(t.hintedNodes)+len(t.localNodes))
	out = append(out, t.hintedNodes...)
	for _, n := range t.localNodes {
		if !has(t.hintedNodes, n) {
			out = append(out, n)
		}
	}
	return out
}

// HintedZones returns the zones whose nodes may see s differently from
// nodes of other zones (hints name them), in no particular order.
func (s *Service) HintedZones() []string {
	if s.topo == nil {
		return []string{}
	}
	return slices.Clone(s.topo.hintedZones)
}

// ZoneEntry is the view of s from a node of zone for which Special is
// false. Safe for concurrent use, and lock-free.
func (s *Service) ZoneEntry(zone string) Entry {
	if t := s.topo; t != nil {
		if i, ok := slices.BinarySearch(t.hintedZones, zone); ok {
			return t.zones[i]
		}
	}
	return s.others
}

// EntryFor returns n's view of s. Safe for concurrent use; lock-free
// unless n is Special.
func (s *Service) EntryFor(n *Node) Entry {
	if !s.Special(n.Name) {
		return s.ZoneEntry(n.Zone)
	}
	c, local := s.classOf(n)
	t := s.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return s.entry(c, local)
}

// classOf returns the topology class of n and the node whose local part
// n sees ("" for the empty part). For a node that is not Special it is
// the class of ZoneEntry's view of n's zone.
func (s *Service) classOf(n *Node) (c class, local string) {
	t := s.topo
	if t == nil {
		return class{}, ""
	}
	if has(t.hintedNodes, n.Name) {
		c.node = n.Name
	}
	if has(t.hintedZones, n.Zone) {
		c.zone = n.Zone
	}
	if has(t.localNodes, n.Name) {
		local = n.Name
	}
	return c, local
}

// entry assembles the entry of a class and local node of a Service that
// is not Uniform; s.topo.mu must be held. The views of classes that name
// no node were built by index.
func (s *Service) entry(c class, localNode string) Entry {
	t := s.topo
	sh := s.ZoneEntry(c.zone).Shared
	if c.node != "" {
		var ok bool
		if sh, ok = t.shared[c]; !ok {
			sh = newPart(s.sharedView(c, nil))
			if t.shared == nil {
				t.shared = map[class]*Part{}
			}
			t.shared[c] = sh
		}
	}
	lo := emptyPart
	if localNode != "" {
		var ok bool
		if lo, ok = t.local[localNode]; !ok {
			lo = newPart(&pb.Service{LocalEndpoints: s.localEndpoints(localNode, nil)})
			if t.local == nil {
				t.local = map[string]*Part{}
			}
			t.local[localNode] = lo
		}
	}
	return newEntry(s.Key, sh, lo)
}

func newEntry(key string, shared, local *Part) Entry {
	return Entry{Shared: shared, Local: local, Hash: entryHash(key, shared.Hash, local.Hash)}
}

func newPart(m proto.Message) *Part {
	b := mustMarshal(m)
	return &Part{Bytes: b, Hash: xxhash.Sum64(b)}
}

// sharedView is the Service with the Cluster-policy endpoints of class c,
// chosen per IP family as upstream's CategorizeEndpoints does: ready
// endpoints available for the node's topology, else serving-and-terminating
// ones (topology is not applied to that fallback). tr, when not nil,
// records each choice for Explain; the table passes nil.
func (s *Service) sharedView(c class, tr *trace) *pb.Service {
	out := proto.CloneOf(s.base)
	for i := range s.ports {
		p := &s.ports[i]
		var eps []*pb.Endpoint
		if p.usesCluster {
			for j := range p.families {
				f := &p.families[j]
				ct := tr.cluster(i, f)
				mode := f.topologyMode(c, ct)
				fam := f.filter(func(e *endpoint) bool { return e.ready && mode.allows(e, c) })
				if len(fam) == 0 {
					fam = f.filter((*endpoint).usableTerminating)
					ct.fallback(len(fam) > 0)
				}
				ct.chose(fam)
				eps = append(eps, fam...)
			}
			if len(eps) > 0 {
				out.ClusterEndpoints = append(out.ClusterEndpoints, &pb.PortEndpoints{PortName: p.name, Endpoints: eps})
			}
		}
		// ports and base.Ports are parallel.
		if s.base.GetPorts()[i].GetProtocol() == pb.Protocol_PROTOCOL_UDP {
			if serving := p.servingBeyond(eps); serving != nil {
				out.UdpServingEndpoints = append(out.UdpServingEndpoints, &pb.PortEndpoints{PortName: p.name, Endpoints: serving})
			}
		}
	}
	return out
}

// servingBeyond returns every serving endpoint of p (upstream's
// IsServing: any node, any zone, terminating or not), which stale UDP
// conntrack cleanup keeps flows to as upstream does, or nil when chosen
// (the Cluster-policy endpoints of the view) already holds them all, as it
// does for most Services. The Local-policy endpoints are serving ones of
// this node, so they never need it.
func (p *servicePort) servingBeyond(chosen []*pb.Endpoint) []*pb.Endpoint {
	// chosen was converted from p.endpoints, so its addresses parse.
	in := make(map[netip.AddrPort]bool, len(chosen))
	for _, e := range chosen {
		in[netip.AddrPortFrom(netip.MustParseAddr(e.GetIp()), uint16(e.GetPort()))] = true
	}
	var out []*pb.Endpoint
	beyond := false
	for i := range p.endpoints {
		e := &p.endpoints[i]
		if !e.serving {
			continue
		}
		out = append(out, e.proto())
		if !in[netip.AddrPortFrom(e.addr, uint16(e.port))] {
			beyond = true
		}
	}
	if !beyond {
		return nil
	}
	return out
}

// localEndpoints are node's endpoints for the Local policy, per IP family:
// ready ones, else serving-and-terminating ones; topology never applies
// here. tr, when not nil, records each choice for Explain.
func (s *Service) localEndpoints(node string, tr *trace) []*pb.PortEndpoints {
	var out []*pb.PortEndpoints
	for i := range s.ports {
		p := &s.ports[i]
		if !p.usesLocal {
			continue
		}
		var eps []*pb.Endpoint
		for j := range p.families {
			f := &p.families[j]
			lt := tr.local(i, f, node)
			fam := f.filter(func(e *endpoint) bool { return e.nodeName == node && e.ready })
			if len(fam) == 0 {
				fam = f.filter(func(e *endpoint) bool { return e.nodeName == node && e.usableTerminating() })
				lt.fallback(len(fam) > 0)
			}
			lt.chose(fam)
			eps = append(eps, fam...)
		}
		if len(eps) > 0 {
			out = append(out, &pb.PortEndpoints{PortName: p.name, Endpoints: eps})
		}
	}
	return out
}

func (f *portFamily) filter(keep func(*endpoint) bool) []*pb.Endpoint {
	var out []*pb.Endpoint
	for i := range f.endpoints {
		if keep(&f.endpoints[i]) {
			out = append(out, f.endpoints[i].proto())
		}
	}
	return out
}

type topologyMode int

const (
	topologyNone topologyMode = iota
	topologySameZone
	topologySameNode
)

// topologyMode follows upstream's topologyModeFromHints: node hints win when
// every ready endpoint has them and one names this node; else zone hints
// under the same rule; else no topology. tr, when not nil, records the
// mode.
func (f *portFamily) topologyMode(c class, tr *choiceTrace) topologyMode {
	hasFor := func(names func(*endpoint) []string, want string) bool {
		for i := range f.endpoints {
			if e := &f.endpoints[i]; e.ready && slices.Contains(names(e), want) {
				return true
			}
		}
		return false
	}
	switch {
	case f.allReadyHaveNodeHints && c.node != "" && hasFor(func(e *endpoint) []string { return e.nodeHints }, c.node):
		tr.topology(topologySameNode)
		return topologySameNode
	case f.allReadyHaveZoneHints && c.zone != "" && hasFor(func(e *endpoint) []string { return e.zoneHints }, c.zone):
		tr.topology(topologySameZone)
		return topologySameZone
	}
	tr.topology(topologyNone)
	return topologyNone
}

func (m topologyMode) allows(e *endpoint, c class) bool {
	switch m {
	case topologySameNode:
		return slices.Contains(e.nodeHints, c.node)
	case topologySameZone:
		return slices.Contains(e.zoneHints, c.zone)
	}
	return true
}

// Equal reports whether two builds of a Service give every node the same
// view; then publishing the newer one would change no table.
func (s *Service) Equal(o *Service) bool {
	return s == o || (s != nil && o != nil && s.Key == o.Key && s.inputHash() == o.inputHash())
}

// inputHash fingerprints everything any view is computed from. The
// fields are listed by hand: node names and hints shape the views but no
// message carries them, so there is no message to marshal instead. A field
// missed here would make Equal hide a change from every agent, so
// inputhash_test.go fails on any input field that is neither hashed nor
// excused there.
func (s *Service) inputHash() uint64 {
	d := xxhash.New()
	_, _ = d.Write(mustMarshal(s.base))
	// Every variable-length field is length-prefixed, so that no two
	// different inputs write the same bytes.
	var b []byte
	for i := range s.ports {
		p := &s.ports[i]
		b = appendLenString(b[:0], p.name)
		b = append(b, boolByte(p.usesCluster), boolByte(p.usesLocal))
		b = binary.AppendUvarint(b, uint64(len(p.endpoints)))
		_, _ = d.Write(b)
		for j := range p.endpoints {
			e := &p.endpoints[j]
			b = appendLenString(b[:0], e.addr.String())
			b = binary.AppendUvarint(b, uint64(e.port))
			b = append(b, boolByte(e.ready), boolByte(e.serving), boolByte(e.terminating))
			b = appendLenString(b, e.nodeName)
			for _, hints := range [][]string{e.zoneHints, e.nodeHints} {
				b = binary.AppendUvarint(b, uint64(len(hints)))
				for _, h := range hints {
					b = appendLenString(b, h)
				}
			}
			_, _ = d.Write(b)
		}
	}
	return d.Sum64()
}

func appendLenString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
