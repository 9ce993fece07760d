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
	// errTooManyFailures: the caller's address failed to authenticate too
	// often lately; it is refused before its token costs a review.
	errTooManyFailures = errors.New("too many failed authentications")
)

// What a caller is told when refused before it proved who it is: the
// code, and nothing of the API server's answer or of this replica's
// settings, which go to the log.
var (
	statusUnauthenticated = status.Error(codes.Unauthenticated, "unauthenticated")
	statusUnavailable     = status.Error(codes.Unavailable, "could not check credentials; retry later")
	statusTooManyFailures = status.Error(codes.ResourceExhausted, "too many failed authentications from this address; retry later")
)

// toStatus maps an error to the gRPC status the caller sees. Errors that
// are neither sentinel are the API server's or our own (a failed or
// timed-out review): Unavailable, so agents retry with their backoff.
// Only PermissionDenied, which an authenticated caller gets, says why.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case status.Code(err) != codes.Unknown:
		return err
	case errors.Is(err, errUnauthenticated):
		return statusUnauthenticated
	case errors.Is(err, errTooManyFailures):
		return statusTooManyFailures
	case errors.Is(err, errDenied):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return statusUnavailable
}

// isRefusal tells a refused token or identity from a failure to check it.
func isRefusal(err error) bool {
	return errors.Is(err, errUnauthenticated) || errors.Is(err, errDenied) || errors.Is(err, errTooManyFailures)
}
