package conntrack

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// ListError is a failed or interrupted dump of the conntrack table. When
// the dump failed, Clean deleted nothing; when it was only interrupted
// (IsInterrupted), Clean went on with the flows it read.
type ListError struct {
	// Family is the table's IP family.
	Family dataplane.Family
	// Err is netlink's error.
	Err error
}

// Error describes the failure.
func (e *ListError) Error() string {
	return fmt.Sprintf("listing %v conntrack flows: %v", e.Family, e.Err)
}

// Unwrap returns netlink's error.
func (e *ListError) Unwrap() error { return e.Err }

// IsListFailed reports whether err is (or wraps) a ListError.
func IsListFailed(err error) bool {
	var le *ListError
	return errors.As(err, &le)
}

// DeleteError is a delete request that failed for some flows, or whose
// dump was interrupted; the count Clean returns is of the flows deleted.
// The stale flows left are deleted by the next Clean.
type DeleteError struct {
	// Family is the table's IP family.
	Family dataplane.Family
	// Err is netlink's error: how many deletions failed, and whether the
	// dump was interrupted.
	Err error
}

// Error describes the failure.
func (e *DeleteError) Error() string {
	return fmt.Sprintf("deleting stale %v conntrack flows: %v", e.Family, e.Err)
}

// Unwrap returns netlink's error.
func (e *DeleteError) Unwrap() error { return e.Err }

// IsDeleteFailed reports whether err is (or wraps) a DeleteError.
func IsDeleteFailed(err error) bool {
	var de *DeleteError
	return errors.As(err, &de)
}

// IsInterrupted reports whether err includes a dump the kernel cut short
// because the table changed while it was read (NLM_F_DUMP_INTR). Such a
// Clean did its work on the flows it read; the rest wait for the next one.
func IsInterrupted(err error) bool { return errors.Is(err, netlink.ErrDumpInterrupted) }
