package ipvs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// ErrInvalidConfig is wrapped by every Config validation failure.
var ErrInvalidConfig = errors.New("invalid IPVS dataplane config")

// ErrNoIPVS says the kernel has no IPVS: the "IPVS" generic netlink family
// is not registered, so the ip_vs module is neither built in nor loadable.
// New returns it (wrapped) before touching anything; the agent cannot run
// in IPVS mode on such a kernel and must exit. github.com/moby/ipvs does
// not report this itself: its requests go out with family 0 and "succeed".
var ErrNoIPVS = errors.New("the kernel has no IPVS (ip_vs module / CONFIG_IP_VS)")

// IsIPVSUnavailable reports whether err says the kernel has no IPVS.
func IsIPVSUnavailable(err error) bool { return errors.Is(err, ErrNoIPVS) }

// ErrNoDummyLink says the kernel cannot create the dummy link that holds
// the service addresses (no dummy module / CONFIG_DUMMY). Sync returns it
// (wrapped); an IPVS kernel without it cannot run this dataplane.
var ErrNoDummyLink = errors.New("the kernel has no dummy link type (dummy module / CONFIG_DUMMY)")

// IsDummyUnavailable reports whether err says the kernel has no dummy link
// type.
func IsDummyUnavailable(err error) bool { return errors.Is(err, ErrNoDummyLink) }

// KernelError is a failed netlink or /proc/sys operation: creating a
// virtual or real server, binding an address, setting a sysctl. Sync goes
// on with the other objects and reports them all; the next Sync is full
// and starts from what the kernel holds.
type KernelError struct {
	// Op is what was attempted, as "add virtual server".
	Op string
	// Object names what it was attempted on, as "TCP 10.96.0.10:80".
	Object string
	// Key is the Service that wanted it, "" when none did alone.
	Key string
	// Err is the kernel's (or the library's) error.
	Err error
}

// Error describes the operation, its object and Service.
func (e *KernelError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Op, e.Object)
	if e.Key != "" {
		fmt.Fprintf(&b, " (service %s)", e.Key)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns the kernel's error.
func (e *KernelError) Unwrap() error { return e.Err }

// IsKernelFailed reports whether err is (or wraps) a KernelError.
func IsKernelFailed(err error) bool {
	var ke *KernelError
	return errors.As(err, &ke)
}

// RestoreError is a failed `ipset restore` or `iptables-restore`: the tool
// refused the input.
type RestoreError struct {
	// Tool is the command that ran ("ipset", "iptables-nft-restore"...).
	Tool string
	// Line is the failing input line the tool reported, 0 when it named
	// none.
	Line int
	// Rule is the text of Line, when known.
	Rule string
	// Stderr is what the tool printed.
	Stderr string
	// Err is the process error.
	Err error
}

// Error describes the tool, the line and the tool's message.
func (e *RestoreError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s restore failed", e.Tool)
	if e.Line > 0 {
		fmt.Fprintf(&b, " at line %d", e.Line)
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, " %q", e.Rule)
	}
	if s := strings.TrimSpace(e.Stderr); s != "" {
		fmt.Fprintf(&b, ": %s", tool.FirstLine(s))
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns the process error.
func (e *RestoreError) Unwrap() error { return e.Err }

// IsRestoreFailed reports whether err is (or wraps) a RestoreError.
func IsRestoreFailed(err error) bool {
	var re *RestoreError
	return errors.As(err, &re)
}

// CommandError is a failed command other than a restore (ipset save,
// iptables -C, iptables-save).
type CommandError = tool.CommandError

// IsCommandFailed reports whether err is (or wraps) a CommandError.
func IsCommandFailed(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce)
}

// MissingBinaryError says a tool the Dataplane needs is not installed:
// ipset (package ipset) or the iptables tools (package iptables).
type MissingBinaryError = tool.MissingBinaryError

// IsMissingBinary reports whether err is (or wraps) a MissingBinaryError.
func IsMissingBinary(err error) bool {
	var me *MissingBinaryError
	return errors.As(err, &me)
}
