package auth

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors, each mapped to one gRPC code by toStatus.
var (
	// errUnauthenticated: no token, a malformed one, or one the API server
	// does not accept for the audience asked (expired, unknown, wrong
	// audience).
	errUnauthenticated = errors.New("unauthenticated")
	// errDenied: a valid token whose identity may not do this (another
	// ServiceAccount, another node, no right to list EndpointSlices).
	errDenied = errors.New("permission denied")
)

// toStatus maps an error to the gRPC status the caller sees. Errors that
// are neither sentinel are the API server's or our own (a failed or
// timed-out review): Unavailable, so agents retry with their backoff.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case status.Code(err) != codes.Unknown:
		return err
	case errors.Is(err, errUnauthenticated):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, errDenied):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

// isRefusal tells a refused token or identity from a failure to check it.
func isRefusal(err error) bool {
	return errors.Is(err, errUnauthenticated) || errors.Is(err, errDenied)
}
