package main

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

func machineFacts() machine {
	m := machine{Cores: runtime.NumCPU(), Go: runtime.Version(), Kernel: readTrim("/proc/sys/kernel/osrelease")}
	for line := range strings.SplitSeq(readTrim("/proc/cpuinfo"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			m.CPU = strings.TrimSpace(v)
			break
		}
	}
	for line := range strings.SplitSeq(readTrim("/proc/meminfo"), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			m.MemTotal = kb << 10
		}
	}
	m.Load[0] = loadAverage()
	return m
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute averages.
func loadAverage() string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
