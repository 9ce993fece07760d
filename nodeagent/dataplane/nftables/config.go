package nftables

import (
	"errors"
	"fmt"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

// Family is the IP family one Dataplane programs. nf_tables keeps IPv4 and
// IPv6 rules in tables of different families ("ip" and "ip6"), so the agent
// runs one Dataplane per family, as kube-proxy runs one proxier per family.
type Family int

const (
	// IPv4 programs table "ip proxyplane" with the table's IPv4 addresses.
	IPv4 Family = 4
	// IPv6 programs table "ip6 proxyplane" with the table's IPv6 addresses.
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string { return plan.Family(f).String() }

// nft returns the nftables family name: "ip" or "ip6".
func (f Family) nft() string {
	if f == IPv6 {
		return "ip6"
	}
	return "ip"
}

// LocalMode says how the rules tell traffic from local pods from other
// traffic, as kube-proxy's --detect-local-mode.
type LocalMode = plan.LocalMode

const (
	// LocalNone cannot tell pod traffic apart: ClusterIP traffic is not
	// masqueraded (unless MasqueradeAll) and eTP Local services do not
	// short-circuit pod traffic.
	LocalNone = plan.LocalNone
	// LocalClusterCIDR treats sources in Config.ClusterCIDRs as pods.
	LocalClusterCIDR = plan.LocalClusterCIDR
	// LocalNodeCIDR treats sources in the node's pod CIDRs (the table's
	// NodeInfo.pod_cidrs) as pods.
	LocalNodeCIDR = plan.LocalNodeCIDR
)

// DefaultMasqueradeBit is kube-proxy's default: bit 14 (0x4000) of the
// packet mark. Other components (kubelet's old KUBE-MARK-DROP used bit 15,
// Calico and Cilium use high bits) avoid it by convention.
const DefaultMasqueradeBit = 14

// TableName is the table the Dataplane owns in each family. Nothing else
// in it is anyone else's: full syncs delete whatever they did not write.
const TableName = "proxyplane"

// Config configures a Dataplane. The zero value is not usable: start from
// DefaultConfig, which holds every default with its reason.
type Config struct {
	// Family is the IP family programmed; addresses of the other family in
	// the table are ignored.
	Family Family
	// MasqueradeBit is the packet-mark bit (0-31) that flags traffic for
	// SNAT in chain masquerading. Taken literally: 0 is bit 0.
	MasqueradeBit int
	// MasqueradeAll masquerades all ClusterIP traffic, as kube-proxy's
	// --masquerade-all.
	MasqueradeAll bool
	// LocalMode says how pod traffic is recognised; "" means LocalNone.
	LocalMode LocalMode
	// ClusterCIDRs are the cluster's pod CIDRs (at most one per family),
	// used with LocalClusterCIDR.
	ClusterCIDRs []string
	// NodePortAddresses limits NodePorts to the node's local addresses in
	// these CIDRs; empty means every local address but loopback.
	NodePortAddresses []string
	// NodeIPs are the node's primary addresses. An address of Family inside
	// a Service's loadBalancerSourceRanges lets the node itself reach the
	// load balancer IP, as kube-proxy's nodeIP does. Optional.
	NodeIPs []string
	// ConntrackTCPBeLiberal must be set when the node sets
	// net.netfilter.nf_conntrack_tcp_be_liberal: then INVALID packets need
	// not be dropped in chain filter-forward.
	ConntrackTCPBeLiberal bool
	// NoRandomFully masquerades without fully-random port selection (for
	// kernels without NF_NAT_RANGE_PROTO_RANDOM_FULLY).
	NoRandomFully bool
	// NetNS is the path of the network namespace to program, for example
	// /run/netns/node-0; "" programs the agent's own namespace (production).
	NetNS string
	// OnTransactionFailure, when set, is called after each transaction
	// the kernel refused or that could not be sent (partial reports
	// whether it was a partial sync), so the agent can count kube-proxy's
	// sync failure metric. It runs on the Sync caller's goroutine and must
	// not block.
	OnTransactionFailure func(partial bool)
}

// DefaultConfig returns the defaults for family.
func DefaultConfig(family Family) Config {
	return Config{
		Family:        family,
		MasqueradeBit: DefaultMasqueradeBit,
		// Without a CIDR nothing can be recognised; the agent's options
		// choose ClusterCIDR or NodeCIDR when they have one.
		LocalMode: LocalNone,
	}
}

// Validate checks c and returns an error wrapping ErrInvalidConfig that
// lists everything wrong.
func (c *Config) Validate() error {
	var errs []error
	if c.Family != IPv4 && c.Family != IPv6 {
		errs = append(errs, fmt.Errorf("family %v: want IPv4 or IPv6", c.Family))
	}
	errs = append(errs, c.settings().Validate()...)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// settings returns the fields every dataplane has, for package plan.
func (c *Config) settings() plan.Settings {
	return plan.Settings{
		Family: plan.Family(c.Family), MasqueradeBit: c.MasqueradeBit, LocalMode: c.LocalMode,
		ClusterCIDRs: c.ClusterCIDRs, NodePortAddresses: c.NodePortAddresses, NodeIPs: c.NodeIPs,
	}
}
