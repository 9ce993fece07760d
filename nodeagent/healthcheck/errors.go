package healthcheck

import (
	"errors"
	"strconv"
)

// ErrClosed is returned by Sync on a Server that was closed.
var ErrClosed = errors.New("health check server closed")

// ErrPortConflict is wrapped by the error Sync returns when two Services
// ask for the same healthCheckNodePort. The API server allocates these
// ports uniquely, so it means a table the agent should not have been sent;
// the Service first by "namespace/name" keeps the port.
var ErrPortConflict = errors.New("health check node port claimed twice")

// ListenError reports a health check node port that could not be opened
// on one address, usually because another process holds it. Sync keeps
// every other port and tries this one again at its next call, as
// kube-proxy does at each sync.
type ListenError struct {
	// Service is the "namespace/name" of the Service the port belongs to.
	Service string
	// Port is the healthCheckNodePort.
	Port int32
	// Network is "tcp4" or "tcp6".
	Network string
	// Address is the host:port listened on.
	Address string
	// Err is the listen failure.
	Err error
}

func (e *ListenError) Error() string {
	return "health check of " + e.Service + " on port " + strconv.Itoa(int(e.Port)) + ": " + e.Err.Error()
}

// Unwrap returns the listen failure.
func (e *ListenError) Unwrap() error { return e.Err }

// IsListenError reports whether err is or wraps a ListenError.
func IsListenError(err error) bool {
	var le *ListenError
	return errors.As(err, &le)
}
