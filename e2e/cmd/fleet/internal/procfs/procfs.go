// Package procfs reads what the fleet harness measures of a process from
// /proc: CPU time, peak and current resident memory, and finds a process
// by its command line. Linux only, like the harness.
package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every
// Linux architecture Go supports (the kernel fixes it for user space).
const clockTick = 100

// CPU returns the process's user plus system CPU time.
func CPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading stat: %w", err)
	}
	// The command name, field 2, may hold spaces and parentheses: fields
	// are counted after its closing parenthesis.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	// After the name: state is field 3, utime 14 and stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTick, nil
}

// Memory is a process's resident memory.
type Memory struct {
	// RSS is VmRSS; HWM is VmHWM, the peak since start or the last
	// ResetPeak.
	RSS, HWM uint64
}

// Mem reads VmRSS and VmHWM.
func Mem(pid int) (Memory, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, fmt.Errorf("reading status: %w", err)
	}
	var m Memory
	for line := range strings.SplitSeq(string(data), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("parsing %s: %w", name, err)
		}
		if name == "VmRSS" {
			m.RSS = kb << 10
		} else {
			m.HWM = kb << 10
		}
	}
	return m, nil
}

// ResetPeak sets the process's VmHWM to its current RSS (writing 5 to
// clear_refs), so that the next Mem reports the peak since now.
func ResetPeak(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("resetting peak RSS: %w", err)
	}
	return nil
}

// FindByArg returns the pid of a process whose command line holds every
// one of args. The API server runs as a child of e2e/cluster, which does
// not expose its pid; its --dir argument identifies it.
func FindByArg(args ...string) (int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, fmt.Errorf("listing /proc: %w", err)
	}
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue // exited meanwhile
		}
		argv := strings.Split(string(data), "\x00")
		if containsAll(argv, args) {
			return strconv.Atoi(filepath.Base(d))
		}
	}
	return 0, fmt.Errorf("no process with arguments %q: %w", args, os.ErrNotExist)
}

func containsAll(argv, want []string) bool {
	for _, w := range want {
		found := false
		for _, a := range argv {
			if a == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// RaiseNoFile raises the open-files limit: thousands of agents hold a TCP
// connection each. It raises the hard limit too where allowed (root), and
// never lowers anything. Children inherit it.
func RaiseNoFile(want uint64) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	if l.Cur >= want {
		return nil
	}
	raised := syscall.Rlimit{Cur: want, Max: max(l.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		if !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", want, err)
		}
		// Not root: as far as the hard limit allows.
		raised = syscall.Rlimit{Cur: l.Max, Max: l.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return fmt.Errorf("raising RLIMIT_NOFILE to %d: %w", l.Max, err)
		}
	}
	return nil
}
