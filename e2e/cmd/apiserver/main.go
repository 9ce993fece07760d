// Command e2e-apiserver runs a real etcd and a real kube-apiserver in one
// process on 127.0.0.1, for proxyplane's end-to-end tests and demo.
//
// Everything it needs (etcd data, serving certificate, service-account key,
// static tokens) is created under --dir on first start and reused after, so
// a second start on the same --dir and ports is a restart of the same
// cluster: objects survive and kubeconfig files stay valid. Two identities
// exist: "admin" (system:masters) and "proxyplane-controlplane" (no
// privileged group; RBAC decides). Their kubeconfig files are written to
// --dir as admin.kubeconfig and controlplane.kubeconfig.
//
// When /readyz answers, it prints one JSON line (see internal/readyline) on
// stdout; logs go to stderr. SIGTERM or SIGINT stops kube-apiserver and
// then etcd, and it exits 0; any failure exits 1 with the reason on stderr.
// Flags after "--" go to kube-apiserver and override the defaults.
//
// No controller-manager runs: tests create EndpointSlices and Nodes
// themselves, and nothing creates service-account tokens for Pods.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyplane/proxyplane/e2e/internal/readyline"
)

func main() {
	o := newOptions()
	fs := pflag.NewFlagSet("e2e-apiserver", pflag.ContinueOnError)
	o.AddFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: e2e-apiserver --dir DIR [flags] [-- kube-apiserver flags]\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "e2e-apiserver: %v\n", err)
		os.Exit(2)
	}
	if dash := fs.ArgsLenAtDash(); dash >= 0 {
		o.APIServerArgs = fs.Args()[dash:]
	}
	if fs.NArg() != len(o.APIServerArgs) {
		fmt.Fprintf(os.Stderr, "e2e-apiserver: unexpected arguments %q (kube-apiserver flags go after \"--\")\n", fs.Args())
		os.Exit(2)
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e-apiserver: %v\n", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	// Once the first signal has started the shutdown, a second one should
	// kill the process at once rather than be swallowed.
	go func() {
		<-ctx.Done()
		stop()
	}()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "e2e-apiserver: %v\n", err)
		os.Exit(1)
	}
}

// layout names the files under --dir.
type layout struct {
	dir, etcdDir, certDir, tokenFile, saKeyFile, adminKubeconfig, controlplaneKubeconfig string
}

func newLayout(dir string) layout {
	return layout{
		dir:                    dir,
		etcdDir:                filepath.Join(dir, "etcd"),
		certDir:                filepath.Join(dir, "certs"),
		tokenFile:              filepath.Join(dir, "tokens.csv"),
		saKeyFile:              filepath.Join(dir, "service-account.key"),
		adminKubeconfig:        filepath.Join(dir, "admin.kubeconfig"),
		controlplaneKubeconfig: filepath.Join(dir, "controlplane.kubeconfig"),
	}
}

// run starts etcd and kube-apiserver, reports readiness on out, and serves
// until ctx is done; it returns nil only after a clean shutdown.
func run(ctx context.Context, o *Options, out io.Writer) (err error) {
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return fmt.Errorf("resolving --dir: %w", err)
	}
	l := newLayout(dir)
	for _, d := range []string{l.dir, l.certDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	admin, controlplane, err := ensureTokens(l.tokenFile)
	if err != nil {
		return err
	}
	if err := ensureServiceAccountKey(l.saKeyFile); err != nil {
		return err
	}
	etcdClientPort, etcdPeerPort := o.EtcdClientPort, o.EtcdPeerPort
	for _, p := range []*int{&etcdClientPort, &etcdPeerPort} {
		if *p == 0 {
			if *p, err = freeLoopbackPort(); err != nil {
				return err
			}
		}
	}

	startCtx, cancelStart := context.WithTimeout(ctx, o.ReadyTimeout)
	defer cancelStart()

	e, err := startEtcd(startCtx, l.etcdDir, etcdClientPort, etcdPeerPort)
	if err != nil {
		return err
	}
	// etcd goes last, after kube-apiserver has stopped writing to it.
	defer e.Close()

	// kube-apiserver is not cancelled by the signal directly: it is
	// stopped, and waited for, before etcd is closed, whichever way run
	// returns. Its options get the same context, since some of what they
	// start lives as long as the server.
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()

	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.SecurePort)))
	if err != nil {
		return fmt.Errorf("listening for kube-apiserver: %w", err)
	}
	securePort := ln.Addr().(*net.TCPAddr).Port
	etcdURL := loopbackURL(etcdClientPort)
	srv, err := newAPIServer(runCtx, ln, etcdURL.String(), o.ServiceClusterIPRange,
		apiServerFiles{certDir: l.certDir, tokenFile: l.tokenFile, saKeyFile: l.saKeyFile}, o.APIServerArgs)
	if err != nil {
		_ = ln.Close()
		return err
	}
	serverURL := "https://" + ln.Addr().String()
	if err := writeKubeconfig(l.adminKubeconfig, serverURL, srv.caFile, admin); err != nil {
		_ = ln.Close()
		return err
	}
	if err := writeKubeconfig(l.controlplaneKubeconfig, serverURL, srv.caFile, controlplane); err != nil {
		_ = ln.Close()
		return err
	}

	runErr := make(chan error, 1)
	go func() { runErr <- srv.run(runCtx) }()
	apiServerRunning := true
	defer func() {
		if !apiServerRunning {
			return
		}
		cancelRun()
		select {
		case rerr := <-runErr:
			err = errors.Join(err, rerr)
		case <-time.After(o.ShutdownTimeout):
			err = errors.Join(err, fmt.Errorf("kube-apiserver did not stop within %s", o.ShutdownTimeout))
		}
	}()

	if err := waitReady(startCtx, l.adminKubeconfig, runErr, e.Err()); err != nil {
		if errors.Is(err, errAPIServerExited) {
			apiServerRunning = false
		}
		return err
	}
	line := readyline.Line{
		URL:                    serverURL,
		Dir:                    l.dir,
		AdminKubeconfig:        l.adminKubeconfig,
		ControlplaneKubeconfig: l.controlplaneKubeconfig,
		CAFile:                 srv.caFile,
		SecurePort:             securePort,
		EtcdClientPort:         etcdClientPort,
		EtcdPeerPort:           etcdPeerPort,
		PID:                    os.Getpid(),
	}
	if err := json.NewEncoder(out).Encode(line); err != nil {
		return fmt.Errorf("printing the ready line: %w", err)
	}

	select {
	case <-ctx.Done():
		return nil // the deferred shutdown decides the result
	case rerr := <-runErr:
		apiServerRunning = false
		return fmt.Errorf("kube-apiserver stopped unexpectedly: %w", rerr)
	case eerr := <-e.Err():
		return fmt.Errorf("etcd failed: %w", eerr)
	}
}

// errAPIServerExited marks a kube-apiserver that returned before it was
// ready, so that nobody waits for it to stop.
var errAPIServerExited = errors.New("kube-apiserver exited before it was ready")

// waitReady polls /readyz with the admin identity until it answers,
// kube-apiserver or etcd fails, or ctx is done.
func waitReady(ctx context.Context, kubeconfig string, runErr <-chan error, etcdErr <-chan error) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	// Start takes about 3 s; 100 ms keeps the wait short without flooding
	// the log with refused connections.
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	var lastErr error
	for {
		reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, lastErr = client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(reqCtx)
		cancel()
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-apiserver /readyz: %w (last answer: %w)", context.Cause(ctx), lastErr)
		case rerr := <-runErr:
			return fmt.Errorf("%w: %w", errAPIServerExited, rerr)
		case eerr := <-etcdErr:
			return fmt.Errorf("etcd failed while kube-apiserver was starting: %w", eerr)
		case <-ticker.C:
		}
	}
}
