package dptest

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EnvInts returns the comma-separated positive numbers in environment
// variable name, or def when it is unset: benchmark sizes and repetitions.
func EnvInts(b *testing.B, name string, def []int) []int {
	b.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("%s: %q", name, s)
		}
		out = append(out, n)
	}
	return out
}

// Median returns the median of ds.
func Median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// Millis formats d in whole milliseconds, for benchmark tables.
func Millis(d time.Duration) string {
	return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
}
