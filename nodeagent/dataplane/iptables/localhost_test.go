package iptables

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// localhostConfig is testConfig of family with LocalhostNodePorts.
func localhostConfig(family dataplane.Family) Config {
	c := testConfig(family)
	c.LocalhostNodePorts = true
	return c
}

// TestLocalhostNodePorts checks localhost NodePorts as kube-proxy's
// iptables mode has them: the ruleset (golden localhost-nodeports), and
// packets traced through it with the setting on, off, and on for IPv6,
// which never has them.
func TestLocalhostNodePorts(t *testing.T) {
	np := dptest.NodePortService()
	eps := []string{dptest.LocalEP + ":8080", dptest.RemoteEP + ":8080"}
	tbl := dptest.Table(t, dptest.Node(), np)
	dptest.Golden(t, "localhost-nodeports", string(renderFull(tbl, localhostConfig(dataplane.IPv4)).data), *update)

	type flow struct {
		name string
		flow dptest.Flow
		want []dptest.Outcome
	}
	fromNode := func(dst string, port int) dptest.Flow {
		src := "127.0.0.1"
		if strings.Contains(dst, ":") {
			src = "::1"
		}
		return dptest.Flow{Src: src, Dst: dst, Proto: "tcp", DPort: port, FromNode: true}
	}
	for _, tc := range []struct {
		name  string
		cfg   Config
		flows []flow
	}{
		{"on", localhostConfig(dataplane.IPv4), []flow{
			{"node to 127.0.0.1:NodePort", fromNode("127.0.0.1", 30080), dptest.Accepted(true, eps...)},
			{"node to 127.0.0.2:NodePort", fromNode("127.0.0.2", 30080), dptest.Accepted(true, eps...)},
			{"node to another localhost port", fromNode("127.0.0.1", 22), dptest.Accepted(false)},
			// What route_localnet lets in from outside: the NodePort is
			// DNATed and spared (ctstate DNAT); anything else listening
			// on localhost is dropped, as upstream's KUBE-FIREWALL.
			{"client to 127.0.0.1:NodePort", dptest.Flow{Src: dptest.Client, Dst: "127.0.0.1", Proto: "tcp", DPort: 30080}, dptest.Accepted(true, eps...)},
			{"client to another localhost port", dptest.Flow{Src: dptest.Client, Dst: "127.0.0.1", Proto: "tcp", DPort: 22}, dptest.Refused("DROP")},
			{"node IP NodePort unchanged", dptest.Flow{Src: dptest.Client, Dst: dptest.NodeIP, Proto: "tcp", DPort: 30080}, dptest.Accepted(true, eps...)},
		}},
		{"off", testConfig(dataplane.IPv4), []flow{
			{"node to 127.0.0.1:NodePort", fromNode("127.0.0.1", 30080), dptest.Accepted(false)},
			{"client to another localhost port", dptest.Flow{Src: dptest.Client, Dst: "127.0.0.1", Proto: "tcp", DPort: 22}, dptest.Accepted(false)},
		}},
		{"on, IPv6", localhostConfig(dataplane.IPv6), []flow{
			{"node to [::1]:NodePort", fromNode("::1", 30100), dptest.Accepted(false)},
		}},
		{"on, NodePortAddresses without loopback", func() Config {
			c := localhostConfig(dataplane.IPv4)
			c.NodePortAddresses = []string{"192.168.100.0/24"}
			return c
		}(), []flow{
			{"node to 127.0.0.1:NodePort", fromNode("127.0.0.1", 30080), dptest.Accepted(false)},
		}},
		{"on, NodePortAddresses with loopback", func() Config {
			c := localhostConfig(dataplane.IPv4)
			c.NodePortAddresses = []string{"127.0.0.0/8"}
			return c
		}(), []flow{
			{"node to 127.0.0.1:NodePort", fromNode("127.0.0.1", 30080), dptest.Accepted(true, eps...)},
			{"client to another localhost port", dptest.Flow{Src: dptest.Client, Dst: "127.0.0.1", Proto: "tcp", DPort: 22}, dptest.Refused("DROP")},
			{"node IP NodePort: not in the addresses", dptest.Flow{Src: dptest.Client, Dst: dptest.NodeIP, Proto: "tcp", DPort: 30080}, dptest.Accepted(false)},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRunner()
			d := newTestDataplane(tc.cfg, f, nil)
			if err := d.Sync(context.Background(), dptest.Table(t, dptest.Node(), np, dptest.DualStackService()), nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			tr := newTracer(t, f.kernel, dptest.NodeIP, dptest.NodeIP6, "127.0.0.1", "127.0.0.2", "::1")
			for _, fl := range tc.flows {
				if got, want := tr.trace(fl.flow), dptest.SortOutcomes(slices.Clone(fl.want)); !slices.Equal(got, want) {
					t.Errorf("%s: flow %+v:\n got  %v\n want %v", fl.name, fl.flow, got, want)
				}
			}
		})
	}
}

// TestLocalhostNodePortsSysctl checks that full syncs set route_localnet
// when, and only when, localhost NodePorts are on, write it only when it
// differs, and fail when it cannot be set.
func TestLocalhostNodePortsSysctl(t *testing.T) {
	tbl := dptest.Table(t, dptest.Node(), dptest.NodePortService())
	sync := func(cfg Config, sys *fakeSysctls, full bool) error {
		return newDataplane(cfg, map[xtables.Backend]xtables.Runner{cfg.Backend: newFakeRunner()}, sys, nil).
			Sync(context.Background(), tbl, nil, full)
	}

	sys := &fakeSysctls{}
	if err := sync(localhostConfig(dataplane.IPv4), sys, true); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if want := []string{sysctlRouteLocalnet + "=1"}; !slices.Equal(sys.sets, want) {
		t.Errorf("sysctl writes %v, want %v", sys.sets, want)
	}
	if err := sync(localhostConfig(dataplane.IPv4), sys, true); err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	if len(sys.sets) != 1 {
		t.Errorf("sysctl writes %v: a value already set was written again", sys.sets)
	}

	// Off, or IPv6: the sysctls are not even read.
	for _, cfg := range []Config{testConfig(dataplane.IPv4), localhostConfig(dataplane.IPv6)} {
		if err := sync(cfg, &fakeSysctls{err: errors.New("must not be called")}, true); err != nil {
			t.Errorf("%v, localhost NodePorts %v: Sync: %v", cfg.Family, cfg.LocalhostNodePorts, err)
		}
	}

	broken := errors.New("read-only /proc/sys")
	if err := sync(localhostConfig(dataplane.IPv4), &fakeSysctls{err: broken}, true); !errors.Is(err, broken) {
		t.Errorf("Sync with the sysctl failing = %v, want %v", err, broken)
	}
}
