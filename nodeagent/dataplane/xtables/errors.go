package xtables

import (
	"errors"
	"strings"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// RestoreError is a failed iptables-restore: the kernel (or the tool)
// refused the input. Each table commits on its own, so what stays in
// force is the dataplane's matter (see its README). The IPVS dataplane's
// `ipset restore` fails with the same type: package tool types every
// restore alike.
type RestoreError = tool.RestoreError

// IsRestoreFailed reports whether err is (or wraps) a RestoreError.
func IsRestoreFailed(err error) bool {
	var re *RestoreError
	return errors.As(err, &re)
}

// CommandError is a failed iptables, iptables-save or ipset command
// other than a restore.
type CommandError = tool.CommandError

// IsCommandFailed reports whether err is (or wraps) a CommandError.
func IsCommandFailed(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce)
}

// MissingBinaryError says a tool a dataplane needs is not installed; the
// node needs the iptables package (both flavours come with it on Debian
// and derivatives), or ipset for the IPVS dataplane.
type MissingBinaryError = tool.MissingBinaryError

// IsMissingBinary reports whether err is (or wraps) a MissingBinaryError.
func IsMissingBinary(err error) bool {
	var me *MissingBinaryError
	return errors.As(err, &me)
}

// LockError says legacy iptables gave up waiting for the xtables lock
// (/run/xtables.lock, shared by every network namespace on the host):
// another program held it longer than the dataplane's lock wait. Retrying
// is the remedy.
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

// lockError returns a *LockError when err is a command's lock timeout,
// nil otherwise. The message is checked too: the exit code alone is
// shared with other resource problems.
func lockError(err error) error {
	var ce *CommandError
	if errors.As(err, &ce) && ce.ExitCode == exitLockHeld && strings.Contains(ce.Stderr, "xtables lock") {
		return &LockError{Err: err}
	}
	return nil
}
