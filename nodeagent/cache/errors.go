package cache

import "errors"

// ErrCorrupt is wrapped by every error about a cache's content: a file
// that is not a bbolt database, a bbolt panic or fault while reading it,
// an unknown schema, a missing key, an entry that does not decode, or a
// table that does not validate. Open moves such a file aside; Load and
// OpenReadOnly return it.
var ErrCorrupt = errors.New("corrupt cache")

// ErrLocked is wrapped by the error of an open that could not get the
// file's lock in time: another process, usually a running agent, holds it.
var ErrLocked = errors.New("cache locked by another process")
