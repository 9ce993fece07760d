package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           []string
		exit           bool
		code           int
		stdout, stderr string // substrings
	}{
		{"flags", []string{"--sync-period=5s"}, false, 0, "", ""},
		{"unknown flag", []string{"--v=2"}, true, 2, "", "unknown flag: --v"},
		{"unparsable value", []string{"--sync-period=abc"}, true, 2, "", `invalid argument "abc" for "--sync-period"`},
		{"stray argument", []string{"status"}, true, 2, "", `unexpected argument "status"`},
		{"version", []string{"--version"}, true, 0, "agent v1.2.3\n", ""},
		{"help", []string{"--help"}, true, 0, "--sync-period", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
			fs.Duration("sync-period", time.Second, "Interval between full syncs.")
			var stdout, stderr bytes.Buffer
			exit, code := Parse(fs, tc.args, "v1.2.3", &stdout, &stderr)
			if exit != tc.exit || code != tc.code {
				t.Fatalf("Parse(%q) = %v, %d; want %v, %d (stderr %q)", tc.args, exit, code, tc.exit, tc.code, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stdout %q, stderr %q; want %q and %q in them", stdout.String(), stderr.String(), tc.stdout, tc.stderr)
			}
			if tc.code == 2 && !strings.Contains(stderr.String(), "Usage of agent:") {
				t.Errorf("a mistake without the usage: %q", stderr.String())
			}
		})
	}
}

func TestVersion(t *testing.T) {
	if got := Version("v1.2.3"); got != "v1.2.3" {
		t.Errorf("Version with a stamp = %q", got)
	}
	if got := Version(""); got == "" {
		t.Error("Version without a stamp is empty, want the build's or dev")
	}
}
