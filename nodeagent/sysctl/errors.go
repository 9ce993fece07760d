package sysctl

import (
	"errors"
	"io/fs"
	"syscall"
)

// ErrReadOnly is wrapped by Kernel errors for a file that cannot be written
// here: a sysctl the kernel makes read-only in this network namespace
// (nf_conntrack_max outside the host's), or a /proc/sys or /sys mounted
// read-only (an unprivileged container).
var ErrReadOnly = errors.New("read-only")

// IsReadOnly reports whether err says the file cannot be written here.
func IsReadOnly(err error) bool { return errors.Is(err, ErrReadOnly) }

// readOnly reports whether a write failed because the file is read-only:
// EACCES for a sysctl of mode 0444 (root included), EPERM without the
// capability, EROFS on a read-only mount.
func readOnly(err error) bool {
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)
}
