package ipvs

import (
	"maps"
	"slices"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// saveSample is real `ipset save` output (ipset 7.17) for members as this
// package writes them: host nets lose their /32, IPv6 is compressed.
const saveSample = `create PP-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0xc99d47a9
add PP-CLUSTER-IP 10.96.0.10,tcp:80
add PP-CLUSTER-IP 10.96.0.10,sctp:3868
create PP-LB-SOURCE-RANGES hash:ip,port,net family inet hashsize 1024 maxelem 1048576 bucketsize 12 initval 0xc22ad386
add PP-LB-SOURCE-RANGES 198.51.100.40,tcp:80,198.51.100.40
add PP-LB-SOURCE-RANGES 198.51.100.40,tcp:80,203.0.113.0/29
create PP6-LB-SOURCE-RANGES hash:ip,port,net family inet6 hashsize 1024 maxelem 1048576 bucketsize 12 initval 0x83769a66
add PP6-LB-SOURCE-RANGES fd00::40,tcp:80,2001:db8::/48
create PP-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
add PP-HEALTH-CHECK-NODE-PORT 32040
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
`

func TestParseIPSetSave(t *testing.T) {
	got := parseIPSetSave(dataplane.IPv4, []byte(saveSample))
	want := map[setID][]string{
		setClusterIP:    {"10.96.0.10,sctp:3868", "10.96.0.10,tcp:80"},
		setSourceRanges: {"198.51.100.40,tcp:80,198.51.100.40", "198.51.100.40,tcp:80,203.0.113.0/29"},
		setHealthCheck:  {"32040"},
	}
	if len(got) != len(want) {
		t.Errorf("sets found = %v, want %v (other families' and programs' sets ignored)", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for id, w := range want {
		if g := slices.Sorted(maps.Keys(got[id])); !slices.Equal(g, w) {
			t.Errorf("%s = %v, want %v", setName(dataplane.IPv4, id), g, w)
		}
	}
	v6 := parseIPSetSave(dataplane.IPv6, []byte(saveSample))
	if g := slices.Sorted(maps.Keys(v6[setSourceRanges])); !slices.Equal(g, []string{"fd00::40,tcp:80,2001:db8::/48"}) {
		t.Errorf("PP6-LB-SOURCE-RANGES = %v", g)
	}
}

func TestNormalizeEntry(t *testing.T) {
	for _, tt := range []struct {
		id   setID
		in   string
		want string
	}{
		{setClusterIP, "fd00:0:0::40,tcp:80", "fd00::40,tcp:80"},
		{setSourceRanges, "10.0.0.1,tcp:80,10.0.0.9/32", "10.0.0.1,tcp:80,10.0.0.9"},
		{setSourceRanges, "10.0.0.1,tcp:80,10.0.0.0/8", "10.0.0.1,tcp:80,10.0.0.0/8"},
		{setLoopBack, "10.0.0.1,udp:53,10.0.0.1", "10.0.0.1,udp:53,10.0.0.1"},
		{setServiceIPs, "fd00:96:0::a", "fd00:96::a"},
		{setHealthCheck, "032040", "32040"},
		{setClusterIP, "garbage", "garbage"},
	} {
		if got := normalizeEntry(tt.id, tt.in); got != tt.want {
			t.Errorf("normalizeEntry(%s, %q) = %q, want %q", setInfo[tt.id].typ, tt.in, got, tt.want)
		}
	}
}

// TestSetNames checks every name fits ipset's 31 characters.
func TestSetNames(t *testing.T) {
	for id := range numSets {
		for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			if n := setName(f, id); len(n) > 31 {
				t.Errorf("%s is longer than ipset's 31 characters", n)
			}
		}
	}
}

// TestFullSyncReadsSetsBack checks that what the fake `ipset save` prints
// parses back to what was written: a second full sync adds and deletes
// nothing.
func TestFullSyncReadsSetsBack(t *testing.T) {
	n := newNode(t, 0, nil)
	var all []*pb.Service
	for _, c := range flowCases {
		all = append(all, c.services(0)...)
	}
	n.mustSync(true, all...)
	n.mustSync(true, all...)
	for _, r := range n.kern.ipset.restores[len(n.kern.ipset.restores)-2:] {
		for _, line := range splitLines([]byte(r)) {
			if !strings.HasPrefix(line, "create ") {
				t.Errorf("second full sync changed a member: %s", line)
			}
		}
	}
}
