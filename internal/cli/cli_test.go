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
	defer func(v string) { gitVersion = v }(gitVersion)
	gitVersion = "v0.3.0-12-gabcdef012345-dirty"
	if got := Version(""); got != gitVersion {
		t.Errorf("Version with the build's git version = %q, want %q", got, gitVersion)
	}
	if got := Version("v1.2.3"); got != "v1.2.3" {
		t.Errorf("Version with a stamp and a git version = %q, want the stamp", got)
	}
}

func TestLogging(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		level string
		json  bool
		err   string
	}{
		{nil, "INFO", false, ""},
		{[]string{"--v=2"}, "INFO", false, ""},
		{[]string{"--v=4"}, "DEBUG", false, ""},
		{[]string{"--log-level=warn"}, "WARN", false, ""},
		{[]string{"--log-level=warn", "--v=0"}, "INFO", false, ""},
		{[]string{"--logging-format=json"}, "INFO", true, ""},
		{[]string{"--logging-format=yaml"}, "", false, "--logging-format"},
		{[]string{"--log-level=loud"}, "", false, "--log-level"},
		{[]string{"--v=-2"}, "", false, "--v"},
	} {
		l := DefaultLogging()
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		l.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := l.Validate()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: Validate = %v, want it to name %s", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if got := l.Leveled().String(); got != tc.level {
			t.Errorf("%q: level %s, want %s", tc.args, got, tc.level)
		}
		var b bytes.Buffer
		l.Logger(&b).Warn("hello")
		if isJSON := strings.HasPrefix(b.String(), "{"); isJSON != tc.json {
			t.Errorf("%q: wrote %q, want JSON %v", tc.args, b.String(), tc.json)
		}
	}
}
