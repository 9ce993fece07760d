package ipvs

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
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
)

// Config configures a Dataplane: the settings every dataplane takes, and
// IPVS's own. IPVS holds both families in one table, but ipsets and
// iptables rules are per family (ip6tables, "family inet6" sets), so the
// agent runs one Dataplane per family, as kube-proxy runs one IPVS
// proxier per family. In Settings, NodePortAddresses limits NodePorts to
// the node's addresses in these CIDRs, and empty means every address of
// the family but loopback and link-local ones. The zero value is not
// usable: start from DefaultConfig, which holds every default with its
// reason.
type Config struct {
	dataplane.Settings
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
	// ExcludeCIDRs protects virtual servers in these CIDRs, which other
	// programs own, from full syncs, which otherwise delete every virtual
	// server of the family they did not create (kube-proxy's
	// --ipvs-exclude-cidrs).
	ExcludeCIDRs []string
	// Backend selects legacy or nft iptables for the few rules IPVS mode
	// needs; xtables.BackendAuto (or "") detects it at the first Sync, as
	// the iptables dataplane does.
	Backend xtables.Backend
	// LockWait bounds the wait for the legacy xtables lock; 0 means
	// xtables.DefaultLockWait.
	LockWait time.Duration
	// NetNS is the path of the network namespace to program, for example
	// /run/netns/node-0; "" programs the agent's own namespace
	// (production). Tests program throwaway namespaces with it.
	NetNS string
	// CommandPrefix is prepended to every command the Dataplane runs
	// (ipset, iptables-restore...); empty means {"nsenter", "--net=" +
	// NetNS} when NetNS is set and nothing otherwise.
	CommandPrefix []string
	// Log hears what degrades the dataplane without failing a sync (a
	// sysctl of Sysctls not set); nil means slog.Default().
	Log *slog.Logger
}

// DefaultConfig returns the defaults for family.
func DefaultConfig(family dataplane.Family) Config {
	return Config{
		Settings:  dataplane.DefaultSettings(family),
		Scheduler: DefaultScheduler,
		// Zero timeouts leave the kernel's, which kube-proxy also keeps
		// by default: changing them is a node-wide decision.
		Interface: DefaultInterface,
		// Detect, as the iptables dataplane does: rules in the backend the
		// node does not use still apply but are invisible to its tools.
		Backend:  xtables.BackendAuto,
		LockWait: xtables.DefaultLockWait,
	}
}

// maxInterfaceName is IFNAMSIZ minus the terminating NUL.
const maxInterfaceName = 15

// Validate checks c and returns an error wrapping
// dataplane.ErrInvalidConfig that lists everything wrong.
func (c *Config) Validate() error {
	errs := []error{c.Settings.Validate()}
	if lo := c.LoopbackNodePortAddresses(); c.LocalhostNodePorts && len(lo) > 0 {
		errs = append(errs, fmt.Errorf("nodePortAddresses %v: the IPVS dataplane has no localhost NodePorts", lo))
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
	for _, s := range c.ExcludeCIDRs {
		if _, err := netip.ParsePrefix(s); err != nil {
			errs = append(errs, fmt.Errorf("excludeCIDRs: %w", err))
		}
	}
	errs = append(errs, c.tools().Validate())
	if c.NetNS != "" && !filepath.IsAbs(c.NetNS) {
		errs = append(errs, fmt.Errorf("netns %q: want an absolute path such as /run/netns/NAME", c.NetNS))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", dataplane.ErrInvalidConfig, err)
	}
	return nil
}

// withDefaults fills the command prefix, which depends on NetNS, and the
// logger.
func withDefaults(c Config) Config {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if len(c.CommandPrefix) == 0 && c.NetNS != "" {
		// nsenter enters the network namespace only: the tools still see
		// this host's /run (the legacy xtables lock) and filesystem.
		c.CommandPrefix = []string{"nsenter", "--net=" + c.NetNS}
	}
	return c
}

// tools returns how c runs the iptables tools.
func (c *Config) tools() xtables.Options {
	return xtables.Options{Family: c.Family, Backend: c.Backend, LockWait: c.LockWait, CommandPrefix: c.CommandPrefix}
}
