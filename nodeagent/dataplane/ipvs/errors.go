package ipvs

import (
	"errors"
	"fmt"
	"strings"
)

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
