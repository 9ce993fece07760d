package memlimit

import (
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"testing"

	automemlimit "github.com/KimMachineGun/automemlimit/memlimit"
)

// TestSetLeavesHeadroom checks that a 2 GiB container limit
// gives the Go heap a soft limit with room below it: a soft limit equal
// to the container's lets the kernel OOM-kill before the collector acts.
func TestSetLeavesHeadroom(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	unsetenv(t, "GOMEMLIMIT")
	t.Setenv("AUTOMEMLIMIT", "")
	unsetenv(t, "AUTOMEMLIMIT")
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })

	container := int64(2 << 30)
	got := set(slog.New(slog.NewTextHandler(io.Discard, nil)), automemlimit.Limit(uint64(container)))
	if got != debug.SetMemoryLimit(-1) {
		t.Fatalf("returned %d, runtime has %d", got, debug.SetMemoryLimit(-1))
	}
	if want := int64(float64(container) * memoryLimitRatio); got != want {
		t.Errorf("soft limit %d, want %d (%.0f%% of %d)", got, want, memoryLimitRatio*100, container)
	}
	if container-got < 128<<20 {
		t.Errorf("soft limit %d leaves %d bytes under the container's %d, want at least 128 MiB", got, container-got, container)
	}
}

// TestSetKeepsExplicit checks that an operator's GOMEMLIMIT
// wins over the cgroup's.
func TestSetKeepsExplicit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "1GiB")
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	debug.SetMemoryLimit(1 << 30)
	if got := set(slog.New(slog.NewTextHandler(io.Discard, nil)), automemlimit.Limit(4<<30)); got != 1<<30 {
		t.Errorf("soft limit %d, want the explicit 1 GiB", got)
	}
}

// unsetenv removes key for the rest of the test; t.Setenv beforehand
// makes the test restore it.
func unsetenv(t *testing.T, key string) {
	t.Helper()
	if err := os.Unsetenv(key); err != nil {
		t.Fatal(err)
	}
}
