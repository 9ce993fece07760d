package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// controlPlane runs the controlplane binary: the same addresses across
// restarts, so that agents reconnect to where they were.
type controlPlane struct {
	binary     string
	args       []string // every flag, addresses included
	grpcAddr   string
	metricsURL string
	dir        string
	// logPrefix names its logs, <prefix>-<start>.log: "controlplane",
	// or one per replica.
	logPrefix string
	starts    int
	proc      *proc
	// insecure records whether --insecure was passed.
	insecure bool
	// readersOwnAudience records that the binary takes readers' tokens
	// for its own audience only (it has --agent-daemonset, which came
	// with that rule); older ones take the API server's.
	readersOwnAudience bool
	// client and conn are the harness's own client (connect).
	client pb.TableServiceClient
	conn   *grpc.ClientConn
	// lastList is when ListNodes was last called (see current).
	lastList time.Time
}

// controlPlaneConfig says how the harness runs the control plane.
type controlPlaneConfig struct {
	// Binary is the controlplane binary; Kubeconfig the API server's
	// admin kubeconfig; Dir receives the logs.
	Binary, Kubeconfig, Dir string
	// Secure runs it as production does: TLS from the CA it bootstraps in
	// secureNamespace, and agents' tokens of audience tokenAudience
	// reviewed. Otherwise it runs with --insecure if the binary has it.
	Secure bool
	// Extra flags, passed last, as they are.
	Extra []string
}

// listNodesEvery spaces ListNodes calls: a control plane may limit calls
// per peer address (one a second after a burst, in some versions).
const listNodesEvery = time.Second

// harnessAddr is the harness's own source address toward the control
// plane (the agents' are 127.16.0.1 onwards), so that the control plane's
// per-address limits count it apart.
var harnessAddr = &net.TCPAddr{IP: net.IPv4(127, 15, 0, 1)}

// newControlPlane picks free ports and the flags: the API server's
// kubeconfig, the addresses, then either the secure mode's (its namespace,
// the agents' audience and ServiceAccount, stated rather than left to
// defaults that could drift from what the harness creates) or --insecure
// if and only if the binary lists it (binaries from before TLS and token
// authentication have no such flag and serve plaintext), then the extra
// flags. The per-peer rate limit stays on in both: every agent dials from
// an address of its own (agentsim's sourceAddr), as on real nodes.
func newControlPlane(ctx context.Context, cfg controlPlaneConfig) (*controlPlane, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{
		binary:     cfg.Binary,
		grpcAddr:   "127.0.0.1:" + strconv.Itoa(ports[0]),
		metricsURL: "http://127.0.0.1:" + strconv.Itoa(ports[1]),
		dir:        cfg.Dir,
	}
	cp.args = []string{
		"--kubeconfig=" + cfg.Kubeconfig,
		"--grpc-address=" + cp.grpcAddr,
		"--metrics-address=127.0.0.1:" + strconv.Itoa(ports[1]),
	}
	hasInsecure, err := listsFlag(ctx, cfg.Binary, "--insecure")
	if err != nil {
		return nil, err
	}
	switch {
	case cfg.Secure && !hasInsecure:
		return nil, fmt.Errorf("--secure: %s has no --insecure flag, so it predates TLS and token authentication", cfg.Binary)
	case cfg.Secure:
		cp.args = append(cp.args, "--namespace="+secureNamespace, "--token-audience="+tokenAudience,
			"--agent-service-account="+secureNamespace+"/"+agentServiceAccount)
		// The DaemonSet is left to its default, the harness's name: older
		// binaries have no such flag.
		if cp.readersOwnAudience, err = listsFlag(ctx, cfg.Binary, "--agent-daemonset"); err != nil {
			return nil, err
		}
	case hasInsecure:
		cp.insecure = true
		cp.args = append(cp.args, "--insecure")
	}
	cp.args = append(cp.args, cfg.Extra...)
	return cp, nil
}

// connect creates the harness's own client, for ListNodes: in plaintext
// when ca is nil; otherwise with TLS trusting only ca, verifying
// serverName, and sending token, which must be a reader's. It connects
// lazily, and again to each new process.
func (cp *controlPlane) connect(ca []byte, token string) error {
	creds := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if ca != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return errors.New("the control plane's CA bundle holds no PEM certificate")
		}
		creds = []grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})),
			grpc.WithPerRPCCredentials(readerToken(token)),
		}
	}
	conn, err := grpc.NewClient(cp.grpcAddr, append(creds,
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: harnessAddr}
			return d.DialContext(ctx, "tcp", addr)
		}))...)
	if err != nil {
		return fmt.Errorf("creating control plane client: %w", err)
	}
	cp.conn, cp.client = conn, pb.NewTableServiceClient(conn)
	return nil
}

// readerToken sends a reader's bearer token, over TLS only.
type readerToken string

// GetRequestMetadata returns the authorization header.
func (t readerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is true: the admin's token is never sent in
// plaintext.
func (readerToken) RequireTransportSecurity() bool { return true }

// listsFlag reports whether binary --help mentions flag.
func listsFlag(ctx context.Context, binary, flag string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// pflag prints usage and exits 0 (or 2 with older versions) on
	// --help: the output matters, not the status.
	out, err := exec.CommandContext(ctx, binary, "--help").CombinedOutput()
	if ctx.Err() != nil {
		return false, fmt.Errorf("running %s --help: %w", binary, ctx.Err())
	}
	if len(out) == 0 && err != nil {
		return false, fmt.Errorf("running %s --help: %w", binary, err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if f == flag || strings.HasPrefix(f, flag+"=") {
				return true, nil
			}
		}
	}
	return false, nil
}

// start starts the control plane and waits until /readyz answers 200:
// informers synced and the first world published.
func (cp *controlPlane) start(ctx context.Context, timeout time.Duration) error {
	cp.starts++
	prefix := cp.logPrefix
	if prefix == "" {
		prefix = "controlplane"
	}
	log := filepath.Join(cp.dir, fmt.Sprintf("%s-%d.log", prefix, cp.starts))
	ctx2, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	p, _, err := startProc(ctx2, "controlplane", append([]string{cp.binary}, cp.args...), nil, log, false)
	if err != nil {
		return err
	}
	cp.proc = p
	return poll(ctx, "control plane ready", 20*time.Millisecond, timeout, func(ctx context.Context) (bool, error) {
		if !p.running() {
			return false, fmt.Errorf("control plane exited: %w (log: %s)", p.waitErr, log)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.metricsURL+"/readyz", nil)
		if err != nil {
			return false, fmt.Errorf("building request: %w", err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil // not listening yet
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (cp *controlPlane) pid() int { return cp.proc.pid() }

func (cp *controlPlane) close() {
	if cp.proc != nil && cp.proc.running() {
		_ = cp.proc.stop()
	}
	if cp.conn != nil {
		_ = cp.conn.Close()
	}
}

// current reports how many of versions' nodes are connected to the
// control plane with that version acknowledged (or reported at hello),
// by ListNodes, and the latest time one of them was; -1 when it is too
// soon to ask again (listNodesEvery).
func (cp *controlPlane) current(ctx context.Context, versions map[string]string) (int, time.Time, error) {
	var last time.Time
	if time.Since(cp.lastList) < listNodesEvery {
		return -1, last, nil
	}
	cp.lastList = time.Now()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := cp.client.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		return 0, last, fmt.Errorf("ListNodes: %w", err)
	}
	n := 0
	for _, s := range resp.GetNodes() {
		if v, ok := versions[s.GetNodeName()]; ok && v != "" && s.GetConnected() && s.GetAckedVersion() == v {
			n++
			if t := s.GetAckedAt().AsTime(); t.After(last) {
				last = t
			}
		}
	}
	return n, last, nil
}

// heapInuse scrapes go_memstats_heap_inuse_bytes from /metrics.
func (cp *controlPlane) heapInuse(ctx context.Context) (uint64, error) {
	g, err := cp.gauges(ctx, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return 0, err
	}
	return uint64(g[0]), nil
}

// runtimeMem is what the Go runtime says the control plane's memory is
// made of (its /metrics' go_memstats_*), and its goroutines.
type runtimeMem struct {
	// HeapInuse is live objects and fragmentation; HeapUnreleased the
	// heap's idle spans not yet returned to the OS (they count in RSS).
	HeapInuse, HeapUnreleased uint64
	// Stacks is goroutine stacks; Runtime the runtime's own structures
	// (spans, caches, GC metadata, profiling buckets, other).
	Stacks, Runtime uint64
	// Sys is everything the runtime obtained from the OS.
	Sys        uint64
	Goroutines int
}

// runtimeMem scrapes runtimeMem from /metrics.
func (cp *controlPlane) runtimeMem(ctx context.Context) (runtimeMem, error) {
	g, err := cp.gauges(ctx, "go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes",
		"go_memstats_stack_inuse_bytes", "go_memstats_mspan_inuse_bytes", "go_memstats_mcache_inuse_bytes",
		"go_memstats_gc_sys_bytes", "go_memstats_other_sys_bytes", "go_memstats_buck_hash_sys_bytes",
		"go_memstats_sys_bytes", "go_goroutines")
	if err != nil {
		return runtimeMem{}, err
	}
	return runtimeMem{
		HeapInuse: uint64(g[0]), HeapUnreleased: uint64(g[1] - g[2]), Stacks: uint64(g[3]),
		Runtime: uint64(g[4] + g[5] + g[6] + g[7] + g[8]), Sys: uint64(g[9]), Goroutines: int(g[10]),
	}, nil
}

// gauges scrapes the values of the unlabelled metrics names from
// /metrics, in their order.
func (cp *controlPlane) gauges(ctx context.Context, names ...string) ([]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.metricsURL+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	// Without it Go's client asks for gzip, and the control plane would
	// spend CPU counted in the phase compressing for a loopback read.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	out := make([]float64, len(names))
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && found < len(names) {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if i := slices.Index(names, name); ok && i >= 0 {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("parsing %s %q: %w", name, v, err)
			}
			out[i] = f
			found++
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	if found < len(names) {
		return nil, fmt.Errorf("only %d of %v in /metrics", found, names)
	}
	return out, nil
}

// profile writes the control plane's pprof profile kind (its
// /debug/pprof/<kind>, with query q) to path. The binary must run with
// --profiling.
func (cp *controlPlane) profile(ctx context.Context, kind, q, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.metricsURL+"/debug/pprof/"+kind+"?"+q, nil)
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("getting the %s profile: %w", kind, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("getting the %s profile: %s", kind, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}

// freePorts returns n ports free on 127.0.0.1 now. Another process could
// take one before the control plane binds it; on this machine nothing
// else allocates ports in a loop, and the start would fail clearly.
func freePorts(n int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		lns = append(lns, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
