package iptables

import (
	"errors"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

func TestConfigValidate(t *testing.T) {
	ok := testConfig(dataplane.IPv4)
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"family":            func(c *Config) { c.Family = 5 },
		"backend":           func(c *Config) { c.Backend = "iptables" },
		"masquerade bit":    func(c *Config) { c.MasqueradeBit = 32 },
		"local mode":        func(c *Config) { c.LocalMode = "Bridge" },
		"no cluster CIDR":   func(c *Config) { c.ClusterCIDRs = []string{"fd00::/48"} },
		"two cluster CIDRs": func(c *Config) { c.ClusterCIDRs = []string{"10.0.0.0/16", "10.1.0.0/16"} },
		"bad CIDR":          func(c *Config) { c.ClusterCIDRs = []string{"10.0.0.0/33"} },
		"loopback nodeport": func(c *Config) { c.NodePortAddresses = []string{"127.0.0.0/8"} },
		"bad node IP":       func(c *Config) { c.NodeIPs = []string{"node"} },
		"negative lock":     func(c *Config) { c.LockWait = -1 },
	} {
		c := testConfig(dataplane.IPv4)
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, dataplane.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
	}
	all := testConfig(dataplane.IPv4)
	all.NodePortAddresses = []string{"0.0.0.0/0"}
	if err := all.Validate(); err != nil {
		t.Errorf("0.0.0.0/0 nodePortAddresses: %v", err)
	}
	// What the agent builds: the settings and a backend, nothing else.
	bare := Config{Settings: dataplane.DefaultSettings(dataplane.IPv6)}
	if err := bare.Validate(); err != nil {
		t.Errorf("Config with only Settings: %v", err)
	}
}
