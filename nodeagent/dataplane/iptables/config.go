package iptables

import (
	"errors"
	"fmt"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// Config configures a Dataplane: the settings every dataplane takes, and
// how to run the iptables tools. iptables keeps IPv4 and IPv6 rules in
// separate tables driven by separate binaries (iptables-restore and
// ip6tables-restore), so the agent runs one Dataplane per family, as
// kube-proxy runs one proxier per family. Start from DefaultConfig, which
// holds every default with its reason.
type Config struct {
	dataplane.Settings
	// Backend selects legacy or nft iptables; xtables.BackendAuto (or "")
	// detects it at the first Sync.
	Backend xtables.Backend
	// LockWait bounds the wait for the legacy xtables lock; 0 means
	// xtables.DefaultLockWait.
	LockWait time.Duration
	// CommandPrefix is prepended to every command the Dataplane runs, for
	// example {"ip", "netns", "exec", "node"} to program another network
	// namespace. Empty in production.
	CommandPrefix []string
}

// DefaultConfig returns the defaults for family.
func DefaultConfig(family dataplane.Family) Config {
	return Config{
		Settings: dataplane.DefaultSettings(family),
		// Detect, as kube-proxy's iptables-wrapper does: writing to the
		// backend the node does not use leaves service rules in a table
		// nobody looks at, and both backends' rules apply to packets.
		Backend:  xtables.BackendAuto,
		LockWait: xtables.DefaultLockWait,
	}
}

// Validate checks c and returns an error wrapping
// dataplane.ErrInvalidConfig that lists everything wrong.
func (c *Config) Validate() error {
	if err := errors.Join(c.Settings.Validate(), c.tools().Validate()); err != nil {
		return fmt.Errorf("%w: %w", dataplane.ErrInvalidConfig, err)
	}
	return nil
}

// tools returns how c runs the iptables tools.
func (c *Config) tools() xtables.Options {
	return xtables.Options{Family: c.Family, Backend: c.Backend, LockWait: c.LockWait, CommandPrefix: c.CommandPrefix}
}
