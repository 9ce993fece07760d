package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/failpoint"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/internal/tablehash"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
	"github.com/proxyplane/proxyplane/nodeagent/sysctl"
)

// The live mode switch on the real kernel: the real agent (Run, as the
// binary runs it) in a node namespace in one mode, stopped, and started
// again in another on the same state directory, as rolling the DaemonSet
// after editing the mode does, under steady new connections from outside
// the cluster, from a pod and from the node, and one long-lived
// connection. The agent runs as a child process entered into the node
// namespace whole (ip netns exec), so that every thread and every tool it
// runs programs that namespace and no other.

// agentProcessEnv carries the child agent's settings (agentSpec, JSON).
const agentProcessEnv = "PROXYPLANE_SWITCH_TEST_AGENT"

// agentSpec is what the child agent runs as.
type agentSpec struct {
	Mode, Backend, StateDir string
}

// TestAgentProcess is no test of its own: it is the agent process the
// switch tests start in a node namespace, skipped otherwise.
func TestAgentProcess(t *testing.T) {
	env := os.Getenv(agentProcessEnv)
	if env == "" {
		t.Skip("the agent process of the switch tests; they start it")
	}
	var spec agentSpec
	if err := json.Unmarshal([]byte(env), &spec); err != nil {
		t.Fatal(err)
	}
	o := NewOptions()
	o.NodeName = dptest.KernelNode().Name
	// Nothing answers there: the agent runs from its cache, as during a
	// control plane outage, and keeps trying.
	o.ControlPlanes = []string{"127.0.0.1:1"}
	o.Insecure = true
	o.StateDir = spec.StateDir
	o.ProxyMode = spec.Mode
	o.IPTablesBackend = spec.Backend
	o.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:244::/32"}
	o.HealthzBindAddress = "127.0.0.1:10256"
	o.MetricsBindAddress = "127.0.0.1:10249"
	// The node namespace's conntrack is the test's: leave it as it is.
	o.Conntrack = sysctl.Conntrack{}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := Run(ctx, o, log); err != nil {
		fmt.Fprintf(os.Stderr, "agent failed: %v\n", err)
		os.Exit(3)
	}
}

// modeRef is a mode, with its iptables backend.
type modeRef struct{ mode, backend string }

func (m modeRef) String() string {
	if m.backend == "" {
		return m.mode
	}
	return m.mode + "-" + m.backend
}

var (
	iptablesNFT    = modeRef{"iptables", "nft"}
	iptablesLegacy = modeRef{"iptables", "legacy"}
	nftablesMode   = modeRef{"nftables", ""}
)

// agentProc is a running child agent.
type agentProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startAgent starts the agent in ref's mode in tp's node namespace, with
// extra environment (a failpoint).
func startAgent(t *testing.T, tp *nstest.Topology, ref modeRef, stateDir string, env ...string) *agentProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(agentSpec{Mode: ref.mode, Backend: ref.backend, StateDir: stateDir})
	if ref.backend == "" {
		spec, _ = json.Marshal(agentSpec{Mode: ref.mode, Backend: "auto", StateDir: stateDir})
	}
	logPath := filepath.Join(t.TempDir(), "agent-"+ref.String()+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", tp.NodeNS(), self, "-test.run=^TestAgentProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), agentProcessEnv+"="+string(spec)), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("agent %s log:\n%s", ref, tail(string(b), 60))
		}
	})
	return p
}

// stop ends the agent with SIGTERM, as a rollout does, and waits.
func (p *agentProc) stop(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("the agent ignored SIGTERM for 15s; killed it")
	}
}

// exited waits up to d for the agent to exit by itself.
func (p *agentProc) exited(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Services of the switch tests: web (ClusterIP, both pods, dual-stack)
// for the probes and long (ClusterIP) for the long-lived connection.
const (
	webIP   = "10.96.0.10"
	webIPv6 = "fd00:96::10"
	longIP  = "10.96.0.50"
	// echoPort is where each pod's echo server listens for the
	// long-lived connection.
	echoPort = 9090
)

// writeCache writes the table the agents program at start into the state
// directory, with real hashes (the agent checks them).
func writeCache(t *testing.T, tp *nstest.Topology, stateDir string) {
	t.Helper()
	both := func(port int) []string { return []string{dptest.PodEP(tp, 0, port), dptest.PodEP(tp, 1, port)} }
	web := dptest.Svc("ns", "web", webIP, webIPv6)
	web.Ports = []*pb.ServicePort{dptest.Port("http", dptest.TCP, 80, 0, true)}
	web.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("http", append(both(8080),
		nstest.HostPort(tp.PodIPv6(0), 8080), nstest.HostPort(tp.PodIPv6(1), 8080))...)}
	long := dptest.Svc("ns", "long", longIP)
	long.Ports = []*pb.ServicePort{dptest.Port("echo", dptest.TCP, 90, 0, true)}
	long.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps("echo", both(echoPort)...)}

	node := dptest.KernelNode()
	var err error
	if node.Hash, err = tablehash.Node(node); err != nil {
		t.Fatal(err)
	}
	sum := node.Hash
	var entries []*pb.ServiceEntry
	for _, s := range []*pb.Service{web, long} {
		e := dptest.Entry(s)
		if e.Hash, err = tablehash.Entry(e.Key, e.Service); err != nil {
			t.Fatal(err)
		}
		sum += e.Hash
		entries = append(entries, e)
	}
	table, err := proxytable.FromEntries(fmt.Sprintf("%016x", sum), node, entries)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := cache.Open(filepath.Join(stateDir, "table.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if err := c.Save(table, nil, true); err != nil {
		t.Fatal(err)
	}
}

// rulesOf reports what of ref's mode the node namespace holds, from the
// tools an operator would use: iptables-save of ref's backend (both
// families, nat and filter) for iptables mode, nft list tables for
// nftables mode. Empty when nothing.
func rulesOf(t *testing.T, tp *nstest.Topology, ref modeRef) string {
	t.Helper()
	var out strings.Builder
	switch ref.mode {
	case "nftables":
		b, err := tp.Exec(tp.NodeNS(), "nft", "list", "tables")
		if err != nil {
			t.Fatalf("nft list tables: %v", err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasSuffix(line, " proxyplane") {
				out.WriteString(line + "\n")
			}
		}
	case "iptables":
		for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
			save := xtables.BinariesOf(f, xtables.Backend(ref.backend)).Save
			for _, table := range []string{"nat", "filter"} {
				b, err := tp.Exec(tp.NodeNS(), save, "-t", table)
				if err != nil {
					t.Fatalf("%s -t %s: %v", save, table, err)
				}
				for line := range strings.SplitSeq(string(b), "\n") {
					if strings.Contains(line, xtables.ChainPrefix) {
						out.WriteString(save + " " + table + ": " + line + "\n")
					}
				}
			}
		}
	}
	return out.String()
}

// wholeRuleset is every table of the node namespace, for failure
// messages.
func wholeRuleset(tp *nstest.Topology) string {
	var b strings.Builder
	for _, cmd := range [][]string{{"nft", "list", "ruleset"}, {"iptables-legacy-save"}, {"ip6tables-legacy-save"}} {
		out, err := tp.Exec(tp.NodeNS(), cmd[0], cmd[1:]...)
		fmt.Fprintf(&b, "## %s (err %v)\n%s\n", strings.Join(cmd, " "), err, out)
	}
	return b.String()
}

// waitFor polls cond every 100ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cond()
}

// prober dials a Service again and again from one namespace, each dial a
// new connection (a new conntrack flow), and counts.
type prober struct {
	name, ns, addr string
	ok, failed     atomic.Int64
	mu             sync.Mutex
	errs           []string // the first failures
}

// probes start one prober per source (outside the cluster, a pod, the
// node itself, and the client over IPv6) and return them with a stop
// function that waits for them. Each dials at most maxDials times.
func probes(tp *nstest.Topology) ([]*prober, func()) {
	const maxDials = 20000
	ps := []*prober{
		{name: "client", ns: tp.ClientNS(), addr: webIP + ":80"},
		{name: "pod", ns: tp.PodNS(1), addr: webIP + ":80"},
		{name: "node", ns: tp.NodeNS(), addr: webIP + ":80"},
		{name: "client-ipv6", ns: tp.ClientNS(), addr: "[" + webIPv6 + "]:80"},
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range maxDials {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := tp.DialTCP(p.ns, p.addr, 3*time.Second); err != nil {
					p.failed.Add(1)
					p.mu.Lock()
					if len(p.errs) < 5 {
						p.errs = append(p.errs, time.Now().Format("15:04:05.000")+" "+err.Error())
					}
					p.mu.Unlock()
					continue
				}
				p.ok.Add(1)
			}
		}()
	}
	var once sync.Once
	return ps, func() { once.Do(func() { close(stop); wg.Wait() }) }
}

// progressed waits until every prober has made n more successful dials
// than counted in since.
func progressed(ps []*prober, since []int64, n int64, d time.Duration) bool {
	return waitFor(d, func() bool {
		for i, p := range ps {
			if p.ok.Load() < since[i]+n {
				return false
			}
		}
		return true
	})
}

func counts(ps []*prober) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.ok.Load()
	}
	return out
}

// serveEcho starts, in pod i, a server on echoPort that answers every
// line of a connection with "<pod> <line>", for as long as the
// connection lasts.
func serveEcho(t *testing.T, tp *nstest.Topology, i int) {
	t.Helper()
	var ln net.Listener
	if err := tp.Do(tp.PodNS(i), func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", echoPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	label := fmt.Sprintf("pod-%d", i)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", label, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// longConn is one TCP connection from the client to the long Service,
// kept open across the switch.
type longConn struct {
	c       net.Conn
	r       *bufio.Reader
	backend string
}

func openLong(t *testing.T, tp *nstest.Topology) *longConn {
	t.Helper()
	var c net.Conn
	if err := tp.Do(tp.ClientNS(), func() error {
		var err error
		c, err = net.DialTimeout("tcp", longIP+":90", 3*time.Second)
		return err
	}); err != nil {
		t.Fatalf("opening the long-lived connection: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l := &longConn{c: c, r: bufio.NewReader(c)}
	l.backend = l.exchange(t, "hello")
	return l
}

// exchange sends line and returns the backend that echoed it.
func (l *longConn) exchange(t *testing.T, line string) string {
	t.Helper()
	if err := l.c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintln(l.c, line); err != nil {
		t.Fatalf("long-lived connection, sending %q: %v", line, err)
	}
	reply, err := l.r.ReadString('\n')
	if err != nil {
		t.Fatalf("long-lived connection, reading the echo of %q: %v", line, err)
	}
	backend, echoed, _ := strings.Cut(strings.TrimSpace(reply), " ")
	if echoed != line {
		t.Fatalf("long-lived connection echoed %q, want %q", reply, line)
	}
	if l.backend != "" && backend != l.backend {
		t.Fatalf("long-lived connection moved from %s to %s: its NAT binding changed", l.backend, backend)
	}
	return backend
}

// nodeGet fetches path from the agent's loopback endpoints in the node
// namespace: the connection is made there, by hand, since net/http dials
// on goroutines of its own (in the test's namespace).
func nodeGet(tp *nstest.Topology, hostPort, path string) (int, string, error) {
	var status int
	var body string
	err := tp.Do(tp.NodeNS(), func() error {
		c, err := net.DialTimeout("tcp", hostPort, 2*time.Second)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		if err := c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, hostPort); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		status, body = resp.StatusCode, string(b)
		return err
	})
	return status, body, err
}

// requireModes skips unless the tools of every mode named are installed.
func requireModes(t *testing.T, refs ...modeRef) {
	t.Helper()
	for _, r := range refs {
		tool := "nft"
		if r.mode == "iptables" {
			tool = xtables.BinariesOf(dataplane.IPv4, xtables.Backend(r.backend)).Restore
		}
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed, so %s cannot be tested: apt-get install -y iptables nftables", tool, r)
		}
	}
}

// removedMetric matches the sweep's counter in /metrics.
var removedMetric = regexp.MustCompile(`proxyplane_agent_leftover_objects_removed_total\{mode="([a-z]+)"\} ([0-9]+)`)

// TestSwitchModesLive switches a node between each pair of modes and
// backends this kernel has, under traffic, and checks that no connection
// failed, that the long-lived one kept its backend, that nothing of the
// old mode is left, and that the agent's healthz and metrics told the
// truth. IPVS, which this kernel lacks, is TestSwitchToIPVSRefused's and
// the ipvs package's fakes'.
func TestSwitchModesLive(t *testing.T) {
	nstest.RequireRoot(t)
	for _, tt := range []struct{ from, to modeRef }{
		{iptablesNFT, nftablesMode},
		{nftablesMode, iptablesNFT},
		{iptablesLegacy, iptablesNFT},
		{iptablesNFT, iptablesLegacy},
		{nftablesMode, iptablesLegacy},
		{iptablesLegacy, nftablesMode},
	} {
		t.Run(tt.from.String()+"-to-"+tt.to.String(), func(t *testing.T) {
			requireModes(t, tt.from, tt.to)
			switchLive(t, tt.from, tt.to, false)
		})
	}
}

// TestSwitchModesCrashMidway kills the new agent in the middle of its
// removal of the old mode's rules (SIGKILL, as a power loss): the node
// keeps forwarding on the rules left, and the next start finishes the
// job.
func TestSwitchModesCrashMidway(t *testing.T) {
	nstest.RequireRoot(t)
	requireModes(t, iptablesNFT, nftablesMode)
	switchLive(t, iptablesNFT, nftablesMode, true)
}

// switchLive runs from's agent, then to's on the same state directory,
// under traffic; with crash, to's first agent dies midway through its
// removal of from's rules and a second one finishes it.
func switchLive(t *testing.T, from, to modeRef, crash bool) {
	t.Helper()
	tp := dptest.KernelTopology(t)
	for i := range 2 {
		serveEcho(t, tp, i)
	}
	stateDir := t.TempDir()
	writeCache(t, tp, stateDir)

	old := startAgent(t, tp, from, stateDir)
	if !waitFor(30*time.Second, func() bool {
		_, err := tp.DialTCP(tp.ClientNS(), webIP+":80", time.Second)
		return err == nil && rulesOf(t, tp, from) != ""
	}) {
		t.Fatalf("the %s agent did not program its cached table in 30s", from)
	}
	ps, stopProbes := probes(tp)
	defer stopProbes()
	long := openLong(t, tp)
	if !progressed(ps, make([]int64, len(ps)), 20, 30*time.Second) {
		t.Fatalf("the probes did not get going under %s", from)
	}
	long.exchange(t, "under-"+from.String())

	// The rollout: the old pod stops (its rules stay: an agent never
	// flushes at exit), the new one starts on the same state directory.
	old.stop(t)
	if rulesOf(t, tp, from) == "" {
		t.Fatalf("the %s agent removed its rules on exit", from)
	}
	var agent *agentProc
	if crash {
		agent = startAgent(t, tp, to, stateDir, failpoint.Env+"="+failpoint.MidSweep)
		if !agent.exited(30 * time.Second) {
			t.Fatal("the agent did not reach the mid-sweep failpoint in 30s")
		}
		left := rulesOf(t, tp, from)
		if left == "" || rulesOf(t, tp, to) == "" {
			t.Fatalf("after the crash: %s holds %q, %s holds %q; want both in part", from, left, to, rulesOf(t, tp, to))
		}
		t.Logf("after the crash, %d lines of %s's rules are left", strings.Count(left, "\n"), from)
		before := counts(ps)
		if !progressed(ps, before, 20, 30*time.Second) {
			t.Fatal("the node stopped forwarding after the crash")
		}
		long.exchange(t, "after-crash")
	}
	agent = startAgent(t, tp, to, stateDir)
	if !waitFor(30*time.Second, func() bool { return rulesOf(t, tp, to) != "" && rulesOf(t, tp, from) == "" }) {
		t.Fatalf("30s after the %s agent started, %s holds:\n%s\nand %s:\n%s\nwhole ruleset:\n%s",
			to, from, rulesOf(t, tp, from), to, rulesOf(t, tp, to), wholeRuleset(tp))
	}
	// Established under from's DNAT, the connection goes on under to's
	// rules alone: the kernel keeps its conntrack entry's NAT binding.
	long.exchange(t, "under-"+to.String())
	before := counts(ps)
	if !progressed(ps, before, 20, 30*time.Second) {
		t.Fatalf("the probes stalled under %s alone", to)
	}
	long.exchange(t, "still-under-"+to.String())
	stopProbes()

	for _, p := range ps {
		t.Logf("%s probe of %s: %d connections, %d failed", p.name, p.addr, p.ok.Load(), p.failed.Load())
		if n := p.failed.Load(); n != 0 {
			t.Errorf("%s probe: %d of %d connections failed across the switch, first: %q", p.name, n, n+p.ok.Load(), p.errs)
		}
	}

	status, body, err := nodeGet(tp, "127.0.0.1:10256", "/healthz")
	if err != nil || status != http.StatusOK {
		t.Errorf("the %s agent's /healthz: %d %q %v, want 200", to, status, body, err)
	}
	_, metrics, err := nodeGet(tp, "127.0.0.1:10249", "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	removed := map[string]string{}
	for _, m := range removedMetric.FindAllStringSubmatch(metrics, -1) {
		removed[m[1]] = m[2]
	}
	if n := removed[from.mode]; (n == "" || n == "0") && !crash {
		t.Errorf("proxyplane_agent_leftover_objects_removed_total{mode=%q} = %q, want what it removed", from.mode, n)
	}
	if n := removed[to.mode]; n != "" && n != "0" && from.mode != to.mode {
		t.Errorf("the %s agent counts %s objects of its own mode as removed", to, n)
	}

	if from.backend != "legacy" && to.backend != "legacy" {
		// Looking for legacy leftovers must not create legacy tables on
		// a node that never used them.
		for _, f := range []string{"/proc/net/ip_tables_names", "/proc/net/ip6_tables_names"} {
			out, _ := tp.Exec(tp.NodeNS(), "cat", f)
			if hasLegacyTable(string(out)) {
				t.Errorf("legacy iptables tables appeared in %s: %q", f, out)
			}
		}
	}

	// Its own rules came through its sweep whole: a restart, whose first
	// sync rewrites them and whose sweep finds nothing, changes nothing.
	own := ownRuleset(t, tp, to)
	agent.stop(t)
	startAgent(t, tp, to, stateDir)
	var metricsAgain string
	if !waitFor(30*time.Second, func() bool {
		_, metricsAgain, err = nodeGet(tp, "127.0.0.1:10249", "/metrics")
		return err == nil && strings.Contains(metricsAgain, "proxyplane_agent_applied_version_info{")
	}) {
		t.Fatalf("the restarted %s agent did not sync in 30s", to)
	}
	if again := ownRuleset(t, tp, to); again != own {
		t.Errorf("the %s rules after the switch differ from those a restart writes: the sweep removed some of its own\nafter the switch:\n%s\nafter a restart:\n%s", to, own, again)
	}
	for _, m := range removedMetric.FindAllStringSubmatch(metricsAgain, -1) {
		if m[2] != "0" {
			t.Errorf("the restarted agent removed %s objects of %s: the switch had not finished", m[2], m[1])
		}
	}
}

// ownRuleset is everything of ref's mode in the node namespace, its
// iptables lines or its nftables tables whole, as sorted lines: a
// restart may recreate chains in another order.
func ownRuleset(t *testing.T, tp *nstest.Topology, ref modeRef) string {
	t.Helper()
	var b strings.Builder
	if ref.mode != "nftables" {
		b.WriteString(rulesOf(t, tp, ref))
	}
	for _, family := range []string{"ip", "ip6"} {
		if ref.mode != "nftables" {
			break
		}
		out, err := tp.Exec(tp.NodeNS(), "nft", "list", "table", family, "proxyplane")
		if err != nil {
			t.Fatalf("nft list table %s proxyplane: %v", family, err)
		}
		b.WriteString("table " + family + "\n")
		b.Write(out)
	}
	var lines []string
	for line := range strings.SplitSeq(b.String(), "\n") {
		if line = strings.TrimSpace(line); line != "" && line != "}" {
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// TestSwitchToIPVSRefused starts the agent in IPVS mode, which this
// kernel lacks, on a node that iptables mode programmed: the agent exits
// non-zero at once, naming what is missing, and the iptables rules stay
// in force, never a node with no rules.
func TestSwitchToIPVSRefused(t *testing.T) {
	nstest.RequireRoot(t)
	requireModes(t, iptablesNFT)
	if err := ipvs.CheckKernel(); err == nil {
		t.Skip("this kernel has IPVS; the refusal needs one without it")
	}
	tp := dptest.KernelTopology(t)
	for i := range 2 {
		serveEcho(t, tp, i)
	}
	stateDir := t.TempDir()
	writeCache(t, tp, stateDir)
	old := startAgent(t, tp, iptablesNFT, stateDir)
	if !waitFor(30*time.Second, func() bool {
		_, err := tp.DialTCP(tp.ClientNS(), webIP+":80", time.Second)
		return err == nil
	}) {
		t.Fatal("the iptables agent did not program its cached table in 30s")
	}
	old.stop(t)
	before := rulesOf(t, tp, iptablesNFT)
	long := openLong(t, tp)

	agent := startAgent(t, tp, modeRef{"ipvs", "nft"}, stateDir)
	if !agent.exited(30 * time.Second) {
		t.Fatal("the IPVS agent is still running on a kernel without IPVS")
	}
	var ee *exec.ExitError
	if !errors.As(agent.err, &ee) || ee.ExitCode() == 0 {
		t.Errorf("the IPVS agent exited with %v, want non-zero", agent.err)
	}
	b, _ := os.ReadFile(agent.log)
	if !strings.Contains(string(b), "agent failed") || !strings.Contains(string(b), "CONFIG_IP_VS") {
		t.Errorf("the IPVS agent's log does not name what is missing:\n%s", tail(string(b), 20))
	}
	if after := rulesOf(t, tp, iptablesNFT); after != before {
		t.Errorf("the refused IPVS agent changed the iptables rules:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	long.exchange(t, "after-the-refusal")
	dptest.SpreadOver(t, tp, tp.ClientNS(), webIP+":80", 10, "pod-0", "pod-1")
}
