// Package memlimit gives a binary's Go heap a soft limit below its
// container's memory limit, so the collector works harder before the
// kernel's OOM killer acts.
package memlimit

import (
	"log/slog"

	automemlimit "github.com/KimMachineGun/automemlimit/memlimit"
)

// memoryLimitRatio is the share of the container's memory limit given to
// the Go heap's soft limit. The rest is for what the kernel charges to
// the container but the Go runtime does not count: the control plane's
// socket buffers of thousands of agent connections, the agent's
// iptables-restore processes, and the page cache of anything read.
// A soft limit equal to the hard one leaves the collector no room to
// act before the OOM killer does.
const memoryLimitRatio = 0.9

// Set sets the Go heap's soft limit to memoryLimitRatio of the
// memory limit of the process's cgroup (v1 or v2), the container's
// limits.memory in a pod, and returns it. An explicit GOMEMLIMIT wins,
// and no limit leaves none. It logs what it did or why it could not.
func Set(log *slog.Logger) int64 {
	return set(log, automemlimit.FromCgroup)
}

func set(log *slog.Logger, provider automemlimit.Provider) int64 {
	limit, _ := automemlimit.Set(
		automemlimit.WithRatio(memoryLimitRatio),
		automemlimit.WithProvider(provider),
		automemlimit.WithLogger(log),
	)
	return limit
}
