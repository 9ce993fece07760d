package iptables

import (
	"errors"
	"fmt"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// ErrInvalidConfig is wrapped by every Config validation failure.
var ErrInvalidConfig = errors.New("invalid iptables dataplane config")

// RestoreError is a failed iptables-restore: the kernel (or the tool)
// refused the input. Each table commits on its own; the nat table is
// written first, so a RestoreError leaves nat as it was unless only the
// filter table failed (see README). The next Sync is made full.
type RestoreError struct {
	// Binary is the iptables-restore that ran.
	Binary string
	// Line is the failing input line as iptables-restore reported it, 0
	// when it named none.
	Line int
	// Key is the Service whose rules hold Line, "" when the line belongs
	// to no single Service.
	Key string
	// Rule is the text of Line.
	Rule string
	// Partial reports whether the input was a partial sync.
	Partial bool
	// Stderr is what iptables-restore printed.
	Stderr string
	// Err is the process error.
	Err error
}

// Error describes the failure: tool, line, Service, rule and stderr.
func (e *RestoreError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s failed", e.Binary)
	if e.Line > 0 {
		fmt.Fprintf(&b, " at line %d", e.Line)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " (service %s)", e.Key)
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

// CommandError is a failed iptables, iptables-save or version command
// (anything but a restore).
type CommandError = tool.CommandError

// IsCommandFailed reports whether err is (or wraps) a CommandError.
func IsCommandFailed(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce)
}

// MissingBinaryError says an iptables tool the backend needs is not
// installed; the node needs the iptables package (both flavours come with
// it on Debian and derivatives).
type MissingBinaryError = tool.MissingBinaryError

// IsMissingBinary reports whether err is (or wraps) a MissingBinaryError.
func IsMissingBinary(err error) bool {
	var me *MissingBinaryError
	return errors.As(err, &me)
}

// LockError says legacy iptables gave up waiting for the xtables lock
// (/run/xtables.lock, shared by every network namespace on the host):
// another program held it longer than Config.LockWait. Retrying is the
// remedy.
type LockError struct {
	// Err is the failed command's error.
	Err error
}

// Error says the lock was held and by which command we found out.
func (e *LockError) Error() string { return "xtables lock held by another program: " + e.Err.Error() }

// Unwrap returns the failed command's error.
func (e *LockError) Unwrap() error { return e.Err }

// IsLockHeld reports whether err is (or wraps) a LockError.
func IsLockHeld(err error) bool {
	var le *LockError
	return errors.As(err, &le)
}

// exitLockHeld is xtables' RESOURCE_PROBLEM exit code, which legacy
// iptables returns when it stops waiting for the lock.
const exitLockHeld = 4

// isLockMessage recognises the lock timeout in stderr, as the exit code
// alone is shared with other resource problems.
func isLockMessage(stderr string) bool {
	return strings.Contains(stderr, "xtables lock")
}
