package scenarios

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// Ports of the migration Service beside box.ServicePort: a long-lived
// TCP echo on every pod, for connections that must outlive a switch.
const (
	echoServicePort = 81
	echoPodPort     = 8090
)

// testMigration replaces upstream kube-proxy (v1.36.4, iptables mode, as
// kubeadm runs it) by the proxyplane agent on node-0 and back, the way
// docs/migration.md tells operators to, under steady probes through a
// ClusterIP and a NodePort from the client (which routes ClusterIPs via
// node-0), from node-0 itself and from a pod on node-0: the new process
// starts beside the old one, takes over once it has programmed its rules,
// then the old one is stopped and its rules cleaned. No probe connection
// may fail; connections opened before a switch must keep working after
// the old rules are gone; the kernel must hold only the expected chains
// after each cleanup; and the ports both serve (10256, 10249) must pass
// from one to the other.
func (e *env) testMigration(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	if _, err := b.KubeProxyBinary(); err != nil {
		t.Skip(err.Error())
	}
	const k = 0
	a := b.Agents[k]
	node := a.Node
	ns := node.NS()
	kp, err := b.KubeProxy(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	localnet, err := tp.Exec(ns, "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
	if err != nil {
		t.Fatalf("reading route_localnet: %v\n%s", err, localnet)
	}
	// Whatever happens, leave the box as it was: the agent running with
	// its arguments and its rules, kube-proxy stopped and cleaned.
	defer restoreAfterMigration(t, b, kp, a, strings.TrimSpace(string(localnet)))

	mt := programmedMigrationService(ctx, t, b, node)
	clusterAddr, clusterIP, nodePortAddr, echoAddr := mt.clusterAddr, mt.clusterIP, mt.nodePortAddr, mt.echoAddr

	// 1. The node as kube-proxy runs it: no agent, no proxyplane rule.
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := tp.Exec(ns, a.Args()[0], "--cleanup"); err != nil {
		t.Fatalf("nodeagent --cleanup: %v\n%s", err, out)
	}
	assertNoChains(t, tp, ns, "after nodeagent --cleanup", "PP-")
	start := time.Now()
	if err := kp.Start(); err != nil {
		t.Fatal(err)
	}
	if err := kp.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{tp.ClientNS(), ns} {
		for _, addr := range []string{clusterAddr, nodePortAddr} {
			if err := b.WaitTraffic(ctx, from, addr, ""); err != nil {
				t.Fatalf("through kube-proxy alone: %v\n%s", err, kp.LogTail(20))
			}
		}
	}
	figure(t, "migration-kube-proxy-ready", "node=%s took=%s (start to first sync and traffic)", node.Name(), ms(time.Since(start)))

	// 2. Steady probes for the whole migration, there and back.
	podNS := tp.PodNS(podOn(b, k))
	probes := startPathProbes(t, b, "migration-probe", "", "during the migration",
		probePath{"client->clusterip", tp.ClientNS(), clusterAddr},
		probePath{"client->nodeport", tp.ClientNS(), nodePortAddr},
		probePath{node.Name() + "->clusterip", ns, clusterAddr},
		probePath{node.Name() + "->nodeport", ns, nodePortAddr},
		probePath{podName(podOn(b, k)) + "->clusterip", podNS, clusterAddr},
	)
	defer probes.stop()
	waitProbes := func(n int) {
		t.Helper()
		probes.wait(ctx, n)
	}
	waitProbes(5)
	counts := func(chain string) uint64 { return serviceRuleHits(t, tp, ns, chain, clusterIP, box.ServicePort) }
	if counts("KUBE-SERVICES") == 0 {
		t.Fatal("kube-proxy's rule for the ClusterIP counted no connection while it alone ran")
	}

	// 3. kube-proxy -> proxyplane.
	echoes := openEchoes(ctx, t, b, echoAddr, tp.ClientNS(), ns, podNS)
	start = time.Now()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	takeover := waitTakeover(ctx, t, tp, a.Process, ns, "PP-SERVICES", "KUBE-SERVICES", clusterIP)
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if !a.Running() {
		t.Fatalf("%s exited beside kube-proxy:\n%s", a.Name(), a.LogTail(20))
	}
	// kube-proxy still holds the ports: the agent waits for them.
	if err := kp.Synced(ctx); err != nil {
		t.Fatalf("10249 beside kube-proxy: %v", err)
	}
	if n := strings.Count(a.LogTail(200), "port in use"); n != 2 {
		t.Errorf("the agent logged %d ports in use beside kube-proxy, want 2 (10256 and 10249):\n%s", n, a.LogTail(20))
	}
	newConnsGo(ctx, t, probes.probe(0), counts, "PP-SERVICES", "KUBE-SERVICES")
	figure(t, "migration-takeover", "to=proxyplane node=%s rules-on-top=%s programmed-and-acked=%s", node.Name(), ms(takeover), ms(time.Since(start)))

	portsAfter := stopKubeProxyForAgent(ctx, t, kp, a)
	figure(t, "migration-ports", "to=proxyplane node=%s served-after=%s", node.Name(), ms(portsAfter))
	if out, err := kp.Cleanup(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	assertNoChains(t, tp, ns, "after kube-proxy --cleanup", "KUBE-", kubeletChains...)
	assertHasChain(t, tp, ns, "after kube-proxy --cleanup", "PP-SERVICES")
	echoes.exchange(t, "after kube-proxy's rules were removed")
	waitProbes(10)

	// 4. proxyplane -> kube-proxy.
	echoes = openEchoes(ctx, t, b, echoAddr, tp.ClientNS(), ns, podNS)
	if err := kp.Start(); err != nil {
		t.Fatal(err)
	}
	takeover = waitTakeover(ctx, t, tp, kp.Process, ns, "KUBE-SERVICES", "PP-SERVICES", clusterIP)
	if !kp.Running() {
		t.Fatalf("kube-proxy exited beside the agent:\n%s", kp.LogTail(20))
	}
	newConnsGo(ctx, t, probes.probe(0), counts, "KUBE-SERVICES", "PP-SERVICES")
	figure(t, "migration-takeover", "to=kube-proxy node=%s rules-on-top=%s", node.Name(), ms(takeover))
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	if out, err := tp.Exec(ns, a.Args()[0], "--cleanup"); err != nil {
		t.Fatalf("nodeagent --cleanup: %v\n%s", err, out)
	}
	assertNoChains(t, tp, ns, "after nodeagent --cleanup", "PP-")
	assertHasChain(t, tp, ns, "after nodeagent --cleanup", "KUBE-SERVICES")
	// kube-proxy retries its ports every 5 s.
	if err := kp.WaitSynced(ctx); err != nil {
		t.Fatalf("kube-proxy never took 10249 after the agent stopped: %v\n%s", err, kp.LogTail(20))
	}
	figure(t, "migration-ports", "to=kube-proxy node=%s served-after=%s", node.Name(), ms(time.Since(stoppedAt)))
	echoes.exchange(t, "after proxyplane's rules were removed")
	waitProbes(10)
	probes.stop()
}

// kubeletChains are the chains kube-proxy creates for the kubelet (its
// iptablesKubeletJumpChains) and leaves on --cleanup on purpose.
var kubeletChains = []string{"KUBE-FIREWALL"}

// restoreAfterMigration leaves node k as the box had it: kube-proxy
// stopped and cleaned, kubelet's chain it made removed (the box has no
// kubelet), route_localnet as it was (kube-proxy sets it for localhost
// NodePorts), and the agent running and current.
func restoreAfterMigration(t *testing.T, b *box.Box, kp *box.KubeProxy, a *box.Agent, localnet string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), scenarioTimeout)
	defer cancel()
	tp := b.Topology()
	ns := a.Node.NS()
	if err := kp.Stop(ctx); err != nil {
		t.Error(err)
	}
	if out, err := kp.Cleanup(); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
	for _, ipt := range []string{"iptables-nft", "ip6tables-nft"} {
		for _, c := range kubeletChains {
			// Absent when kube-proxy never ran: errors say only that.
			_, _ = tp.Exec(ns, ipt, "-t", "filter", "-D", "INPUT", "-j", c)
			_, _ = tp.Exec(ns, ipt, "-t", "filter", "-D", "OUTPUT", "-j", c)
			_, _ = tp.Exec(ns, ipt, "-t", "filter", "-F", c)
			_, _ = tp.Exec(ns, ipt, "-t", "filter", "-X", c)
		}
	}
	assertNoChains(t, tp, ns, "after restoring the box", "KUBE-")
	if out, err := tp.Exec(ns, "sysctl", "-w", "net.ipv4.conf.all.route_localnet="+localnet); err != nil {
		t.Errorf("restoring route_localnet: %v\n%s", err, out)
	}
	if !a.Running() {
		if err := a.Start(); err != nil {
			t.Error(err)
			return
		}
	}
	if err := a.WaitServing(ctx); err != nil {
		t.Error(err)
	}
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Error(err)
	}
}

// migrationService creates Service "migration" (NodePort, box.NewService's
// ports plus a TCP echo port) with an endpoint on every pod, each of which
// gets an echo server; it deletes them when t ends.
func migrationService(ctx context.Context, t *testing.T, b *box.Box) *corev1.Service {
	t.Helper()
	tp := b.Topology()
	pods := make([]int, tp.Pods())
	for i := range pods {
		pods[i] = i
		serveEcho(t, tp, tp.PodNS(i))
	}
	svc := box.NewService("migration")
	svc.Spec.Type = corev1.ServiceTypeNodePort
	svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
		Name: "echo", Protocol: corev1.ProtocolTCP, Port: echoServicePort, TargetPort: intstr.FromInt32(echoPodPort),
	})
	created, err := b.Admin().CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: box.FieldManager})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		if err := b.Admin().CoreV1().Services(created.Namespace).Delete(ctx, created.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting Service migration: %v", err)
		}
		if err := b.Admin().DiscoveryV1().EndpointSlices(created.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + created.Name}); err != nil {
			t.Errorf("deleting migration's EndpointSlices: %v", err)
		}
	})
	for _, s := range b.EndpointSlices(created, time.Now(), pods...) {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{
			Name: ptr.To("echo"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](echoPodPort),
		})
		if _, err := b.Admin().DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: box.FieldManager}); err != nil {
			t.Fatal(err)
		}
	}
	return created
}

// serveEcho serves a line echo on echoPodPort in namespace ns until t
// ends: one connection lives as long as its client keeps it.
func serveEcho(t *testing.T, tp *nstest.Topology, ns string) {
	t.Helper()
	var ln net.Listener
	if err := tp.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", ":"+strconv.Itoa(echoPodPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex // guards conns
	conns := map[net.Conn]bool{}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer func() { _ = c.Close() }()
				_, _ = io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// echoes are long-lived connections to the echo port, one per namespace.
type echoes struct {
	conns map[string]net.Conn // by origin
	n     int
}

// openEchoes opens a connection to addr from each namespace and checks
// that it echoes; they close when t ends.
func openEchoes(ctx context.Context, t *testing.T, b *box.Box, addr string, from ...string) *echoes {
	t.Helper()
	e := &echoes{conns: map[string]net.Conn{}}
	for _, ns := range from {
		var c net.Conn
		if err := b.Topology().Do(ns, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: probeTimeout}).DialContext(ctx, "tcp", addr)
			return err
		}); err != nil {
			t.Fatalf("opening a long-lived connection to %s from %s: %v", addr, ns, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		e.conns[ns] = c
	}
	e.exchange(t, "when opened")
	return e
}

// exchange sends a line on every connection and expects it back.
func (e *echoes) exchange(t *testing.T, when string) {
	t.Helper()
	e.n++
	for ns, c := range e.conns {
		msg := fmt.Sprintf("line %d from %s\n", e.n, ns)
		err := c.SetDeadline(time.Now().Add(probeTimeout))
		if err == nil {
			_, err = io.WriteString(c, msg)
		}
		var got string
		if err == nil {
			got, err = bufio.NewReader(io.LimitReader(c, int64(len(msg)))).ReadString('\n')
		}
		if err != nil || got != msg {
			t.Errorf("long-lived connection from %s to %s %s: got %q, %v", ns, c.RemoteAddr(), when, got, err)
		}
	}
	figure(t, "migration-long-lived", "connections=%d exchange=%q", len(e.conns), when)
}

// saves returns iptables-nft-save of table for both families in ns: the
// backend kube-proxy's plain `iptables` and the box's agents use here.
func saves(t *testing.T, tp *nstest.Topology, ns, table string, counters bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		args := []string{"-t", table}
		if counters {
			args = append(args, "-c")
		}
		b, err := tp.Exec(ns, save, args...)
		if err != nil {
			t.Fatalf("%s -t %s: %v\n%s", save, table, err, b)
		}
		out[save] = string(b)
	}
	return out
}

// assertNoChains fails t if a chain starting with prefix, other than
// except, is declared in nat, filter or mangle of either family in ns.
func assertNoChains(t *testing.T, tp *nstest.Topology, ns, when, prefix string, except ...string) {
	t.Helper()
	for _, table := range []string{"nat", "filter", "mangle"} {
		for save, out := range saves(t, tp, ns, table, false) {
			for line := range strings.Lines(out) {
				if !strings.HasPrefix(line, ":"+prefix) {
					continue
				}
				chain := strings.Fields(line[1:])[0]
				if !slices.Contains(except, chain) {
					t.Errorf("%s: %s -t %s declares %s", when, save, table, chain)
				}
			}
		}
	}
}

// assertHasChain fails t unless IPv4 nat in ns declares chain: the rules
// of the proxy left running are still there.
func assertHasChain(t *testing.T, tp *nstest.Topology, ns, when, chain string) {
	t.Helper()
	if out := saves(t, tp, ns, "nat", false)["iptables-nft-save"]; !strings.Contains(out, "\n:"+chain+" ") {
		t.Errorf("%s: no %s chain in nat: the remaining proxy's rules are gone", when, chain)
	}
}

// ruleOrder returns the positions of the first jumps to a and to b in
// built-in chain from of IPv4 nat (-1 when absent).
func ruleOrder(save, from, a, b string) (int, int) {
	ia, ib, i := -1, -1, 0
	for line := range strings.Lines(save) {
		if !strings.HasPrefix(line, "-A "+from+" ") {
			continue
		}
		f := strings.Fields(line)
		switch target := f[len(f)-1]; {
		case target == a && ia < 0:
			ia = i
		case target == b && ib < 0:
			ib = i
		}
		i++
	}
	return ia, ib
}

// waitTakeover waits until, in node namespace ns, winner's jumps come
// before loser's in nat PREROUTING and OUTPUT (both present) and winner
// holds the rule for clusterIP: from then on new connections meet
// winner's rules first, and a DNAT there ends the nat table for them. It
// returns how long that took, and fails at once if newcomer exits.
func waitTakeover(ctx context.Context, t *testing.T, tp *nstest.Topology, newcomer *box.Process, ns, winner, loser, clusterIP string) time.Duration {
	t.Helper()
	start := time.Now()
	exited := newcomer.Exited()
	// nstest bounds its own commands; it takes no context.
	err := box.Eventually(ctx, func() error { //nolint:contextcheck
		select {
		case <-exited:
			return box.Permanent(fmt.Errorf("%s exited: %w\n%s", newcomer.Name(), newcomer.ExitError(), newcomer.LogTail(20)))
		default:
		}
		out, err := tp.Exec(ns, "iptables-nft-save", "-t", "nat")
		if err != nil {
			return fmt.Errorf("iptables-nft-save: %w: %s", err, out)
		}
		save := string(out)
		for _, hook := range []string{"PREROUTING", "OUTPUT"} {
			w, l := ruleOrder(save, hook, winner, loser)
			if w < 0 || l < 0 || w > l {
				return fmt.Errorf("nat %s: %s at %d, %s at %d", hook, winner, w, loser, l)
			}
		}
		if !strings.Contains(save, "-A "+winner+" -d "+clusterIP+"/32 ") {
			return fmt.Errorf("%s has no rule for %s yet", winner, clusterIP)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to take over from %s: %v", winner, loser, err)
	}
	return time.Since(start)
}

// serviceRuleHits returns the packet counter of chain's rule for TCP to
// ip:port in IPv4 nat of ns: the new connections it sent to the Service
// (nat sees only a connection's first packet).
func serviceRuleHits(t *testing.T, tp *nstest.Topology, ns, chain, ip string, port int) uint64 {
	t.Helper()
	re := regexp.MustCompile(`^\[(\d+):\d+\] -A ` + regexp.QuoteMeta(chain) + ` -d ` + regexp.QuoteMeta(ip) + `/32 -p tcp .*--dport ` + strconv.Itoa(port) + ` `)
	var n uint64
	for line := range strings.Lines(saves(t, tp, ns, "nat", true)["iptables-nft-save"]) {
		if m := re.FindStringSubmatch(line); m != nil {
			v, err := strconv.ParseUint(m[1], 10, 64)
			if err != nil {
				t.Fatalf("counter in %q: %v", line, err)
			}
			n += v
		}
	}
	return n
}

// newConnsGo checks that new connections meet winner's rules, not
// loser's: over the next dials of probe, winner's rule for the Service
// counts them and loser's counts none.
func newConnsGo(ctx context.Context, t *testing.T, probe *box.Probe, hits func(chain string) uint64, winner, loser string) {
	t.Helper()
	w0, l0 := hits(winner), hits(loser)
	const dials = 5
	if err := probe.WaitDials(ctx, dials); err != nil {
		t.Fatal(err)
	}
	w, l := hits(winner)-w0, hits(loser)-l0
	figure(t, "migration-new-connections", "winner=%s counted=%d loser=%s counted=%d", winner, w, loser, l)
	if w < dials || l != 0 {
		t.Errorf("over %d probe dials %s's rule counted %d new connections and %s's %d; want every one in %s's", dials, winner, w, loser, l, winner)
	}
}

// hasKey returns a WaitProgrammed check that the table holds Service key.
func hasKey(key string) func(string, *pb.Snapshot) error {
	return func(_ string, s *pb.Snapshot) error {
		for _, en := range s.GetEntries() {
			if en.GetKey() == key {
				return nil
			}
		}
		return fmt.Errorf("no entry %s", key)
	}
}

// probePath is a path a steady probe dials: from network namespace ns to
// addr, named for the figures and errors.
type probePath struct{ name, ns, addr string }

// pathProbes are steady probes of named paths for the whole of a
// scenario, in which no connection may fail.
type pathProbes struct {
	t *testing.T
	// figure names the figure each path's result is logged as, with
	// fields in front of the path's; during says when, in errors.
	figure, fields, during string
	paths                  []probePath
	probes                 []*box.Probe
	stopped                bool
}

// startPathProbes starts a probe on each path.
func startPathProbes(t *testing.T, b *box.Box, figure, fields, during string, paths ...probePath) *pathProbes {
	t.Helper()
	pp := &pathProbes{t: t, figure: figure, fields: fields, during: during, paths: paths}
	for _, p := range paths {
		pp.probes = append(pp.probes, b.StartProbe(p.ns, p.addr, probeInterval, probeTimeout, probeMaxDials))
	}
	return pp
}

// probe returns the probe of the i-th path.
func (pp *pathProbes) probe(i int) *box.Probe { return pp.probes[i] }

// wait waits until every probe has dialled n times.
func (pp *pathProbes) wait(ctx context.Context, n int) {
	pp.t.Helper()
	for _, p := range pp.probes {
		if err := p.WaitDials(ctx, n); err != nil {
			pp.t.Fatal(err)
		}
	}
}

// stop stops the probes, logs each path's figure and fails the test for
// any failed connection; calls after the first do nothing.
func (pp *pathProbes) stop() {
	if pp.stopped {
		return
	}
	pp.stopped = true
	for i, p := range pp.probes {
		r := p.Stop()
		figure(pp.t, pp.figure, "%spath=%s dials=%d failed=%d over=%s", pp.fields, pp.paths[i].name, r.Dials, r.Failures, ms(r.Duration))
		if r.Failures != 0 {
			pp.t.Errorf("probe %s: %d of %d connections failed %s; first: %v", pp.paths[i].name, r.Failures, r.Dials, pp.during, r.Errors)
		}
	}
}

// stopKubeProxyForAgent stops kp and waits until a, which ran beside it,
// serves kube-proxy's ports 10249 and 10256 as a connected agent; it
// returns how long after the stop that took.
func stopKubeProxyForAgent(ctx context.Context, t *testing.T, kp *box.KubeProxy, a *box.Agent) time.Duration {
	t.Helper()
	if err := kp.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	if err := box.Eventually(ctx, func() error {
		s, err := a.State(ctx)
		if err != nil {
			return err
		}
		if !s.Connected {
			return errors.New("10249 does not serve a connected agent's metrics yet")
		}
		_, err = a.Healthz(ctx)
		return err
	}); err != nil {
		t.Fatalf("the agent never took 10249 and 10256 after kube-proxy stopped: %v\n%s", err, a.LogTail(20))
	}
	return time.Since(stoppedAt)
}

// migrationTarget is the migration Service and the addresses the probes
// and echoes of a migration use through it.
type migrationTarget struct {
	svc                                            *corev1.Service
	clusterAddr, clusterIP, nodePortAddr, echoAddr string
}

// programmedMigrationService creates the migration Service and waits
// until every node holds it; the NodePort is node's.
func programmedMigrationService(ctx context.Context, t *testing.T, b *box.Box, node *nstest.Node) migrationTarget {
	t.Helper()
	svc := migrationService(ctx, t, b)
	clusterIP := svc.Spec.ClusterIPs[0]
	mt := migrationTarget{
		svc: svc, clusterAddr: box.ClusterAddr(svc), clusterIP: clusterIP,
		nodePortAddr: nstest.HostPort(node.IP(), int(svc.Spec.Ports[0].NodePort)),
		echoAddr:     net.JoinHostPort(clusterIP, strconv.Itoa(echoServicePort)),
	}
	if _, err := b.WaitProgrammed(ctx, hasKey(box.Namespace+"/"+svc.Name)); err != nil {
		t.Fatal(err)
	}
	return mt
}
