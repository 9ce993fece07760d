package ipvs

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

// Family is the IP family one Dataplane programs. IPVS holds both families
// in one table, but ipsets and iptables rules are per family (ip6tables,
// "family inet6" sets), so the agent runs one Dataplane per family, as
// kube-proxy runs one IPVS proxier per family.
type Family int

const (
	// IPv4 programs the table's IPv4 addresses.
	IPv4 Family = 4
	// IPv6 programs the table's IPv6 addresses.
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string { return plan.Family(f).String() }

// has reports whether a belongs to the family.
func (f Family) has(a netip.Addr) bool { return plan.Family(f).Has(a) }

// LocalMode says how the rules tell traffic from local pods from other
// traffic, as kube-proxy's --detect-local-mode.
type LocalMode = plan.LocalMode

const (
	// LocalNone cannot tell pod traffic apart: only the node's own
	// ClusterIP traffic is masqueraded (unless MasqueradeAll), and
	// externalTrafficPolicy Local addresses without a local endpoint drop
	// pod traffic too.
	LocalNone = plan.LocalNone
	// LocalClusterCIDR treats sources in Config.ClusterCIDRs as pods.
	LocalClusterCIDR = plan.LocalClusterCIDR
	// LocalNodeCIDR treats sources in the node's pod CIDRs (the table's
	// NodeInfo.pod_cidrs) as pods.
	LocalNodeCIDR = plan.LocalNodeCIDR
)

// Backend names the iptables implementation the few rules IPVS mode needs
// are written to; it is detected as the iptables dataplane detects it
// (iptables.DetectBackend).
type Backend = iptables.Backend

const (
	// BackendAuto detects the backend the node already uses.
	BackendAuto = iptables.BackendAuto
	// BackendNFT uses iptables-nft-restore and friends.
	BackendNFT = iptables.BackendNFT
	// BackendLegacy uses iptables-legacy-restore and friends.
	BackendLegacy = iptables.BackendLegacy
)

// Schedulers lists the IPVS schedulers Config.Scheduler accepts. All are in
// mainline kernels (ip_vs_<name>); with every real server at weight 1, the
// weighted ones behave like their plain counterparts.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq"}

// Defaults, each with its reason.
const (
	// DefaultScheduler is kube-proxy's default: round robin spreads
	// connections evenly over the real servers and needs no state.
	DefaultScheduler = "rr"
	// DefaultInterface holds the service addresses, as kube-proxy's
	// kube-ipvs0: a name of our own, so that a node being migrated from
	// kube-proxy keeps both and neither deletes the other's addresses.
	DefaultInterface = "pp-ipvs0"
	// DefaultMasqueradeBit is kube-proxy's: bit 14 (0x4000) of the packet
	// mark, which other components avoid by convention.
	DefaultMasqueradeBit = 14
	// DefaultLockWait bounds how long legacy iptables waits for the
	// xtables lock, as in the iptables dataplane (see
	// iptables.DefaultLockWait).
	DefaultLockWait = iptables.DefaultLockWait
)

// Config configures a Dataplane. The zero value is not usable: start from
// DefaultConfig, which holds every default with its reason.
type Config struct {
	// Family is the IP family programmed; addresses of the other family in
	// the table are ignored.
	Family Family
	// Scheduler is the IPVS scheduler of every virtual server, one of
	// Schedulers.
	Scheduler string
	// TCPTimeout, TCPFinTimeout and UDPTimeout set IPVS's connection
	// timeouts (ipvsadm --set), whole seconds; 0 leaves the kernel's value
	// (900 s, 120 s and 300 s unless someone changed them), as kube-proxy's
	// --ipvs-tcp-timeout and friends.
	TCPTimeout, TCPFinTimeout, UDPTimeout time.Duration
	// Interface is the dummy link that holds the service addresses, so
	// that the kernel delivers their traffic locally, where IPVS takes it.
	// The Dataplane creates it and owns every address on it.
	Interface string
	// MasqueradeBit is the packet-mark bit (0-31) that flags traffic for
	// SNAT in PP-IPVS-POSTROUTING. Taken literally: 0 is bit 0.
	MasqueradeBit int
	// MasqueradeAll masquerades all ClusterIP traffic, as kube-proxy's
	// --masquerade-all.
	MasqueradeAll bool
	// LocalMode says how pod traffic is recognised; "" means LocalNone.
	LocalMode LocalMode
	// ClusterCIDRs are the cluster's pod CIDRs (at most one per family),
	// used with LocalClusterCIDR.
	ClusterCIDRs []string
	// NodePortAddresses limits NodePorts to the node's addresses in these
	// CIDRs; empty means every address of the family but loopback and
	// link-local ones.
	NodePortAddresses []string
	// NodeIPs are the node's primary addresses. One of the family inside a
	// Service's loadBalancerSourceRanges lets the node itself reach the
	// load balancer IP, as kube-proxy's nodeIP does. Optional.
	NodeIPs []string
	// ExcludeCIDRs protects virtual servers in these CIDRs, which other
	// programs own, from full syncs, which otherwise delete every virtual
	// server of the family they did not create (kube-proxy's
	// --ipvs-exclude-cidrs).
	ExcludeCIDRs []string
	// Backend selects legacy or nft iptables; BackendAuto (or "") detects
	// it at the first Sync.
	Backend Backend
	// NoRandomFully masquerades without --random-fully, for iptables
	// older than 1.6.2.
	NoRandomFully bool
	// LockWait bounds the wait for the legacy xtables lock; 0 means
	// DefaultLockWait.
	LockWait time.Duration
	// NetNS is the path of the network namespace to program, for example
	// /run/netns/node-0; "" programs the agent's own namespace
	// (production). Tests program throwaway namespaces with it.
	NetNS string
	// CommandPrefix is prepended to every command the Dataplane runs
	// (ipset, iptables-restore...); empty means {"nsenter", "--net=" +
	// NetNS} when NetNS is set and nothing otherwise.
	CommandPrefix []string
}

// DefaultConfig returns the defaults for family.
func DefaultConfig(family Family) Config {
	return Config{
		Family:    family,
		Scheduler: DefaultScheduler,
		// Zero timeouts leave the kernel's, which kube-proxy also keeps
		// by default: changing them is a node-wide decision.
		Interface:     DefaultInterface,
		MasqueradeBit: DefaultMasqueradeBit,
		// Without a CIDR nothing can be recognised; the agent's options
		// choose ClusterCIDR or NodeCIDR when they have one.
		LocalMode: LocalNone,
		// Detect, as the iptables dataplane does: rules in the backend the
		// node does not use still apply but are invisible to its tools.
		Backend:  BackendAuto,
		LockWait: DefaultLockWait,
	}
}

// maxInterfaceName is IFNAMSIZ minus the terminating NUL.
const maxInterfaceName = 15

// Validate checks c and returns an error wrapping ErrInvalidConfig that
// lists everything wrong.
func (c *Config) Validate() error {
	var errs []error
	if c.Family != IPv4 && c.Family != IPv6 {
		errs = append(errs, fmt.Errorf("family %v: want IPv4 or IPv6", c.Family))
	}
	if !slices.Contains(Schedulers, c.Scheduler) {
		errs = append(errs, fmt.Errorf("scheduler %q: want one of %s", c.Scheduler, strings.Join(Schedulers, ", ")))
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"tcp timeout", c.TCPTimeout}, {"tcp fin timeout", c.TCPFinTimeout}, {"udp timeout", c.UDPTimeout}} {
		switch {
		case t.d < 0:
			errs = append(errs, fmt.Errorf("%s %v is negative", t.name, t.d))
		case t.d%time.Second != 0:
			// IPVS counts whole seconds; rounding silently would make the
			// setting say something the kernel does not do.
			errs = append(errs, fmt.Errorf("%s %v is not a whole number of seconds", t.name, t.d))
		case t.d/time.Second > math.MaxUint32:
			errs = append(errs, fmt.Errorf("%s %v is too large", t.name, t.d))
		}
	}
	if c.Interface == "" || len(c.Interface) > maxInterfaceName || strings.ContainsAny(c.Interface, "/ \t\n:") {
		errs = append(errs, fmt.Errorf("interface %q: want 1 to %d characters without '/', ':' or spaces", c.Interface, maxInterfaceName))
	}
	errs = append(errs, c.settings().Validate()...)
	for _, s := range c.ExcludeCIDRs {
		if _, err := netip.ParsePrefix(s); err != nil {
			errs = append(errs, fmt.Errorf("excludeCIDRs: %w", err))
		}
	}
	switch c.Backend {
	case "", BackendAuto, BackendNFT, BackendLegacy:
	default:
		errs = append(errs, fmt.Errorf("backend %q: want auto, nft or legacy", c.Backend))
	}
	if c.LockWait < 0 {
		errs = append(errs, fmt.Errorf("lock wait %v is negative", c.LockWait))
	}
	if c.NetNS != "" && !filepath.IsAbs(c.NetNS) {
		errs = append(errs, fmt.Errorf("netns %q: want an absolute path such as /run/netns/NAME", c.NetNS))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// withDefaults fills what Validate lets be empty.
func withDefaults(c Config) Config {
	if c.Backend == "" {
		c.Backend = BackendAuto
	}
	if c.LocalMode == "" {
		c.LocalMode = LocalNone
	}
	if c.LockWait == 0 {
		c.LockWait = DefaultLockWait
	}
	if len(c.CommandPrefix) == 0 && c.NetNS != "" {
		// nsenter enters the network namespace only: the tools still see
		// this host's /run (the legacy xtables lock) and filesystem.
		c.CommandPrefix = []string{"nsenter", "--net=" + c.NetNS}
	}
	return c
}

// settings returns the fields every dataplane has, for package plan.
func (c *Config) settings() plan.Settings {
	return plan.Settings{
		Family: plan.Family(c.Family), MasqueradeBit: c.MasqueradeBit, LocalMode: c.LocalMode,
		ClusterCIDRs: c.ClusterCIDRs, NodePortAddresses: c.NodePortAddresses, NodeIPs: c.NodeIPs,
	}
}
