package dataplane

import "errors"

// ErrInvalidConfig is wrapped by every configuration a dataplane refuses:
// Settings.Validate's findings and each backend's own.
var ErrInvalidConfig = errors.New("invalid dataplane config")
