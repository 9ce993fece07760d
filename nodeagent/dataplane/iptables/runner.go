package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// runner runs the iptables tools of one family and one backend. The
// Dataplane's sync loop is its only caller; implementations need not be
// safe for concurrent use.
type runner interface {
	// Restore feeds data to iptables-restore with flags. It is as atomic
	// as iptables-restore: each table in data commits on its own. A
	// refused input is a *RestoreError carrying the reported line.
	Restore(ctx context.Context, data []byte, flags ...string) error
	// Save returns iptables-save's dump of table.
	Save(ctx context.Context, table string) ([]byte, error)
	// EnsureRule inserts rule at the top of chain in table unless an
	// identical rule is already there somewhere. Idempotent.
	EnsureRule(ctx context.Context, table, chain string, rule ...string) error
}

// binaries names the tools of one family and backend.
type binaries struct {
	restore, save, iptables string
}

// binaryNames returns the tool names: the explicitly flavoured ones
// (iptables-nft-restore, ip6tables-legacy-save...), which Debian, Ubuntu,
// Fedora and the iptables-wrapper images all install, so that the plain
// names' alternatives setting cannot send the rules to the wrong backend.
func binaryNames(family Family, backend Backend) binaries {
	base := "iptables"
	if family == IPv6 {
		base = "ip6tables"
	}
	flavour := base + "-" + string(backend)
	return binaries{restore: flavour + "-restore", save: flavour + "-save", iptables: flavour}
}

// execRunner runs the real tools, optionally behind a command prefix
// (ip netns exec NAME) so tests can program a throwaway namespace.
type execRunner struct {
	prefix  []string
	bin     binaries
	family  Family
	backend Backend
	// lockWait is passed as -w to legacy commands; the nft backend takes
	// no lock (nf_tables transactions serialise in the kernel).
	lockWait time.Duration

	mu  sync.Mutex // guards ipt
	ipt *goipt.IPTables
}

// newExecRunner checks that the tools exist and returns a runner. With a
// prefix the tools still run from this host's filesystem (ip netns exec
// only switches namespaces), so the lookup is the same.
func newExecRunner(cfg *Config, backend Backend) (*execRunner, error) {
	bin := binaryNames(cfg.Family, backend)
	for _, name := range []string{bin.restore, bin.save, bin.iptables} {
		if _, err := exec.LookPath(name); err != nil {
			return nil, &MissingBinaryError{Name: name, Err: err}
		}
	}
	if len(cfg.CommandPrefix) > 0 {
		if _, err := exec.LookPath(cfg.CommandPrefix[0]); err != nil {
			return nil, &MissingBinaryError{Name: cfg.CommandPrefix[0], Err: err}
		}
	}
	return &execRunner{prefix: slices.Clone(cfg.CommandPrefix), bin: bin, family: cfg.Family, backend: backend, lockWait: cfg.LockWait}, nil
}

// waitArgs returns "-w N" for legacy tools: without it a legacy command
// that finds the lock taken fails at once.
func (r *execRunner) waitArgs() []string {
	if r.backend != BackendLegacy || r.lockWait <= 0 {
		return nil
	}
	return []string{"-w", strconv.Itoa(max(1, int(r.lockWait/time.Second)))}
}

func (r *execRunner) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append(slices.Clone(r.prefix), name)
	argv = append(argv, args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

// Restore implements runner.
func (r *execRunner) Restore(ctx context.Context, data []byte, flags ...string) error {
	args := append(slices.Clone(flags), r.waitArgs()...)
	cmd := r.command(ctx, r.bin.restore, args...)
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if lerr := lockError(cmd, err, stderr.String()); lerr != nil {
			return lerr
		}
		return &RestoreError{Binary: r.bin.restore, Line: reportedLine(stderr.String()), Stderr: stderr.String(), Err: err}
	}
	return nil
}

// Save implements runner.
func (r *execRunner) Save(ctx context.Context, table string) ([]byte, error) {
	cmd := r.command(ctx, r.bin.save, "-t", table)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, tool.Failure(cmd, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// EnsureRule implements runner. Without a prefix it uses go-iptables, the
// library the rest of the ecosystem checks rules with; go-iptables cannot
// run behind a prefix, so with one the same -C/-I pair runs as commands.
func (r *execRunner) EnsureRule(ctx context.Context, table, chain string, rule ...string) error {
	if len(r.prefix) == 0 {
		return r.ensureWithLibrary(ctx, table, chain, rule)
	}
	check := r.command(ctx, r.bin.iptables, append(append(r.waitArgs(), "-t", table, "-C", chain), rule...)...)
	var stderr bytes.Buffer
	check.Stderr = &stderr
	err := check.Run()
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		if lerr := lockError(check, err, stderr.String()); lerr != nil {
			return lerr
		}
		return tool.Failure(check, err, stderr.String())
	}
	insert := r.command(ctx, r.bin.iptables, append(append(r.waitArgs(), "-t", table, "-I", chain, "1"), rule...)...)
	stderr.Reset()
	insert.Stderr = &stderr
	if err := insert.Run(); err != nil {
		if lerr := lockError(insert, err, stderr.String()); lerr != nil {
			return lerr
		}
		return tool.Failure(insert, err, stderr.String())
	}
	return nil
}

func (r *execRunner) ensureWithLibrary(ctx context.Context, table, chain string, rule []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ipt == nil {
		proto, timeout := goipt.ProtocolIPv4, 0
		if r.family == IPv6 {
			proto = goipt.ProtocolIPv6
		}
		if r.backend == BackendLegacy && r.lockWait > 0 {
			timeout = max(1, int(r.lockWait/time.Second))
		}
		ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(r.bin.iptables), goipt.Timeout(timeout))
		if err != nil {
			return fmt.Errorf("initialising go-iptables with %s: %w", r.bin.iptables, err)
		}
		r.ipt = ipt
	}
	ok, err := r.ipt.Exists(table, chain, rule...)
	if err != nil {
		return libraryError(r.bin.iptables, err)
	}
	if ok {
		return nil
	}
	if err := r.ipt.Insert(table, chain, 1, rule...); err != nil {
		return libraryError(r.bin.iptables, err)
	}
	return nil
}

// libraryError classifies a go-iptables error like the command errors.
func libraryError(binary string, err error) error {
	var ge *goipt.Error
	if errors.As(err, &ge) {
		ce := &CommandError{Args: []string{binary}, ExitCode: ge.ExitStatus(), Stderr: ge.Error(), Err: err}
		if ge.ExitStatus() == exitLockHeld && isLockMessage(ge.Error()) {
			return &LockError{Err: ce}
		}
		return ce
	}
	return err
}

func lockError(cmd *exec.Cmd, err error, stderr string) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == exitLockHeld && isLockMessage(stderr) {
		return &LockError{Err: tool.Failure(cmd, err, stderr)}
	}
	return nil
}

// lineRE finds the line iptables-restore blames: legacy says "line 6
// failed" or "Error occurred at line: 3", nft the same two forms.
var lineRE = regexp.MustCompile(`line:? (\d+)`)

func reportedLine(stderr string) int {
	m := lineRE.FindStringSubmatch(stderr)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
