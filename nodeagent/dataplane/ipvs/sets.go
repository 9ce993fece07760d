package ipvs

import (
	"bufio"
	"bytes"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// setID names one of the ipsets the rules match on. The list is fixed, as
// kube-proxy's ipsetInfo: every set exists from the first sync on, and the
// rules never change with the Services, only the sets' members do.
type setID int

const (
	// setClusterIP holds "clusterIP,proto:port" of every ClusterIP
	// virtual server: masquerade off-cluster clients, accept in
	// PP-IPVS-FILTER.
	setClusterIP setID = iota
	// setExternal holds the external IP, load balancer IP and NodePort
	// ("nodeIP,proto:nodePort") virtual servers of externalTrafficPolicy
	// Cluster Services: always masqueraded.
	setExternal
	// setExternalLocal holds the same for externalTrafficPolicy Local:
	// the client address is kept; only the node's own traffic is
	// masqueraded.
	setExternalLocal
	// setFirewall holds the load balancer IP virtual servers of Services
	// with loadBalancerSourceRanges.
	setFirewall
	// setSourceRanges holds "lbIP,proto:port,cidr" for every allowed
	// source range (and the LB IP itself when a node IP is allowed).
	setSourceRanges
	// setDropInternal holds the ClusterIP virtual servers of
	// internalTrafficPolicy Local Services with endpoints elsewhere but
	// none here: dropped.
	setDropInternal
	// setDropExternal holds the external virtual servers of
	// externalTrafficPolicy Local Services with endpoints elsewhere but
	// none here: dropped for clients outside the node and its pods.
	setDropExternal
	// setHealthCheck holds the healthCheckNodePorts, accepted whatever the
	// INPUT policy.
	setHealthCheck
	// setLoopBack holds "ep,proto:port,ep" for every endpoint: a packet
	// from an endpoint to itself (hairpin) is masqueraded.
	setLoopBack
	// setServiceIPs holds every address bound to the dummy link: new
	// connections to them that no virtual server takes are rejected, so
	// that host services do not answer on service addresses
	// (kubernetes#72236).
	setServiceIPs
	numSets
)

// setInfo gives each set its name (after the family prefix), ipset type,
// and the direction flags that match it in iptables.
var setInfo = [numSets]struct{ name, typ, match string }{
	setClusterIP:     {"CLUSTER-IP", "hash:ip,port", "dst,dst"},
	setExternal:      {"EXTERNAL", "hash:ip,port", "dst,dst"},
	setExternalLocal: {"EXTERNAL-LOCAL", "hash:ip,port", "dst,dst"},
	setFirewall:      {"LB-FIREWALL", "hash:ip,port", "dst,dst"},
	setSourceRanges:  {"LB-SOURCE-RANGES", "hash:ip,port,net", "dst,dst,src"},
	setDropInternal:  {"DROP-INTERNAL", "hash:ip,port", "dst,dst"},
	setDropExternal:  {"DROP-EXTERNAL", "hash:ip,port", "dst,dst"},
	setHealthCheck:   {"HEALTH-CHECK-NODE-PORT", "bitmap:port", "dst"},
	setLoopBack:      {"LOOP-BACK", "hash:ip,port,ip", "dst,dst,src"},
	setServiceIPs:    {"SERVICE-IPS", "hash:ip", "dst"},
}

// maxElem bounds each hash set. ipset's default (65536) is reached by
// about 20,000 NodePort Services on a node with three addresses; memory is
// only used as members are added.
const maxElem = 1 << 20

// setName returns the kernel name of set id for family: "PP-CLUSTER-IP"
// or "PP6-CLUSTER-IP". Set names are global across families, and ipset
// keeps IPv4 and IPv6 members in different sets.
func setName(family dataplane.Family, id setID) string {
	if family == dataplane.IPv6 {
		return "PP6-" + setInfo[id].name
	}
	return "PP-" + setInfo[id].name
}

// createLine is the restore line that creates set id if it is missing.
// -exist makes it a no-op for a set of the same type and parameters
// (growth of a hash table does not count, see the kernel's same_set).
func createLine(family dataplane.Family, id setID) string {
	info := setInfo[id]
	if info.typ == "bitmap:port" {
		return "create " + setName(family, id) + " bitmap:port range 0-65535 -exist"
	}
	fam := "inet"
	if family == dataplane.IPv6 {
		fam = "inet6"
	}
	return "create " + setName(family, id) + " " + info.typ + " family " + fam + " hashsize 1024 maxelem " + strconv.Itoa(maxElem) + " -exist"
}

// ipPortEntry is a hash:ip,port member: "10.96.0.10,tcp:80".
func ipPortEntry(a netip.Addr, proto Protocol, port uint16) string {
	return a.String() + "," + proto.lower() + ":" + strconv.Itoa(int(port))
}

// netString formats a prefix as ipset prints it: a single host without
// its length.
func netString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// normalizeEntry rewrites a member read from `ipset save` the way this
// package writes it, so that read and desired members compare equal; what
// does not parse is returned unchanged (it is then not desired and gets
// deleted by its exact text).
func normalizeEntry(id setID, s string) string {
	parseAddr := func(s string) (string, bool) {
		a, err := netip.ParseAddr(s)
		return a.Unmap().String(), err == nil
	}
	parts := strings.Split(s, ",")
	switch setInfo[id].typ {
	case "hash:ip":
		if a, ok := parseAddr(s); ok {
			return a
		}
	case "bitmap:port":
		if n, err := strconv.Atoi(s); err == nil {
			return strconv.Itoa(n)
		}
	case "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net":
		if len(parts) < 2 {
			return s
		}
		a, ok := parseAddr(parts[0])
		if !ok {
			return s
		}
		parts[0] = a
		if len(parts) == 3 {
			if p, err := netip.ParsePrefix(parts[2]); err == nil {
				parts[2] = netString(p.Masked())
			} else if b, ok := parseAddr(parts[2]); ok {
				parts[2] = b
			}
		}
		return strings.Join(parts, ",")
	}
	return s
}

// members is a set's members, as a set.
type members map[string]struct{}

// parseIPSetSave returns the members of family's sets found in `ipset
// save` output, by set; sets not listed do not exist.
func parseIPSetSave(family dataplane.Family, out []byte) map[setID]members {
	byName := map[string]setID{}
	for id := range numSets {
		byName[setName(family, id)] = id
	}
	found := map[setID]members{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		id, ok := byName[f[1]]
		if !ok {
			continue
		}
		switch {
		case f[0] == "create":
			if found[id] == nil {
				found[id] = members{}
			}
		case f[0] == "add" && len(f) >= 3:
			if found[id] == nil {
				found[id] = members{}
			}
			found[id][normalizeEntry(id, f[2])] = struct{}{}
		}
	}
	return found
}

// renderIPSet writes the `ipset restore` input that takes sets from cur
// to want: creates (when create is set), then additions, then deletions,
// each set in setID order and members sorted, so that the input is
// deterministic. -exist makes each line idempotent.
func renderIPSet(family dataplane.Family, cur, want *[numSets]members, create bool) []byte {
	var b bytes.Buffer
	if create {
		for id := range numSets {
			b.WriteString(createLine(family, id))
			b.WriteByte('\n')
		}
	}
	for _, op := range []string{"add", "del"} {
		for id := range numSets {
			from, to := want[id], cur[id]
			if op == "del" {
				from, to = cur[id], want[id]
			}
			var diff []string
			for m := range from {
				if _, ok := to[m]; !ok {
					diff = append(diff, m)
				}
			}
			slices.Sort(diff)
			for _, m := range diff {
				b.WriteString(op + " " + setName(family, id) + " " + m + " -exist\n")
			}
		}
	}
	return b.Bytes()
}
