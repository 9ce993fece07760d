package app

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
	"github.com/proxyplane/proxyplane/nodeagent/sysctl"
)

// recordingSetter records what initOnly asks of the sysctls.
type recordingSetter struct {
	applied int
	set     []sysctl.Setting
}

func (r *recordingSetter) Apply(context.Context, sysctl.Conntrack) error {
	r.applied++
	return nil
}

func (r *recordingSetter) Set(_ context.Context, s []sysctl.Setting) error {
	r.set = append(r.set, s...)
	return nil
}

// TestInitOnlySetsIPVSSysctls: the agent's /proc/sys is read-only, so
// --init-only, privileged, sets what IPVS mode needs (each sysctl once for
// both families) beside the conntrack sysctls; other modes need none.
func TestInitOnlySetsIPVSSysctls(t *testing.T) {
	both := []dataplane.Family{dataplane.IPv4, dataplane.IPv6}
	hasIPVS := func() error { return nil }
	for _, mode := range []string{"iptables", "nftables"} {
		o := NewOptions()
		o.ProxyMode = mode
		var r recordingSetter
		if err := initOnly(context.Background(), o, &r, hasIPVS, both); err != nil {
			t.Fatal(err)
		}
		if r.applied != 1 || len(r.set) != 0 {
			t.Errorf("%s mode: conntrack applied %d times, other sysctls %v; want once and none", mode, r.applied, r.set)
		}
	}

	o := NewOptions()
	o.ProxyMode = "ipvs"
	var r recordingSetter
	if err := initOnly(context.Background(), o, &r, hasIPVS, both); err != nil {
		t.Fatal(err)
	}
	want := []sysctl.Setting{
		{Path: "/proc/sys/net/ipv4/vs/conntrack", Value: 1},
		{Path: "/proc/sys/net/ipv4/vs/expire_nodest_conn", Value: 1},
		{Path: "/proc/sys/net/ipv4/vs/expire_quiescent_template", Value: 1},
		{Path: "/proc/sys/net/ipv4/ip_forward", Value: 1},
	}
	if r.applied != 1 || !slices.Equal(r.set, want) {
		t.Errorf("ipvs mode: conntrack applied %d times, set %v; want once and %v", r.applied, r.set, want)
	}
	// Every sysctl the dataplanes check is one the init container sets.
	for _, f := range both {
		for _, c := range ipvs.Sysctls(f) {
			if !slices.Contains(r.set, sysctl.Setting{Path: "/proc/sys/" + c.Name, Value: c.Value}) {
				t.Errorf("the %v dataplane checks %s=%d, which --init-only does not set", f, c.Name, c.Value)
			}
		}
	}

	// A kernel without IPVS is named as such, and nothing is written.
	r = recordingSetter{}
	noIPVS := errors.New("the kernel has no IPVS")
	if err := initOnly(context.Background(), o, &r, func() error { return noIPVS }, both); !errors.Is(err, noIPVS) || len(r.set) != 0 {
		t.Errorf("without IPVS: %v, set %v; want the IPVS error and nothing set", err, r.set)
	}
}
