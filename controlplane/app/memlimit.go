package app

import (
	"log/slog"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// memoryLimitRatio is the share of the container's memory limit given to
// the Go heap's soft limit. The rest is for what the kernel charges to
// the container but the Go runtime does not count: socket buffers of
// thousands of agent connections and the page cache of anything read.
// A soft limit equal to the hard one leaves the collector no room to
// act before the OOM killer does.
const memoryLimitRatio = 0.9

// SetMemoryLimit sets the Go heap's soft limit to memoryLimitRatio of the
// memory limit of the process's cgroup (v1 or v2), the container's
// limits.memory in a pod, and returns it. An explicit GOMEMLIMIT wins,
// and no limit leaves none. It logs what it did or why it could not.
func SetMemoryLimit(log *slog.Logger) int64 {
	return setMemoryLimit(log, memlimit.FromCgroup)
}

func setMemoryLimit(log *slog.Logger, provider memlimit.Provider) int64 {
	limit, _ := memlimit.Set(
		memlimit.WithRatio(memoryLimitRatio),
		memlimit.WithProvider(provider),
		memlimit.WithLogger(log),
	)
	return limit
}
