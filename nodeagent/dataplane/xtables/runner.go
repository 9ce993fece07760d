package xtables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
)

// Runner runs the iptables tools of one family and one backend. A
// dataplane's sync loop is its only caller; implementations need not be
// safe for concurrent use.
type Runner interface {
	Saver
	// Restore feeds data to iptables-restore with flags. It is as atomic
	// as iptables-restore: each table in data commits on its own. A
	// refused input is a *RestoreError carrying the reported line; a lock
	// timeout a *LockError.
	Restore(ctx context.Context, data []byte, flags ...string) error
	// EnsureRule inserts rule at the top of chain in table unless an
	// identical rule is already there somewhere. Idempotent.
	EnsureRule(ctx context.Context, table, chain string, rule ...string) error
}

// StreamRunner is a Runner that feeds iptables-restore its input as the
// input is written, so that the input is never whole in memory: at
// 250,000 endpoints it is over 70 MB, which the writer renders Service by
// Service. The real Runner is one; RestoreFrom gives other Runners (test
// fakes) the input whole.
type StreamRunner interface {
	Runner
	// RestoreFrom is Restore of what src writes; src.WriteTo runs once.
	// When it fails, the tool is killed before it reads the end of its
	// input, so nothing of a half-written input commits, and its error
	// is returned. Its other errors are Restore's.
	RestoreFrom(ctx context.Context, src io.WriterTo, flags ...string) error
}

// RestoreFrom feeds what src writes to r's iptables-restore with flags:
// as src writes it when r is a StreamRunner, else collected first and
// given to Restore.
func RestoreFrom(ctx context.Context, r Runner, src io.WriterTo, flags ...string) error {
	if sr, ok := r.(StreamRunner); ok {
		return sr.RestoreFrom(ctx, src, flags...)
	}
	var b bytes.Buffer
	if _, err := src.WriteTo(&b); err != nil {
		return err
	}
	return r.Restore(ctx, b.Bytes(), flags...)
}

// Options say which tools NewRunners runs and how.
type Options struct {
	// Family picks iptables or ip6tables.
	Family dataplane.Family
	// Backend is the backend whose tools run; BackendAuto (or "") means a
	// Runner for each backend whose tools are installed.
	Backend Backend
	// LockWait bounds the wait for the legacy xtables lock; 0 means
	// DefaultLockWait.
	LockWait time.Duration
	// CommandPrefix is prepended to every command, for example
	// {"ip", "netns", "exec", "node"} to program another network
	// namespace. Empty in production.
	CommandPrefix []string
}

// Validate returns what is wrong with o's backend and lock wait, joined;
// nil when nothing is. The family is the dataplane Settings' to check.
func (o Options) Validate() error {
	var errs []error
	switch o.Backend {
	case "", BackendAuto, BackendNFT, BackendLegacy:
	default:
		errs = append(errs, fmt.Errorf("backend %q: want auto, nft or legacy", o.Backend))
	}
	if o.LockWait < 0 {
		errs = append(errs, fmt.Errorf("lock wait %v is negative", o.LockWait))
	}
	return errors.Join(errs...)
}

// NewRunners returns the Runner of the real tools of o.Backend, or with
// BackendAuto one for each backend whose tools are installed. It fails
// when no backend's tools are installed.
func NewRunners(o Options) (map[Backend]Runner, error) {
	if o.LockWait == 0 {
		o.LockWait = DefaultLockWait
	}
	backends := []Backend{o.Backend}
	if o.Backend == BackendAuto || o.Backend == "" {
		backends = []Backend{BackendNFT, BackendLegacy}
	}
	runners := map[Backend]Runner{}
	var errs []error
	for _, b := range backends {
		r, err := newExecRunner(&o, b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		runners[b] = r
	}
	if len(runners) == 0 {
		return nil, errors.Join(errs...)
	}
	return runners, nil
}

// execRunner runs the real tools, optionally behind a command prefix
// (ip netns exec NAME) so tests can program a throwaway namespace.
type execRunner struct {
	restore, save, iptables tool.Tool
	family                  dataplane.Family
	backend                 Backend
	prefixed                bool
	// lockWait is passed as -w to legacy commands; the nft backend takes
	// no lock (nf_tables transactions serialise in the kernel).
	lockWait time.Duration

	mu  sync.Mutex // guards ipt
	ipt *goipt.IPTables
}

// newExecRunner checks that the tools of backend exist and returns a
// runner of them.
func newExecRunner(o *Options, backend Backend) (*execRunner, error) {
	bin := BinariesOf(o.Family, backend)
	r := &execRunner{family: o.Family, backend: backend, prefixed: len(o.CommandPrefix) > 0, lockWait: o.LockWait}
	var err error
	if r.restore, err = tool.New(o.CommandPrefix, bin.Restore); err != nil {
		return nil, err
	}
	if r.save, err = tool.New(o.CommandPrefix, bin.Save); err != nil {
		return nil, err
	}
	if r.iptables, err = tool.New(o.CommandPrefix, bin.IPTables); err != nil {
		return nil, err
	}
	return r, nil
}

// waitArgs returns "-w N" for legacy tools: without it a legacy command
// that finds the lock taken fails at once.
func (r *execRunner) waitArgs() []string {
	if r.backend != BackendLegacy || r.lockWait <= 0 {
		return nil
	}
	return []string{"-w", strconv.Itoa(r.waitSeconds())}
}

func (r *execRunner) waitSeconds() int { return max(1, int(r.lockWait/time.Second)) }

// lineRE finds the line iptables-restore blames: legacy says "line 6
// failed" or "Error occurred at line: 3", nft the same two forms.
var lineRE = regexp.MustCompile(`line:? (\d+)`)

// Restore implements Runner. Its stdout is discarded unread: with "-S"
// in the input it is a listing of the whole table.
func (r *execRunner) Restore(ctx context.Context, data []byte, flags ...string) error {
	return r.RestoreFrom(ctx, bytes.NewReader(data), flags...)
}

// RestoreFrom implements StreamRunner: src writes into the tool's stdin
// pipe while the tool parses, so rendering overlaps parsing too.
func (r *execRunner) RestoreFrom(ctx context.Context, src io.WriterTo, flags ...string) error {
	cmd := r.restore.Command(ctx, append(slices.Clone(flags), r.waitArgs()...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("running %s: %w", r.restore.Name(), err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return r.restoreFailure(cmd, err, "")
	}
	in := &pipeWriter{w: stdin}
	_, werr := src.WriteTo(in)
	if werr != nil && in.err == nil {
		// src failed, not the pipe: the tool must not see an end of
		// input and commit what it has. Killed first, then its stdin
		// closed, so that Wait cannot block on a child of the tool
		// (a command prefix's) still reading it.
		_ = cmd.Process.Kill()
		_ = stdin.Close()
		_ = cmd.Wait()
		return fmt.Errorf("writing %s input: %w", r.restore.Name(), werr)
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		return r.restoreFailure(cmd, err, stderr.String())
	}
	if werr != nil {
		// The tool succeeded without reading everything: it cannot have
		// applied the whole input.
		return fmt.Errorf("writing %s input: %w", r.restore.Name(), werr)
	}
	return nil
}

// restoreFailure types err, cmd's failure after printing stderr: a
// *LockError, a *MissingBinaryError or a *RestoreError.
func (r *execRunner) restoreFailure(cmd *exec.Cmd, err error, stderr string) error {
	err = tool.Failure(cmd, err, stderr)
	if le := lockError(err); le != nil {
		return le
	}
	return tool.RestoreFailure(r.restore.Name(), err, lineRE)
}

// pipeWriter writes to a tool's stdin and keeps the first failure, which
// tells the tool's early exit (a broken pipe) from its writer's failures.
type pipeWriter struct {
	w   io.Writer
	err error
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if err != nil && p.err == nil {
		p.err = err
	}
	return n, err
}

// Save implements Saver.
func (r *execRunner) Save(ctx context.Context, table string) ([]byte, error) {
	return r.save.Run(ctx, nil, "-t", table)
}

// EnsureRule implements Runner. Without a prefix it uses go-iptables, the
// library the rest of the ecosystem checks rules with; go-iptables cannot
// run behind a prefix, so with one the same -C/-I pair runs as commands.
func (r *execRunner) EnsureRule(ctx context.Context, table, chain string, rule ...string) error {
	if !r.prefixed {
		return r.ensureWithLibrary(ctx, table, chain, rule)
	}
	_, err := r.iptables.Run(ctx, nil, append(append(r.waitArgs(), "-t", table, "-C", chain), rule...)...)
	var ce *CommandError
	if err == nil || !errors.As(err, &ce) || ce.ExitCode != 1 {
		// Exit status 1 is "no such rule"; anything else is a failure.
		return classify(err)
	}
	_, err = r.iptables.Run(ctx, nil, append(append(r.waitArgs(), "-t", table, "-I", chain, "1"), rule...)...)
	return classify(err)
}

func (r *execRunner) ensureWithLibrary(ctx context.Context, table, chain string, rule []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ipt == nil {
		proto, timeout := goipt.ProtocolIPv4, 0
		if r.family == dataplane.IPv6 {
			proto = goipt.ProtocolIPv6
		}
		if r.backend == BackendLegacy && r.lockWait > 0 {
			timeout = r.waitSeconds()
		}
		ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(r.iptables.Name()), goipt.Timeout(timeout))
		if err != nil {
			return fmt.Errorf("initialising go-iptables with %s: %w", r.iptables.Name(), err)
		}
		r.ipt = ipt
	}
	ok, err := r.ipt.Exists(table, chain, rule...)
	if err != nil {
		return r.libraryError(err)
	}
	if ok {
		return nil
	}
	if err := r.ipt.Insert(table, chain, 1, rule...); err != nil {
		return r.libraryError(err)
	}
	return nil
}

// libraryError types a go-iptables error as the command errors are.
func (r *execRunner) libraryError(err error) error {
	var ge *goipt.Error
	if errors.As(err, &ge) {
		return classify(&CommandError{Args: []string{r.iptables.Name()}, ExitCode: ge.ExitStatus(), Stderr: ge.Error(), Err: err})
	}
	return err
}

// classify returns err, or a *LockError when the command behind it timed
// out on the xtables lock.
func classify(err error) error {
	if le := lockError(err); le != nil {
		return le
	}
	return err
}
