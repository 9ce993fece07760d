package ipvs

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string // substring of the error; "" for valid
	}{
		{"defaults", nil, ""},
		{"every scheduler", func(c *Config) { c.Scheduler = "sed" }, ""},
		{"ipv6 cluster CIDR", func(c *Config) {
			c.Family, c.LocalMode, c.ClusterCIDRs = dataplane.IPv6, dataplane.LocalClusterCIDR, []string{"10.244.0.0/16", "fd00:244::/32"}
		}, ""},
		{"bad family", func(c *Config) { c.Family = 5 }, "family"},
		{"unknown scheduler", func(c *Config) { c.Scheduler = "mh" }, `scheduler "mh"`},
		{"empty scheduler", func(c *Config) { c.Scheduler = "" }, "scheduler"},
		{"negative timeout", func(c *Config) { c.TCPTimeout = -time.Second }, "negative"},
		{"sub-second timeout", func(c *Config) { c.UDPTimeout = 1500 * time.Millisecond }, "whole number of seconds"},
		{"long interface", func(c *Config) { c.Interface = "pp-ipvs0-too-long" }, "interface"},
		{"empty interface", func(c *Config) { c.Interface = "" }, "interface"},
		{"masquerade bit", func(c *Config) { c.MasqueradeBit = 32 }, "masquerade bit"},
		{"cluster CIDR missing", func(c *Config) { c.LocalMode = dataplane.LocalClusterCIDR }, "none of family"},
		{"two cluster CIDRs", func(c *Config) {
			c.LocalMode, c.ClusterCIDRs = dataplane.LocalClusterCIDR, []string{"10.244.0.0/16", "10.245.0.0/16"}
		}, "more than one"},
		{"local mode", func(c *Config) { c.LocalMode = "Bridge" }, "local mode"},
		{"loopback nodeport", func(c *Config) { c.NodePortAddresses = []string{"127.0.0.0/8"} }, "loopback"},
		{"loopback nodeport with localhostNodePorts", func(c *Config) {
			c.LocalhostNodePorts, c.NodePortAddresses = true, []string{"127.0.0.0/8"}
		}, "no localhost NodePorts"},
		{"all nodeport addresses", func(c *Config) { c.NodePortAddresses = []string{"0.0.0.0/0"} }, ""},
		{"bad node IP", func(c *Config) { c.NodeIPs = []string{"nope"} }, "nodeIPs"},
		{"bad exclude CIDR", func(c *Config) { c.ExcludeCIDRs = []string{"10.0.0.0/33"} }, "excludeCIDRs"},
		{"backend", func(c *Config) { c.Backend = "xtables" }, "backend"},
		{"netns path", func(c *Config) { c.NetNS = "/proc/1/ns/net" }, ""},
		{"netns name", func(c *Config) { c.NetNS = "node-0" }, "absolute path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig(dataplane.IPv4)
			if tt.edit != nil {
				tt.edit(&c)
			}
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !errors.Is(err, dataplane.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate() = %v, want ErrInvalidConfig mentioning %q", err, tt.want)
			}
		})
	}
}

func TestDefaultsAndWithDefaults(t *testing.T) {
	c := DefaultConfig(dataplane.IPv6)
	if c.Scheduler != "rr" || c.Interface != "pp-ipvs0" || c.MasqueradeBit != 14 || c.Backend != xtables.BackendAuto ||
		c.LocalMode != dataplane.LocalNone || c.LockWait != xtables.DefaultLockWait || c.TCPTimeout != 0 {
		t.Errorf("DefaultConfig = %+v", c)
	}
	w := withDefaults(Config{NetNS: "/run/netns/node-0"})
	if strings.Join(w.CommandPrefix, " ") != "nsenter --net=/run/netns/node-0" {
		t.Errorf("withDefaults = %+v", w)
	}
	w = withDefaults(Config{NetNS: "/run/netns/node-0", CommandPrefix: []string{"ip", "netns", "exec", "node-0"}})
	if strings.Join(w.CommandPrefix, " ") != "ip netns exec node-0" {
		t.Errorf("an explicit CommandPrefix was replaced: %v", w.CommandPrefix)
	}
}
