package xtables

import "context"

// Tools is what a dataplane writes its iptables rules through: a Runner
// per candidate backend until the first call of Runner detects which one
// the node uses, that Runner from then on. Not safe for concurrent use: a
// dataplane's sync loop owns it.
type Tools struct {
	ours    string
	runners map[Backend]Runner

	backend Backend
	r       Runner
}

// NewTools returns Tools choosing among runners: the one of backend, or
// with BackendAuto (or "") the one DetectBackend picks given ours, the
// dataplane's own nat chain.
func NewTools(ours string, backend Backend, runners map[Backend]Runner) *Tools {
	t := &Tools{ours: ours, runners: runners}
	if backend != BackendAuto && backend != "" {
		t.backend, t.r = backend, runners[backend]
	}
	return t
}

// Runner returns the Runner of the backend in use, detecting the backend
// at the first call. A failed detection is retried at the next call.
func (t *Tools) Runner(ctx context.Context) (Runner, error) {
	if t.r == nil {
		// A backend without a runner is a nil Saver: not installed.
		b, err := DetectBackend(ctx, t.ours, t.runners[BackendNFT], t.runners[BackendLegacy])
		if err != nil {
			return nil, err
		}
		t.backend, t.r = b, t.runners[b]
	}
	return t.r, nil
}

// Backend returns the backend in use; "" until Runner detected it.
func (t *Tools) Backend() Backend { return t.backend }

// Cleanup removes the chains owns accepts from every backend it has a
// runner for (see CleanupAll), whichever one it uses: built for one
// backend, it touches only that one.
func (t *Tools) Cleanup(ctx context.Context, owns Owner) error {
	return CleanupAll(ctx, t.runners, owns)
}

// Leftovers lists what Cleanup would remove (see LeftoversAll).
func (t *Tools) Leftovers(ctx context.Context, owns Owner) ([]string, error) {
	return LeftoversAll(ctx, t.runners, owns)
}
