// Package tool runs the command-line tools the iptables and IPVS
// dataplanes program the kernel with (the iptables family, ipset),
// optionally behind a command prefix that enters a network namespace, and
// types their failures. Package xtables re-exports the error types with
// their predicates: they are part of the dataplanes' API.
package tool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// CommandError is a failed command.
type CommandError struct {
	// Args is the command line, prefix included.
	Args []string
	// ExitCode is the process exit code, -1 when it did not exit.
	ExitCode int
	// Stderr is what the command printed.
	Stderr string
	// Err is the process error.
	Err error
}

// Error describes the command and its first line of stderr.
func (e *CommandError) Error() string {
	s := fmt.Sprintf("%s: %v", strings.Join(e.Args, " "), e.Err)
	if st := strings.TrimSpace(e.Stderr); st != "" {
		s += ": " + FirstLine(st)
	}
	return s
}

// Unwrap returns the process error.
func (e *CommandError) Unwrap() error { return e.Err }

// MissingBinaryError says a tool is not installed: ipset (package ipset)
// or one of the iptables tools (package iptables, which on Debian and
// derivatives brings both the legacy and the nft flavours).
type MissingBinaryError struct {
	// Name is the binary looked for.
	Name string
	// Err is the lookup error.
	Err error
}

// Error names the missing tool and the package that provides it.
func (e *MissingBinaryError) Error() string {
	pkg := "iptables"
	if e.Name == "ipset" {
		pkg = "ipset"
	}
	return fmt.Sprintf("%s not found (install %s): %v", e.Name, pkg, e.Err)
}

// Unwrap returns the lookup error.
func (e *MissingBinaryError) Unwrap() error { return e.Err }

// Failure classifies err, from running cmd, which printed stderr: a
// *MissingBinaryError when the binary was not found, else a
// *CommandError.
func Failure(cmd *exec.Cmd, err error, stderr string) error {
	if errors.Is(err, exec.ErrNotFound) {
		return &MissingBinaryError{Name: cmd.Args[0], Err: err}
	}
	code := -1
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	}
	return &CommandError{Args: cmd.Args, ExitCode: code, Stderr: stderr, Err: err}
}

// RestoreError is a failed restore (iptables-restore, ipset restore): the
// tool refused the input. How much of the input took effect is the tool's
// matter (see the dataplane's README).
type RestoreError struct {
	// Tool is the command that ran, as "iptables-nft-restore" or
	// "ipset restore".
	Tool string
	// Line is the failing input line the tool reported, 0 when it named
	// none.
	Line int
	// Key is the Service whose rules hold Line, "" when the line belongs
	// to no single Service or the dataplane does not know.
	Key string
	// Rule is the text of Line, when known.
	Rule string
	// Stderr is what the tool printed.
	Stderr string
	// Err is the process error.
	Err error
}

// Error describes the failure: tool, line, Service, rule and stderr.
func (e *RestoreError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s failed", e.Tool)
	if e.Line > 0 {
		fmt.Fprintf(&b, " at line %d", e.Line)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " (service %s)", e.Key)
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, " %q", e.Rule)
	}
	if s := strings.TrimSpace(e.Stderr); s != "" {
		fmt.Fprintf(&b, ": %s", FirstLine(s))
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns the process error.
func (e *RestoreError) Unwrap() error { return e.Err }

// RestoreFailure turns err, a restore's failure, into a *RestoreError of
// name carrying the line lineRE (whose first group is the number) finds
// in the tool's stderr. Other errors (a missing binary) are returned as
// they are.
func RestoreFailure(name string, err error, lineRE *regexp.Regexp) error {
	var ce *CommandError
	if !errors.As(err, &ce) {
		return err
	}
	re := &RestoreError{Tool: name, Stderr: ce.Stderr, Err: ce.Err}
	if m := lineRE.FindStringSubmatch(ce.Stderr); m != nil {
		re.Line, _ = strconv.Atoi(m[1])
	}
	return re
}

// WithRule completes a *RestoreError in err with the text of the line it
// blames in input, the restore's input, and returns err.
func WithRule(err error, input []byte) error {
	var re *RestoreError
	if !errors.As(err, &re) || re.Line <= 0 {
		return err
	}
	for i := 1; len(input) > 0; i++ {
		line, rest, _ := bytes.Cut(input, []byte("\n"))
		if i == re.Line {
			re.Rule = string(line)
			break
		}
		input = rest
	}
	return err
}

// FirstLine returns s up to its first newline.
func FirstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Tool is one tool, optionally behind a command prefix (ip netns exec
// NAME, nsenter --net=PATH), which only switches namespaces: the tool
// still comes from this host's filesystem, so the lookup is the same.
type Tool struct {
	prefix []string
	name   string
}

// New checks that the tool name and the prefix's command are installed.
func New(prefix []string, name string) (Tool, error) {
	for _, bin := range append(slices.Clone(prefix[:min(1, len(prefix))]), name) {
		if _, err := exec.LookPath(bin); err != nil {
			return Tool{}, &MissingBinaryError{Name: bin, Err: err}
		}
	}
	return Tool{prefix: slices.Clone(prefix), name: name}, nil
}

// Name returns the tool's name, without the prefix.
func (t Tool) Name() string { return t.name }

// Command returns the command running the tool with args.
func (t Tool) Command(ctx context.Context, args ...string) *exec.Cmd {
	argv := append(slices.Clone(t.prefix), t.name)
	argv = append(argv, args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// Run runs the tool with stdin (none when nil) and returns its stdout, or
// the Failure.
func (t Tool) Run(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := t.Command(ctx, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, Failure(cmd, err, stderr.String())
	}
	return stdout.Bytes(), nil
}
