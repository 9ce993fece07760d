package iptables

import (
	"errors"
	"fmt"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

// Family is the IP family one Dataplane programs. iptables keeps IPv4 and
// IPv6 rules in separate tables driven by separate binaries (iptables-restore
// and ip6tables-restore), so the agent runs one Dataplane per family, as
// kube-proxy runs one proxier per family.
type Family int

const (
	// IPv4 programs iptables with the table's IPv4 addresses.
	IPv4 Family = 4
	// IPv6 programs ip6tables with the table's IPv6 addresses.
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string { return plan.Family(f).String() }

// Backend names the iptables implementation: the legacy x_tables kernel API
// or the nf_tables one behind iptables-nft. Both can be loaded at once and
// both apply to every packet, so the agent must write to the one the rest of
// the node uses.
type Backend string

const (
	// BackendAuto detects the backend the node already uses (see detect.go).
	BackendAuto Backend = "auto"
	// BackendNFT uses iptables-nft-restore and friends.
	BackendNFT Backend = "nft"
	// BackendLegacy uses iptables-legacy-restore and friends.
	BackendLegacy Backend = "legacy"
)

// LocalMode says how the rules tell traffic from local pods from other
// traffic, as kube-proxy's --detect-local-mode (see the README's
// Masquerade section).
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

// DefaultLockWait bounds how long legacy iptables waits for the xtables
// lock (/run/xtables.lock, shared by every namespace on the host): long
// enough to ride out another writer's restore, short enough that a stuck
// holder turns into a reported error and a retried sync.
const DefaultLockWait = 5 * time.Second

// Config configures a Dataplane. The zero value is not usable: start from
// DefaultConfig, which holds every default with its reason.
type Config struct {
	// Family is the IP family programmed; addresses of the other family in
	// the table are ignored.
	Family Family
	// Backend selects legacy or nft iptables; BackendAuto (or "") detects
	// it at the first Sync.
	Backend Backend
	// MasqueradeBit is the packet-mark bit (0-31) that flags traffic for
	// SNAT in PP-POSTROUTING. Taken literally: 0 is bit 0.
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
	// not be dropped in PP-FORWARD (kube-proxy checks the same sysctl).
	ConntrackTCPBeLiberal bool
	// NoRandomFully masquerades without --random-fully, for iptables
	// older than 1.6.2 (or kernels without NF_NAT_RANGE_PROTO_RANDOM_FULLY).
	NoRandomFully bool
	// LockWait bounds the wait for the legacy xtables lock; 0 means
	// DefaultLockWait.
	LockWait time.Duration
	// CommandPrefix is prepended to every command the Dataplane runs, for
	// example {"ip", "netns", "exec", "node"} to program another network
	// namespace. Empty in production.
	CommandPrefix []string
	// OnRestoreFailure, when set, is called after each failed
	// iptables-restore (partial reports whether it was a partial sync), so
	// the agent can count kube-proxy's restore-failure metric. It runs on
	// the Sync caller's goroutine and must not block.
	OnRestoreFailure func(partial bool)
}

// DefaultConfig returns the defaults for family.
func DefaultConfig(family Family) Config {
	return Config{
		Family: family,
		// Detect, as kube-proxy's iptables-wrapper does: writing to the
		// backend the node does not use leaves service rules in a table
		// nobody looks at, and both backends' rules apply to packets.
		Backend:       BackendAuto,
		MasqueradeBit: DefaultMasqueradeBit,
		// Without a CIDR nothing can be recognised; the agent's options
		// choose ClusterCIDR or NodeCIDR when they have one.
		LocalMode: LocalNone,
		LockWait:  DefaultLockWait,
	}
}

// Validate checks c and returns an error wrapping ErrInvalidConfig that
// lists everything wrong.
func (c *Config) Validate() error {
	var errs []error
	if c.Family != IPv4 && c.Family != IPv6 {
		errs = append(errs, fmt.Errorf("family %v: want IPv4 or IPv6", c.Family))
	}
	switch c.Backend {
	case "", BackendAuto, BackendNFT, BackendLegacy:
	default:
		errs = append(errs, fmt.Errorf("backend %q: want auto, nft or legacy", c.Backend))
	}
	errs = append(errs, c.settings().Validate()...)
	if c.LockWait < 0 {
		errs = append(errs, fmt.Errorf("lock wait %v is negative", c.LockWait))
	}
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
