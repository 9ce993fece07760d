package nftables

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// TransactionError is a transaction the kernel refused. nf_tables applies a
// batch all or nothing, so none of it took effect: the rules of the last
// successful Sync stay in force. The next Sync is made full, from a
// listing of the table, as a refusal may come of changes made behind the
// Dataplane's back.
type TransactionError struct {
	// Family is the family of the table.
	Family dataplane.Family
	// Op is the first refused operation in nft syntax ("add rule ip
	// proxyplane ..."), "" when the kernel refused the commit as a whole
	// (a loop between chains, say).
	Op string
	// Key is the Service whose object Op writes, "" for shared objects.
	Key string
	// Partial reports whether the transaction was a partial sync.
	Partial bool
	// Errno is the kernel's error.
	Errno syscall.Errno
	// Message is the kernel's extended error message, when it gave one.
	Message string
	// Refused counts the operations the kernel refused.
	Refused int
}

// Error describes the refusal: operation, Service and errno.
func (e *TransactionError) Error() string {
	s := fmt.Sprintf("nf_tables refused the %v transaction", e.Family)
	if e.Op != "" {
		s += fmt.Sprintf(" at %q", e.Op)
	}
	if e.Key != "" {
		s += fmt.Sprintf(" (service %s)", e.Key)
	}
	if e.Refused > 1 {
		s += fmt.Sprintf(" and %d more operations", e.Refused-1)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s + ": " + e.Errno.Error()
}

// Unwrap returns the kernel's errno, so errors.Is(err, syscall.EBUSY) works.
func (e *TransactionError) Unwrap() error { return e.Errno }

// IsTransactionRefused reports whether err is (or wraps) a TransactionError.
func IsTransactionRefused(err error) bool {
	var te *TransactionError
	return errors.As(err, &te)
}

// SocketError is a failure to talk to nf_tables over netlink: opening the
// network namespace or the socket, sending a batch, or reading the kernel's
// answer. When Sent is true the batch reached the kernel and its outcome is
// unknown. The next Sync lists what the kernel holds before a full
// rewrite.
type SocketError struct {
	// Op says what failed ("opening namespace /run/netns/x", "sending
	// batch", ...).
	Op string
	// Sent reports whether the batch reached the kernel.
	Sent bool
	// Err is the system error.
	Err error
}

// Error names the failed step.
func (e *SocketError) Error() string {
	s := "nf_tables netlink: " + e.Op
	if e.Sent {
		s += " (transaction outcome unknown)"
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the system error.
func (e *SocketError) Unwrap() error { return e.Err }

// IsSocketFailed reports whether err is (or wraps) a SocketError.
func IsSocketFailed(err error) bool {
	var se *SocketError
	return errors.As(err, &se)
}

// IsOutcomeUnknown reports whether err is a SocketError after the batch was
// sent: the kernel may hold either the old or the new rules.
func IsOutcomeUnknown(err error) bool {
	var se *SocketError
	return errors.As(err, &se) && se.Sent
}
