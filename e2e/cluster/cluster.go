// Package cluster runs e2e-apiserver (a real etcd and kube-apiserver, see
// ../cmd/apiserver) as a subprocess for tests and the demo.
//
// It imports only client-go and the standard library, so test binaries stay
// small and build in seconds; the heavy binary is built once per run by
// `make e2e-apiserver`. Each Cluster owns a directory that holds all its
// state, so Restart brings the same cluster back on the same ports, as a
// restarted API server would be seen by a client.
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyplane/proxyplane/e2e/internal/readyline"
)

// BinaryEnv names the environment variable that overrides where
// e2e-apiserver is looked for; `make e2e` sets it.
const BinaryEnv = "E2E_APISERVER"

// Defaults, each bounding a wait that normally takes a fraction of it.
const (
	// DefaultReadyTimeout bounds start to /readyz, about 3 s on an idle
	// 2-core machine and several times that when builds share it.
	DefaultReadyTimeout = 2 * time.Minute
	// DefaultStopTimeout bounds a graceful stop, normally about a second;
	// past it the process is killed. It is longer than the binary's own
	// 30 s --shutdown-timeout, so that the binary's error, which names
	// what hung, comes first.
	DefaultStopTimeout = 45 * time.Second
	// readyMargin lets the binary's own --ready-timeout fire first, since
	// its error says what it was waiting for.
	readyMargin = 15 * time.Second
	// logName is the file in Dir that collects the process's stderr
	// across restarts.
	logName = "e2e-apiserver.log"
)

// Config describes a cluster to start.
type Config struct {
	// Binary is the path of e2e-apiserver. Required.
	Binary string
	// Dir holds all the cluster's state and its log; created if missing.
	// Required.
	Dir string
	// ReadyTimeout bounds each start; zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// APIServerArgs are extra kube-apiserver flags.
	APIServerArgs []string
	// CommandPrefix, when set, runs the binary through another command,
	// such as {"ip", "netns", "exec", NS} to put the API server inside a
	// network namespace (its 127.0.0.1 is then that namespace's). The
	// prefix must exec the binary rather than fork it, as "ip netns exec"
	// does, so that Stop's SIGTERM and Kill's SIGKILL reach the API server
	// itself.
	CommandPrefix []string
}

// Cluster is a running (or stopped) e2e-apiserver. Its methods must not be
// called concurrently: a test drives it from one goroutine.
type Cluster struct {
	cfg  Config
	info readyline.Line

	// cmd is the running process, nil when stopped; exited is closed, and
	// waitErr set, when it has been reaped.
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// Start starts a cluster in a fresh temporary directory of tb and stops it
// when the test ends, logging the tail of its log if the test failed. It
// fails tb if the cluster does not become ready.
func Start(tb testing.TB, binary string) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultReadyTimeout+readyMargin)
	defer cancel()
	c, err := New(ctx, Config{Binary: binary, Dir: tb.TempDir()})
	if err != nil {
		tb.Fatalf("starting e2e-apiserver: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("last lines of %s:\n%s", c.LogPath(), c.LogTail(60))
		}
		ctx, cancel := context.WithTimeout(context.Background(), DefaultStopTimeout)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			tb.Errorf("stopping e2e-apiserver: %v", err)
		}
	})
	return c
}

// New starts e2e-apiserver as cfg says and returns once it is ready. ctx
// bounds only the start; the process runs until Stop.
func New(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Binary == "" || cfg.Dir == "" {
		return nil, errors.New("cluster: Config.Binary and Config.Dir are required")
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating cluster dir: %w", err)
	}
	c := &Cluster{cfg: cfg}
	if err := c.start(ctx, readyline.Line{}); err != nil {
		return nil, err
	}
	return c, nil
}

// Restart stops the cluster, if it is running, and starts it again on the
// same directory and ports, so clients configured before see the same API
// server come back with its objects. After Stop or Kill it just starts it
// again, which lets a test keep the API server away for as long as it
// likes.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Stop(ctx); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if err := c.start(ctx, c.info); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// Stop sends SIGTERM and waits for the process to exit; if ctx ends, or
// DefaultStopTimeout passes, first it kills the process, waits for that,
// and reports the timeout. Stopping a stopped cluster does nothing. A
// non-zero exit status is an error.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.cmd == nil {
		return nil
	}
	defer func() { c.cmd = nil }()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling e2e-apiserver: %w", err)
	}
	timeout := time.NewTimer(DefaultStopTimeout)
	defer timeout.Stop()
	select {
	case <-c.exited:
	case <-ctx.Done():
		c.kill()
		return fmt.Errorf("e2e-apiserver did not stop after SIGTERM, killed it: %w", context.Cause(ctx))
	case <-timeout.C:
		c.kill()
		return fmt.Errorf("e2e-apiserver did not stop within %s of SIGTERM, killed it\n%s", DefaultStopTimeout, c.LogTail(20))
	}
	if c.waitErr != nil {
		return fmt.Errorf("e2e-apiserver exited badly: %w\n%s", c.waitErr, c.LogTail(20))
	}
	return nil
}

// Kill ends the process with SIGKILL, as a crash or an OOM kill would,
// and waits until it is reaped. etcd's data stays on disk, so Restart
// brings the same cluster back. Killing a stopped cluster does nothing.
func (c *Cluster) Kill() {
	if c.cmd == nil {
		return
	}
	c.kill()
	c.cmd = nil
}

// kill ends the process at once and reaps it. SIGKILL cannot be caught,
// so the wait for the kernel to reap it is short and needs no bound of ours.
func (c *Cluster) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// start runs the binary, on the ports of prev when it is a restart, and
// waits for its ready line.
func (c *Cluster) start(ctx context.Context, prev readyline.Line) error {
	args := []string{
		"--dir=" + c.cfg.Dir,
		"--ready-timeout=" + c.cfg.ReadyTimeout.String(),
		"--secure-port=" + strconv.Itoa(prev.SecurePort),
		"--etcd-client-port=" + strconv.Itoa(prev.EtcdClientPort),
		"--etcd-peer-port=" + strconv.Itoa(prev.EtcdPeerPort),
	}
	if len(c.cfg.APIServerArgs) > 0 {
		args = append(append(args, "--"), c.cfg.APIServerArgs...)
	}
	logFile, err := os.OpenFile(c.LogPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening log: %w", err)
	}
	defer func() { _ = logFile.Close() }() // the child holds its own descriptor
	// An *os.File as Stdout is handed to the child as is, so the reader
	// sees EOF exactly when the child exits, and Wait never closes it
	// under a read, as it would a StdoutPipe.
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("creating stdout pipe: %w", err)
	}

	argv := append(append(slices.Clone(c.cfg.CommandPrefix), c.cfg.Binary), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = stdoutW
	cmd.Stderr = logFile
	setParentDeathSignal(cmd)
	err = cmd.Start()
	_ = stdoutW.Close()
	if err != nil {
		return fmt.Errorf("starting %s: %w", c.cfg.Binary, err)
	}
	c.cmd = cmd
	c.exited = make(chan struct{})
	go func(exited chan struct{}) {
		c.waitErr = cmd.Wait()
		close(exited)
	}(c.exited)

	// The ready line is the only thing the binary prints on stdout. The
	// reader drains the rest until EOF, that is until the process exits,
	// because a closed pipe would kill the process with SIGPIPE on its next
	// write.
	lines := make(chan []byte, 1)
	go func() {
		defer func() { _ = stdoutR.Close() }()
		defer close(lines)
		sc := bufio.NewScanner(stdoutR)
		if sc.Scan() {
			lines <- bytes.Clone(sc.Bytes())
		}
		_, _ = io.Copy(io.Discard, stdoutR)
	}()

	timeout := time.NewTimer(c.cfg.ReadyTimeout + readyMargin)
	defer timeout.Stop()
	var line []byte
	select {
	case line = <-lines:
	case <-c.exited:
	case <-ctx.Done():
		c.kill()
		c.cmd = nil
		return fmt.Errorf("waiting for e2e-apiserver: %w\n%s", context.Cause(ctx), c.LogTail(20))
	case <-timeout.C:
		c.kill()
		c.cmd = nil
		return fmt.Errorf("e2e-apiserver not ready within %s\n%s", c.cfg.ReadyTimeout+readyMargin, c.LogTail(20))
	}
	if line == nil {
		// No line means stdout closed, which means the process exited.
		select {
		case <-c.exited:
		case <-timeout.C:
			c.kill()
		}
		c.cmd = nil
		return fmt.Errorf("e2e-apiserver exited before it was ready (%w)\n%s", c.waitErr, c.LogTail(20))
	}
	var info readyline.Line
	if err := json.Unmarshal(line, &info); err != nil {
		c.kill()
		c.cmd = nil
		return fmt.Errorf("parsing e2e-apiserver ready line %q: %w", line, err)
	}
	if prev.SecurePort != 0 && info.URL != prev.URL {
		c.kill()
		c.cmd = nil
		return fmt.Errorf("e2e-apiserver came back on %s, not %s", info.URL, prev.URL)
	}
	c.info = info
	return nil
}

// Running reports whether the API server process is up: started, and
// neither stopped, killed nor exited on its own.
func (c *Cluster) Running() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// Info returns what the binary reported at its last start.
func (c *Cluster) Info() readyline.Line { return c.info }

// URL returns the API server's address, https://127.0.0.1:PORT.
func (c *Cluster) URL() string { return c.info.URL }

// Dir returns the directory that holds the cluster's state and log.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// AdminKubeconfig returns the path of the kubeconfig for "admin", a member
// of system:masters.
func (c *Cluster) AdminKubeconfig() string { return c.info.AdminKubeconfig }

// ControlplaneKubeconfig returns the path of the kubeconfig for
// "proxyplane-controlplane", which RBAC alone authorizes.
func (c *Cluster) ControlplaneKubeconfig() string { return c.info.ControlplaneKubeconfig }

// AdminConfig returns a new rest.Config for "admin"; callers may change it.
func (c *Cluster) AdminConfig() (*rest.Config, error) {
	return restConfig(c.info.AdminKubeconfig)
}

// ControlplaneConfig returns a new rest.Config for
// "proxyplane-controlplane"; callers may change it.
func (c *Cluster) ControlplaneConfig() (*rest.Config, error) {
	return restConfig(c.info.ControlplaneKubeconfig)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// LogPath returns the file that collects the process's stderr.
func (c *Cluster) LogPath() string { return filepath.Join(c.cfg.Dir, logName) }

// LogTail returns the last n lines of the log, or a note saying why it
// cannot.
func (c *Cluster) LogTail(n int) string {
	data, err := os.ReadFile(c.LogPath())
	if errors.Is(err, fs.ErrNotExist) {
		return "(no log)"
	}
	if err != nil {
		return fmt.Sprintf("(reading log: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	start := len(data)
	for i := 0; i < n && start > 0; i++ {
		start = bytes.LastIndexByte(data[:start], '\n')
		if start < 0 {
			start = 0
		}
	}
	return string(bytes.TrimLeft(data[start:], "\n"))
}

// BinaryPath finds e2e-apiserver: $E2E_APISERVER if set, otherwise
// .bin/e2e-apiserver in the nearest directory above the working directory
// that has one (tests run in their package's directory).
func BinaryPath() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", BinaryEnv, err)
		}
		return p, nil
	}
	p, err := FindBin("e2e-apiserver")
	if err != nil {
		return "", fmt.Errorf("%w ($%s unset)", err, BinaryEnv)
	}
	return p, nil
}

// FindBin returns .bin/name in the nearest directory above the working
// directory that has one: where `make` puts the binaries.
func FindBin(name string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding %s: %w", name, err)
	}
	// The repository is a few levels up at most; the bound only stops the
	// walk at the filesystem root.
	for range 64 {
		p := filepath.Join(dir, ".bin", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", fmt.Errorf("no .bin/%s above the working directory: %w", name, fs.ErrNotExist)
}

// RequireBinary returns BinaryPath, or skips tb with how to build it.
func RequireBinary(tb testing.TB) string {
	tb.Helper()
	p, err := BinaryPath()
	if err != nil {
		tb.Skipf("e2e-apiserver is not built (%v): run `make e2e-apiserver`, or `make e2e` to build and run everything", err)
	}
	return p
}
