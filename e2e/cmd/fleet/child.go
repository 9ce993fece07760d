package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// roleEnv names the environment variable that makes the fleet binary (or
// the test binary, see main_test.go) run as one of its child processes.
const roleEnv = "FLEET_ROLE"

// Roles a child runs.
const (
	roleAgents = "agents"
	rolePeer   = "peer"
	// The gRPC floor's server and clients (internal/floor).
	roleFloorServer  = "floor-server"
	roleFloorClients = "floor-clients"
)

// stopTimeout bounds a child's exit after SIGTERM: the control plane's
// own shutdown is bounded by two 5 s graces.
const stopTimeout = 30 * time.Second

// proc is a child process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error // set before exited is closed
	logPath string
}

// startProc starts argv with env added, its stderr (and stdout unless
// ready) appended to logPath. With ready, it reads the child's ready line
// from its stdout, bounded by ctx.
func startProc(ctx context.Context, name string, argv, env []string, logPath string, ready bool) (*proc, contract.Ready, error) {
	var r contract.Ready
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, r, fmt.Errorf("opening %s: %w", logPath, err)
	}
	defer func() { _ = logFile.Close() }() // the child holds its own descriptor
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	cmd.Stdout = logFile
	// The children must not outlive the harness, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdoutR *os.File
	if ready {
		var w *os.File
		if stdoutR, w, err = os.Pipe(); err != nil {
			return nil, r, fmt.Errorf("creating pipe: %w", err)
		}
		cmd.Stdout = w
		defer func() { _ = w.Close() }()
	}
	if err := cmd.Start(); err != nil {
		return nil, r, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), logPath: logPath}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	if !ready {
		return p, r, nil
	}
	lines := make(chan []byte, 1)
	go func() {
		// Read the line, then drain until the child exits: a closed pipe
		// would kill it with SIGPIPE on its next write.
		defer func() { _ = stdoutR.Close() }()
		sc := bufio.NewScanner(stdoutR)
		if sc.Scan() {
			lines <- bytes.Clone(sc.Bytes())
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdoutR)
	}()
	select {
	case line, ok := <-lines:
		if !ok {
			p.kill()
			return nil, r, fmt.Errorf("%s exited before it was ready: %w (log: %s)", name, p.waitErr, logPath)
		}
		if err := json.Unmarshal(line, &r); err != nil {
			p.kill()
			return nil, r, fmt.Errorf("%s's ready line %q: %w", name, line, err)
		}
	case <-ctx.Done():
		p.kill()
		return nil, r, fmt.Errorf("waiting for %s to be ready: %w", name, context.Cause(ctx))
	}
	return p, r, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits for the exit, killing the process after
// stopTimeout.
func (p *proc) stop() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling %s: %w", p.name, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(stopTimeout):
		p.kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM; killed it (log: %s)", p.name, stopTimeout, p.logPath)
	}
}

// kill ends the process at once and waits for it to be reaped, which
// SIGKILL makes prompt.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// startChild re-executes this binary in role: os.Executable is the
// fleet binary, or the test binary whose TestMain dispatches on roleEnv.
func startChild(ctx context.Context, role string, args []string, logPath string) (*proc, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("finding this binary: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	p, r, err := startProc(ctx, role, append([]string{self}, args...), []string{roleEnv + "=" + role}, logPath, true)
	if err != nil {
		return nil, "", err
	}
	return p, "http://" + r.Control, nil
}

// controlClient talks to the children's control endpoints; a report of
// thousands of agents and changes takes a moment to build.
var controlClient = &http.Client{Timeout: time.Minute}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	return doJSON(req, v)
}

func post(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	return doJSON(req, nil)
}

func doJSON(req *http.Request, v any) error {
	resp, err := controlClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", req.Method, req.URL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", req.Method, req.URL, resp.Status, bytes.TrimSpace(body))
	}
	if v == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("decoding %s: %w", req.URL, err)
	}
	return nil
}

// poll calls cond every interval until it returns true or an error, or
// the timeout passes.
func poll(ctx context.Context, what string, interval, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ok, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s: %w", what, timeout, context.Cause(ctx))
		case <-t.C:
		}
	}
}
