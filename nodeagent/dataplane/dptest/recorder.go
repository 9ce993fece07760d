package dptest

import (
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// Recorder is a dataplane.Observer that keeps every SyncResult, for tests
// that check what kind of syncs ran and which failed. Not safe for
// concurrent use: a Driver reports on its Sync caller's goroutine.
type Recorder struct {
	Results []dataplane.SyncResult
}

// Observe implements dataplane.Observer; pass r.Observe to a constructor.
func (r *Recorder) Observe(res dataplane.SyncResult) { r.Results = append(r.Results, res) }

// Counts returns how many of family's syncs (every family's when family is
// 0) succeeded full or partial, and how many failed.
func (r *Recorder) Counts(family dataplane.Family) (full, partial, failed int) {
	for _, res := range r.Results {
		switch {
		case family != 0 && res.Family != family:
		case res.Err != nil:
			failed++
		case res.Full:
			full++
		default:
			partial++
		}
	}
	return full, partial, failed
}

// Count returns how many syncs were full (or partial) and failed (or
// succeeded).
func (r *Recorder) Count(full, failed bool) int {
	n := 0
	for _, res := range r.Results {
		if res.Full == full && (res.Err != nil) == failed {
			n++
		}
	}
	return n
}

// Last returns the last SyncResult, failing the test when there is none.
func (r *Recorder) Last(tb testing.TB) dataplane.SyncResult {
	tb.Helper()
	if len(r.Results) == 0 {
		tb.Fatal("no sync was observed")
	}
	return r.Results[len(r.Results)-1]
}
