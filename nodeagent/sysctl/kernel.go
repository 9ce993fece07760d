package sysctl

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Kernel reads and writes the integer files under /proc/sys and /sys that
// Apply uses. Paths are absolute. Safe for concurrent use: each call opens
// the file anew. Reads and writes of /proc/sys/net act on the network
// namespace of the calling thread.
type Kernel interface {
	// ReadInt returns the integer in the file at path.
	ReadInt(path string) (int, error)
	// WriteInt writes v to the file at path. A file that cannot be written
	// here returns an error wrapping ErrReadOnly.
	WriteInt(path string, v int) error
	// NumCPU returns the number of CPUs of the machine, not of this
	// process's affinity mask.
	NumCPU() int
}

// procFS is the Kernel of this machine.
type procFS struct{}

func (procFS) ReadInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", path, err)
	}
	return v, nil
}

func (procFS) WriteInt(path string, v int) error {
	// Not os.WriteFile: it would try to create a missing file, and a
	// sysctl that does not exist must fail as such.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		_, err = f.WriteString(strconv.Itoa(v))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	switch {
	case err == nil:
		return nil
	case readOnly(err):
		return fmt.Errorf("writing %d to %s: %w: %w", v, path, ErrReadOnly, err)
	}
	return fmt.Errorf("writing %d to %s: %w", v, path, err)
}

// NumCPU counts the online CPUs in sysfs rather than trusting
// runtime.NumCPU, which counts the affinity mask: a container pinned to
// two CPUs of a 64-CPU host would size the host's table for two
// (kubernetes#99225, which upstream avoids the same way).
func (procFS) NumCPU() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	if n := countCPUList(strings.TrimSpace(string(b))); n > 0 {
		return n
	}
	return runtime.NumCPU()
}

// countCPUList counts the CPUs of a kernel CPU list such as "0-3,8,10-11";
// 0 when it does not parse.
func countCPUList(s string) int {
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
