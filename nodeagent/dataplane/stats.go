package dataplane

import "time"

// SyncStats are the counts every backend keeps of its syncs, for the
// agent's metrics. Each backend's Stats embeds them beside its own.
type SyncStats struct {
	// FullSyncs and PartialSyncs count successful syncs (a partial sync
	// that had to become full counts as full).
	FullSyncs, PartialSyncs uint64
	// LastSync is when the last successful Sync ended, and
	// LastSyncDuration how long it took.
	LastSync         time.Time
	LastSyncDuration time.Duration
	// Services is the number of Services of the family in force.
	Services int
}

// Succeeded records a successful sync, full or partial, that started at
// start and left services Services in force.
func (s *SyncStats) Succeeded(full bool, start time.Time, services int) {
	if full {
		s.FullSyncs++
	} else {
		s.PartialSyncs++
	}
	s.LastSync = time.Now()
	s.LastSyncDuration = s.LastSync.Sub(start)
	s.Services = services
}
