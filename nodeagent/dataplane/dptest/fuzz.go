package dptest

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// The backends' render fuzz targets (FuzzRender in each) share this: a
// table built from fuzz input whose names are the fuzzer's, and the same
// table with every name replaced by a plain placeholder. A renderer must
// render both to the same rules: names may only reach comments and
// hashed (or escaped) object names, never the structure of the rules.

// FuzzNameSeeds are seed name lists for the render fuzz targets, NUL
// separated: valid names, and names that would add a rule or a line if a
// renderer pasted them as they are.
var FuzzNameSeeds = []string{
	"default\x00web\x00http\x00dns",
	"kube-system\x00kube-dns\x00dns-tcp\x00metrics",
	"ns\x00svc\x00\"\n-I INPUT 1 -j ACCEPT\n\x00p",
	"ns\x00svc\x00x\" -j ACCEPT -m comment --comment \"y\x00\n}\nchain input { type filter hook input priority 0; accept; }\n",
	"a b\x00c\td\x00\\\"\x00%41\x00\x00;",
}

// fuzzReader hands out the fuzz bytes, then zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) bit() bool { return r.next()&1 == 1 }

// FuzzTables builds from nameList (names, NUL separated) and data a table
// of one to three IPv4 Services with ports, addresses, policies and
// endpoints chosen by data and every namespace, name and port name taken
// from nameList, and the same table with each distinct name replaced by a
// placeholder ("n0", "n1", ...; "" stays ""). Neither is validated: valid
// reports whether proxytable accepts the fuzzed one. ok is false when the
// input makes no usable table (two Services under one key).
func FuzzTables(nameList string, data []byte) (fuzzed, plain *proxytable.Table, valid, ok bool) {
	names := strings.Split(nameList, "\x00")
	if len(names) > 8 {
		names = names[:8]
	}
	for i, n := range names {
		if len(n) > 200 {
			n = n[:200]
		}
		// What an agent decodes is valid UTF-8: protobuf refuses
		// anything else in a string.
		names[i] = strings.ToValidUTF8(n, "\uFFFD")
	}
	placeholder := map[string]string{"": ""}
	for _, n := range names {
		if _, ok := placeholder[n]; !ok {
			placeholder[n] = fmt.Sprintf("n%d", len(placeholder)-1)
		}
	}
	r := &fuzzReader{b: data}
	pick := func() string { return names[int(r.next())%len(names)] }

	var svcs []*pb.Service
	for i := range 1 + int(r.next())%3 {
		svcs = append(svcs, fuzzService(r, pick, i))
	}
	build := func(rename func(string) string) (*proxytable.Table, bool) {
		entries := map[string]*pb.ServiceEntry{}
		for _, s := range svcs {
			s = renamed(s, rename)
			key := s.GetNamespace() + "/" + s.GetName()
			if _, dup := entries[key]; dup {
				return nil, false
			}
			entries[key] = Entry(s)
		}
		var sum uint64
		node := Node()
		sum += node.GetHash()
		for _, e := range entries {
			sum += e.GetHash()
		}
		return &proxytable.Table{Version: fmt.Sprintf("%016x", sum), Node: node, Entries: entries}, true
	}
	fuzzed, ok1 := build(func(s string) string { return s })
	plain, ok2 := build(func(s string) string { return placeholder[s] })
	if !ok1 || !ok2 {
		return nil, nil, false, false
	}
	_, err := proxytable.FromEntries(fuzzed.Version, fuzzed.Node, slices.Collect(func(yield func(*pb.ServiceEntry) bool) {
		for _, e := range fuzzed.Entries {
			if !yield(e) {
				return
			}
		}
	}))
	return fuzzed, plain, err == nil, true
}

// fuzzService is Service i: its addresses are its own (no two Services
// share an address or node port, so that no renderer has to pick between
// them and the order of keys cannot matter).
func fuzzService(r *fuzzReader, pick func() string, i int) *pb.Service {
	s := Svc(pick(), pick(), fmt.Sprintf("10.96.0.%d", 10+i))
	switch r.next() % 3 {
	case 1:
		s.Type = pb.ServiceType_SERVICE_TYPE_NODE_PORT
	case 2:
		s.Type = pb.ServiceType_SERVICE_TYPE_LOAD_BALANCER
		s.LoadBalancerIps = []string{fmt.Sprintf("198.51.100.%d", 10+i)}
		if r.bit() {
			s.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
		}
	}
	if r.bit() {
		s.ExternalIps = []string{fmt.Sprintf("192.0.2.%d", 10+i)}
	}
	external := s.Type != pb.ServiceType_SERVICE_TYPE_CLUSTER_IP || len(s.ExternalIps) > 0
	if external && r.bit() {
		s.ExternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
		s.HealthCheckNodePort = int32(32000 + i)
	}
	if r.bit() {
		s.InternalTrafficPolicy = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	}
	if r.bit() {
		s.SessionAffinity = &pb.SessionAffinity{TimeoutSeconds: 10800}
	}
	local := s.ExternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL || s.InternalTrafficPolicy == pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	protos := []pb.Protocol{TCP, UDP, SCTP}
	for j := range 1 + int(r.next())%2 {
		name := pick()
		var nodePort int32
		if s.Type != pb.ServiceType_SERVICE_TYPE_CLUSTER_IP {
			nodePort = int32(30000 + 10*i + j)
		}
		n := int(r.next()) % 4
		s.Ports = append(s.Ports, Port(name, protos[int(r.next())%3], int32(80+j), nodePort, n > 0))
		var addrs []string
		for k := range n {
			addrs = append(addrs, fmt.Sprintf("10.244.%d.%d:%d", i, 10*j+k+1, 8080+j))
		}
		if n > 0 {
			s.ClusterEndpoints = append(s.ClusterEndpoints, Eps(name, addrs...))
			if local && r.bit() {
				s.LocalEndpoints = append(s.LocalEndpoints, Eps(name, addrs[0]))
			}
		}
	}
	return s
}

// renamed returns a copy of s with its names passed through rename.
func renamed(s *pb.Service, rename func(string) string) *pb.Service {
	c := proto.CloneOf(s)
	c.Namespace, c.Name = rename(c.Namespace), rename(c.Name)
	for _, p := range c.Ports {
		p.Name = rename(p.Name)
	}
	for _, set := range [][]*pb.PortEndpoints{c.ClusterEndpoints, c.LocalEndpoints} {
		for _, pe := range set {
			pe.PortName = rename(pe.PortName)
		}
	}
	return c
}

// IPTablesChainHash matches the hashed part of the iptables dataplanes'
// per-service chain names.
var IPTablesChainHash = regexp.MustCompile(`^(PP-[A-Z]+-)[A-Z2-7]{16}$`)

// RestoreArgs splits one line of iptables-restore input as
// iptables-restore does (add_param_to_argv): on spaces and tabs outside
// double quotes, a backslash inside quotes escaping the next character.
func RestoreArgs(line string) []string {
	var out []string
	var cur []byte
	has, quoted, escaped := false, false, false
	for i := range len(line) {
		c := line[i]
		switch {
		case quoted && escaped:
			cur, escaped = append(cur, c), false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			// A closing quote ends the argument, empty or not, as in
			// iptables-restore.
			if quoted {
				out, cur, has = append(out, string(cur)), nil, false
			} else {
				has = true
			}
			quoted = !quoted
		case !quoted && (c == ' ' || c == '\t'):
			if len(cur) > 0 || has {
				out, cur, has = append(out, string(cur)), nil, false
			}
		default:
			cur = append(cur, c)
		}
	}
	if len(cur) > 0 || has {
		out = append(out, string(cur))
	}
	return out
}

// NormalizeRestore returns the lines of iptables-restore input as
// iptables-restore reads them, with every comment argument and chain hash
// masked and the lines sorted: what must be equal between a table and the
// same table under other names.
func NormalizeRestore(data string) []string {
	var out []string
	for _, line := range strings.Split(data, "\n") {
		args := RestoreArgs(line)
		for i, a := range args {
			switch {
			case i > 0 && args[i-1] == "--comment":
				args[i] = "C"
			case strings.HasPrefix(a, ":") && IPTablesChainHash.MatchString(a[1:]):
				args[i] = ":" + IPTablesChainHash.ReplaceAllString(a[1:], "${1}H")
			default:
				args[i] = IPTablesChainHash.ReplaceAllString(a, "${1}H")
			}
		}
		out = append(out, strings.Join(args, " "))
	}
	slices.Sort(out)
	return out
}
