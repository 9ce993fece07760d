// Package cli reads a binary's command line as Kubernetes components do:
// an unknown flag, a value that does not parse or a stray argument is
// named, followed by the usage, and exits 2; --version prints the build's
// version. Both binaries use it; it knows nothing of either.
package cli

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/pflag"
)

// Parse parses args into fs, which has the binary's flags; it adds
// --version, which prints version. When the binary should exit instead of
// running, exit is set and code is its exit status: 0 after --help or
// --version, 2 after a mistake, which it has printed with the usage on
// stderr.
func Parse(fs *pflag.FlagSet, args []string, version string, stdout, stderr io.Writer) (exit bool, code int) {
	printVersion := fs.Bool("version", false, "Print the version and exit.")
	fs.SetOutput(stdout) // --help's usage
	err := fs.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		return true, 0
	case err != nil:
		return true, Usage(fs, stderr, err)
	case fs.NArg() > 0:
		return true, Usage(fs, stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	case *printVersion:
		_, _ = fmt.Fprintf(stdout, "%s %s\n", fs.Name(), version)
		return true, 0
	}
	return false, 0
}

// Usage prints err and fs's usage on w and returns 2, the exit status of a
// command line mistake.
func Usage(fs *pflag.FlagSet, w io.Writer, err error) int {
	_, _ = fmt.Fprintf(w, "%s: %v\nUsage of %s:\n%s", fs.Name(), err, fs.Name(), fs.FlagUsages())
	return 2
}

// gitVersion is the version `make build` and the images stamp into both
// binaries, as Kubernetes components stamp theirs: `git describe --tags
// --always --dirty`, through
// -ldflags '-X github.com/proxyplane/proxyplane/internal/cli.gitVersion=...'.
// The Go toolchain's own VCS stamping cannot stand in for it: GOFLAGS may
// turn it off (-buildvcs=false), and a build from a source archive has
// no repository to read.
var gitVersion string

// Version returns the build's version: stamped, when the caller was
// given one, else gitVersion, else the module version when built from a
// tagged module, else the VCS revision the Go toolchain recorded (with
// "+dirty" for uncommitted changes), else "dev".
func Version(stamped string) string {
	if stamped != "" {
		return stamped
	}
	if gitVersion != "" {
		return gitVersion
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}
