package dptest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Golden compares got with testdata/name.golden, or writes it there when
// update is set (the test package's -update flag). Review the diff of an
// update: it is the change under review.
func Golden(tb testing.TB, name, got string, update bool) {
	tb.Helper()
	path := filepath.Join("testdata", name+".golden")
	if update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			tb.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("reading golden (run with -update to create it): %v", err)
	}
	if got != string(want) {
		tb.Errorf("%s differs (run with -update and review the diff):\n%s", path, LineDiff(string(want), got))
	}
}

// LineDiff is a minimal line diff for failure messages.
func LineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want: %s\n  got:  %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}
