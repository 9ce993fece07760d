package box

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopTimeout bounds a graceful stop. The control plane cuts its streams
// after 5 s and shuts its HTTP server down within 5 s more; the agent
// stops its servers within 5 s. Past it the process is killed.
const stopTimeout = 20 * time.Second

// Process is one binary of the box (a control plane replica or a node
// agent) run inside a network namespace through "ip netns exec", which
// execs the binary in place, so signals reach it. It can be stopped,
// killed and started again with the same command line; every run appends
// to the same log file. Its methods are safe for concurrent use, but a
// test drives each process from one goroutine.
type Process struct {
	name    string
	ns      string
	argv    []string
	env     []string
	logPath string

	// mu guards cmd, exited, waitErr and argv (which KubeProxy.SetMode
	// replaces while the process is stopped).
	mu sync.Mutex
	// cmd is the running process, nil when stopped.
	cmd *exec.Cmd
	// exited is closed, and waitErr set, once cmd has been reaped.
	exited  chan struct{}
	waitErr error
}

// newProcess returns a stopped process running argv in ns, with env
// (NAME=value, the container's) added to the box's own environment,
// whose PATH finds iptables and the like.
func newProcess(name, ns, logPath string, argv, env []string) *Process {
	return &Process{name: name, ns: ns, argv: argv, env: env, logPath: logPath}
}

// Name returns the process's name in the box, such as "controlplane-0" or
// "nodeagent-node-1".
func (p *Process) Name() string { return p.name }

// Args returns the binary and its arguments, without the namespace
// prefix.
func (p *Process) Args() []string { return append([]string(nil), p.argv...) }

// LogPath returns the file collecting the process's stdout and stderr
// across restarts.
func (p *Process) LogPath() string { return p.logPath }

// Running reports whether the process has been started and not yet
// reaped.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Start starts the process; it is an error if it is running. It returns
// once the process has been created: callers wait for readiness
// themselves, each binary having its own sign of it.
func (p *Process) Start() error { return p.StartWith() }

// StartWith is Start with env (NAME=value) added for this run only, such
// as a failpoint that makes it kill itself.
func (p *Process) StartWith(env ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return fmt.Errorf("%s is already running (pid %d)", p.name, p.cmd.Process.Pid)
		}
	}
	log, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening %s's log: %w", p.name, err)
	}
	defer func() { _ = log.Close() }() // the child holds its own descriptor
	// The marker separates runs in the log, so a failure's tail shows
	// which run said what.
	if _, err := fmt.Fprintf(log, "=== %s: starting %s in %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.argv, " "), p.ns, strings.Join(env, " ")); err != nil {
		return fmt.Errorf("writing %s's log: %w", p.name, err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.ns}, p.argv...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(append(os.Environ(), p.env...), env...)
	// The kernel kills the process if the test binary dies without its
	// cleanups (a -timeout panic), so nothing outlives the run holding
	// ports or rules. "ip netns exec" keeps the setting across its exec.
	// Its own process group keeps a terminal's Ctrl-C (SIGINT to the
	// foreground group) for the box's owner, which stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited, p.waitErr = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()
	return nil
}

// Run starts the process and waits for it to exit, as an init container
// runs: an exit status other than success is an error, with the end of
// the log. When ctx ends first the process is killed.
func (p *Process) Run(ctx context.Context) error {
	if err := p.Start(); err != nil {
		return err
	}
	select {
	case <-p.Exited():
	case <-ctx.Done():
		p.Kill()
		return fmt.Errorf("%s did not finish: %w", p.name, context.Cause(ctx))
	}
	p.mu.Lock()
	err := p.waitErr
	p.cmd = nil
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s failed: %w\n%s", p.name, err, p.LogTail(20))
	}
	return nil
}

// Stop sends SIGTERM and waits for the process to exit, killing it if it
// has not within stopTimeout or when ctx ends. Stopping a stopped process
// does nothing. An exit status other than success or death by SIGTERM is
// reported, with the end of the log.
func (p *Process) Stop(ctx context.Context) error {
	cmd, exited := p.current()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling %s: %w", p.name, err)
	}
	timeout := time.NewTimer(stopTimeout)
	defer timeout.Stop()
	select {
	case <-exited:
	case <-ctx.Done():
		p.Kill()
		return fmt.Errorf("%s did not stop after SIGTERM, killed it: %w", p.name, context.Cause(ctx))
	case <-timeout.C:
		p.Kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM, killed it\n%s", p.name, stopTimeout, p.LogTail(20))
	}
	p.mu.Lock()
	err := p.waitErr
	p.cmd = nil
	p.mu.Unlock()
	if err != nil && !diedOf(err, syscall.SIGTERM) {
		return fmt.Errorf("%s exited badly after SIGTERM: %w\n%s", p.name, err, p.LogTail(20))
	}
	return nil
}

// Kill ends the process with SIGKILL, as a crash or an OOM kill would,
// and waits until it is reaped. Killing a stopped process does nothing.
func (p *Process) Kill() {
	cmd, exited := p.current()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	// SIGKILL cannot be caught: the reap follows at once.
	<-exited
	p.mu.Lock()
	p.cmd = nil
	p.mu.Unlock()
}

// Exited returns a channel closed when the current run ends, and nil when
// the process is not running, so a caller can notice an early exit while
// waiting for readiness.
func (p *Process) Exited() <-chan struct{} {
	_, exited := p.current()
	return exited
}

// ExitError returns how the last run ended, nil while running or after a
// clean exit.
func (p *Process) ExitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Pid returns the running process's id, 0 when it is not running.
func (p *Process) Pid() int {
	cmd, _ := p.current()
	if cmd == nil {
		return 0
	}
	return cmd.Process.Pid
}

func (p *Process) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// LogTail returns the last n lines of the log, or a note saying why it
// cannot.
func (p *Process) LogTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if errors.Is(err, fs.ErrNotExist) {
		return "(no log)"
	}
	if err != nil {
		return fmt.Sprintf("(reading log: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	start := len(data)
	for i := 0; i < n && start > 0; i++ {
		start = max(bytes.LastIndexByte(data[:start], '\n'), 0)
	}
	return string(bytes.TrimLeft(data[start:], "\n"))
}

// diedOf reports whether err is an exit by signal sig.
func diedOf(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}
