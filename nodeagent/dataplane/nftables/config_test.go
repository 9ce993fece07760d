package nftables

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  func(*Config)
		want string // substring of the error; "" for valid
	}{
		{name: "defaults", cfg: func(*Config) {}},
		{name: "test config", cfg: func(c *Config) { *c = testConfig(dataplane.IPv6) }},
		{name: "family", cfg: func(c *Config) { c.Family = 5 }, want: "family"},
		{name: "mark bit", cfg: func(c *Config) { c.MasqueradeBit = 32 }, want: "masquerade bit"},
		{name: "local mode", cfg: func(c *Config) { c.LocalMode = "Interface" }, want: "local mode"},
		{name: "cluster CIDR missing", cfg: func(c *Config) { c.LocalMode = dataplane.LocalClusterCIDR; c.ClusterCIDRs = []string{"fd00::/64"} }, want: "none of family"},
		{name: "two cluster CIDRs", cfg: func(c *Config) {
			c.LocalMode = dataplane.LocalClusterCIDR
			c.ClusterCIDRs = []string{"10.0.0.0/8", "172.16.0.0/12"}
		}, want: "more than one"},
		{name: "loopback NodePorts", cfg: func(c *Config) { c.NodePortAddresses = []string{"127.0.0.0/8"} }, want: "loopback"},
		{name: "loopback NodePorts with localhostNodePorts", cfg: func(c *Config) {
			c.LocalhostNodePorts, c.NodePortAddresses = true, []string{"127.0.0.0/8"}
		}, want: "no localhost NodePorts"},
		// Upstream's nftables mode ignores the setting: so does this one.
		{name: "localhostNodePorts alone", cfg: func(c *Config) { c.LocalhostNodePorts = true }},
		{name: "all NodePorts", cfg: func(c *Config) { c.NodePortAddresses = []string{"0.0.0.0/0", "::/0"} }},
		{name: "node IP", cfg: func(c *Config) { c.NodeIPs = []string{"node"} }, want: "nodeIPs"},
		{name: "endpoint maps for every port", cfg: func(c *Config) { c.EndpointMapMin = 1 }},
		{name: "endpoint map minimum", cfg: func(c *Config) { c.EndpointMapMin = -1 }, want: "EndpointMapMin"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig(dataplane.IPv4)
			tt.cfg(&cfg)
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (!errors.Is(err, dataplane.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate = %v, want ErrInvalidConfig mentioning %q", err, tt.want)
			}
			if _, err := New(cfg, nil); (err == nil) != (tt.want == "") {
				t.Errorf("New error %v", err)
			}
		})
	}
}
