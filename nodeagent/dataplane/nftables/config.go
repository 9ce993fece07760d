package nftables

import (
	"errors"
	"fmt"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// TableName is the table the Dataplane owns in each family. Nothing else
// in it is anyone else's: full syncs delete whatever they did not write.
const TableName = "proxyplane"

// nftFamily returns the nf_tables family of f's table: "ip" or "ip6".
// nf_tables keeps IPv4 and IPv6 rules in tables of different families, so
// the agent runs one Dataplane per family, as kube-proxy runs one proxier
// per family.
func nftFamily(f dataplane.Family) string {
	if f == dataplane.IPv6 {
		return "ip6"
	}
	return "ip"
}

// Config configures a Dataplane. The zero value is not usable: start from
// DefaultConfig, which holds every default with its reason.
type Config struct {
	// Settings are what every dataplane takes. Here MasqueradeBit marks
	// traffic for chain masquerading; ConntrackTCPBeLiberal changes
	// nothing, since INVALID packets are never dropped (as upstream's
	// nftables mode; see README.md).
	dataplane.Settings
	// NetNS is the path of the network namespace to program, for example
	// /run/netns/node-0; "" programs the agent's own namespace (production).
	NetNS string
	// EndpointMapMin is the number of endpoints from which a service
	// port's policy chain (without affinity) picks from a named endpoint
	// map rather than a cascade of DNAT rules; 0 means
	// DefaultEndpointMapMin. See README.md, "Endpoint choice".
	EndpointMapMin int
}

// DefaultEndpointMapMin is EndpointMapMin's default. An endpoint map makes
// an endpoint's change a few elements, which the kernel commits without
// walking the chain graph, but every set costs a walk of the table's list
// of sets at each operation on it, so that loading n maps is quadratic in
// n (10,000 maps: 10.7 s against 2.6 s without, on this kernel). From 32
// endpoints up, the maps number at most the endpoints / 32 (7,800 at
// 250,000 endpoints), and smaller Services take a cascade of DNAT rules.
const DefaultEndpointMapMin = 32

// DefaultConfig returns the defaults for family: dataplane.DefaultSettings
// and the agent's own network namespace.
func DefaultConfig(family dataplane.Family) Config {
	return Config{Settings: dataplane.DefaultSettings(family)}
}

// Validate checks c and returns an error wrapping dataplane.ErrInvalidConfig
// that lists everything wrong.
func (c *Config) Validate() error {
	// Settings are all there is to check: NetNS is opened by the first
	// Sync, as a namespace may be created after the configuration is read.
	err := c.Settings.Validate()
	if c.EndpointMapMin < 0 {
		err = errors.Join(err, fmt.Errorf("EndpointMapMin %d: must not be negative", c.EndpointMapMin))
	}
	if lo := c.LoopbackNodePortAddresses(); c.LocalhostNodePorts && len(lo) > 0 {
		// Upstream's nftables mode logs and skips them; a configuration
		// that cannot be honoured is refused here instead.
		err = errors.Join(err, fmt.Errorf("nodePortAddresses %v: the nftables dataplane has no localhost NodePorts", lo))
	}
	if err != nil {
		return fmt.Errorf("%w: %w", dataplane.ErrInvalidConfig, err)
	}
	return nil
}
