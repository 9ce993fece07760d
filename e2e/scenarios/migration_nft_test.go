package scenarios

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/e2e/box"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// testMigrationNFT replaces upstream kube-proxy in nftables mode by the
// proxyplane agent (iptables mode, nft backend) on node-0 and back, as
// docs/migration.md tells operators to, under the probes of
// testMigration: the newcomer starts beside the old proxy, the old one is
// stopped, then cleaned. No probe connection may fail, connections opened
// before a switch must outlive the old rules, and after each cleanup
// nothing of the old proxy may be left (kube-proxy's nftables tables; the
// PP- chains and proxyplane tables).
//
// Which rules answer a new connection while both are in is not a matter
// of jump order here: kube-proxy's nat chains (table ip/ip6 kube-proxy)
// and iptables-nft's (table ip/ip6 nat) are base chains of their own on
// the same hooks at the same priority (dstnat, -100). The kernel runs the
// NAT chains of a hook in priority order and, at equal priority, the one
// registered last first (nf_hook_entries_grow inserts a hook before the
// first of equal or higher priority); the first that binds the
// connection ends NAT for it. So the chains created last answer, whoever
// started last: the scenario works out which from what is in the kernel
// when each proxy starts, and checks it: in iptables mode with the
// counter of the agent's rule for the ClusterIP (kube-proxy's nftables
// rules have no counters; a connection the agent's rule did not count,
// with no failure, was DNATed by kube-proxy's, the only other NAT rule
// for it), in nftables mode, where neither has counters, with the
// kernel's nftables tracing.
//
// It runs twice: with the agent in iptables mode, as deploy/ runs it, and
// in nftables mode (set in its copy of the ConfigMap's file, as in
// testModeSwitch), whose tables ip/ip6 proxyplane hook at dstnat too.
func (e *env) testMigrationNFT(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run("agent-"+mode, func(t *testing.T) { e.migrateFromNFT(t, mode) })
	}
}

// migrateFromNFT is testMigrationNFT with the agent in agentMode.
func (e *env) migrateFromNFT(t *testing.T, agentMode string) { //nolint:thelper // a subtest's body: failures point into it
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
	// Runs last: node-0's kube-proxy in the box's default mode again.
	defer func() {
		if err := kp.SetMode("iptables"); err != nil {
			t.Error(err)
		}
	}()
	defer restoreAfterMigration(t, b, kp, a, strings.TrimSpace(string(localnet)))
	config := agentConfig(t, a)
	original, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(modeLine.Find(original)), "iptables") {
		t.Skipf("the agent's configuration is not in iptables mode (%q): this scenario starts from deploy/'s default", modeLine.Find(original))
	}
	// Runs before restoreAfterMigration, which starts the agent again if
	// it is stopped; one still running in another mode is rolled back.
	defer func() {
		if err := os.WriteFile(config, original, 0o600); err != nil {
			t.Errorf("restoring %s: %v", config, err)
		}
		if agentMode != "iptables" && a.Running() {
			if err := a.Restart(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("restarting %s in iptables mode: %v", a.Name(), err)
			}
		}
	}()
	defer func() {
		if !t.Failed() {
			return
		}
		out, _ := tp.Exec(ns, "nft", "list", "ruleset")
		t.Logf("nft list ruleset in %s:\n%s", node.Name(), out)
	}()

	mt := programmedMigrationService(ctx, t, b, node)
	clusterAddr, clusterIP, nodePortAddr, echoAddr := mt.clusterAddr, mt.clusterIP, mt.nodePortAddr, mt.echoAddr

	// 1. The node as kube-proxy in nftables mode runs it.
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := tp.Exec(ns, a.Args()[0], "--cleanup"); err != nil {
		t.Fatalf("nodeagent --cleanup: %v\n%s", err, out)
	}
	assertNoChains(t, tp, ns, "after nodeagent --cleanup", "PP-")
	assertTables(t, tp, ns, "after nodeagent --cleanup", "proxyplane", false)
	// iptables-nft's nat base chains outlive the agent's cleanup (it
	// deletes its own chains, not the built-in ones): if they are there,
	// kube-proxy's, created next, run before them.
	natFirst := iptablesNATChains(t, tp, ns)
	figure(t, "migration-nft-hook-order", "iptables-nft nat base chains before kube-proxy starts=%v", natFirst)
	if err := kp.SetMode("nftables"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := kp.Start(); err != nil {
		t.Fatal(err)
	}
	if err := kp.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	// kube-proxy syncs one family after the other; its metrics tell of
	// the first.
	if err := box.Eventually(ctx, func() error { return tables(tp, ns, "kube-proxy", true) }); err != nil { //nolint:contextcheck
		t.Fatalf("kube-proxy in nftables mode: %v", err)
	}
	for _, from := range []string{tp.ClientNS(), ns} {
		for _, addr := range []string{clusterAddr, nodePortAddr} {
			if err := b.WaitTraffic(ctx, from, addr, ""); err != nil {
				t.Fatalf("through kube-proxy (nftables) alone: %v\n%s", err, kp.LogTail(20))
			}
		}
	}
	figure(t, "migration-nft-kube-proxy-ready", "node=%s took=%s (start to first sync and traffic)", node.Name(), ms(time.Since(start)))

	// 2. Steady probes for the whole migration, there and back.
	podNS := tp.PodNS(podOn(b, k))
	probes := startPathProbes(t, b, "migration-nft-probe", "agent-mode="+agentMode+" ", "during the migration",
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
	// answers checks which rules answer new connections to the ClusterIP
	// from outside (PREROUTING) and from the node (OUTPUT) over the
	// probes' next dials: the agent's (agent) or kube-proxy's.
	answers := func(when string, agent bool) {
		t.Helper()
		if agentMode == "nftables" {
			traceAnswers(ctx, t, tp, ns, clusterIP, box.ServicePort, when, agent, probes.probe(0), probes.probe(2))
			return
		}
		counted := ppClusterIPHits(ctx, t, tp, ns, clusterIP, probes.probe(0), probes.probe(2))
		who := map[bool]string{true: "proxyplane", false: "kube-proxy"}
		figure(t, "migration-nft-new-connections", "when=%q pp-rule-counted=%d answered-by=%s", when, counted, who[counted > 0])
		// A dial in flight when counting began may have been DNATed
		// before: at least answerDials-1 of each probe's fall in.
		if want := uint64(2 * (answerDials - 1)); agent && counted < want || !agent && counted != 0 {
			t.Errorf("%s: the agent's rule for %s counted %d new connections from outside and from the node over %d dials of each; want every one answered by %s", when, clusterIP, counted, answerDials, who[agent])
		}
	}

	// 3. kube-proxy (nftables) -> proxyplane.
	echoes := openEchoes(ctx, t, b, echoAddr, tp.ClientNS(), ns, podNS)
	if agentMode != "iptables" {
		if err := os.WriteFile(config, modeLine.ReplaceAll(original, []byte("mode: "+agentMode)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	// The agent acknowledges only what it has programmed.
	if _, err := b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if agentMode == "iptables" {
		waitPPRule(ctx, t, tp, a.Process, ns, clusterIP)
	} else {
		assertTables(t, tp, ns, "the agent in nftables mode synced", "proxyplane", true)
	}
	programmed := time.Since(start)
	if !a.Running() {
		t.Fatalf("%s exited beside kube-proxy:\n%s", a.Name(), a.LogTail(20))
	}
	if err := kp.Synced(ctx); err != nil {
		t.Fatalf("10249 beside kube-proxy: %v", err)
	}
	// The log holds every run of the agent: count in this one's.
	run := a.LogTail(200)
	run = run[strings.LastIndex(run, "=== ")+1:]
	if n := strings.Count(run, "port in use"); n != 2 {
		t.Errorf("the agent logged %d ports in use beside kube-proxy, want 2 (10256 and 10249):\n%s", n, a.LogTail(20))
	}
	// Both rule sets are in. In iptables mode kube-proxy's chains,
	// registered after iptables-nft's, answer (the agent's would if
	// iptables-nft's nat chains had been created after kube-proxy's); in
	// nftables mode the agent's table is the newest.
	agentFirst := !natFirst || agentMode == "nftables"
	answers("both running, agent started last", agentFirst)
	// The agent's start-time sweep took nothing of kube-proxy's.
	assertTables(t, tp, ns, "after the agent's first sync beside kube-proxy", "kube-proxy", true)
	portsAfter := stopKubeProxyForAgent(ctx, t, kp, a)
	figure(t, "migration-nft-ports", "to=proxyplane node=%s served-after=%s", node.Name(), ms(portsAfter))
	// kube-proxy's rules stay in the kernel when it stops, and answer as
	// before until they are removed.
	answers("kube-proxy stopped, its table in place", agentFirst)
	cleanedAt := time.Now()
	if out, err := kp.Cleanup(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cleanup := time.Since(cleanedAt)
	assertTables(t, tp, ns, "after kube-proxy --cleanup", "kube-proxy", false)
	assertNoChains(t, tp, ns, "after kube-proxy --cleanup", "KUBE-", kubeletChains...)
	if agentMode == "iptables" {
		assertHasChain(t, tp, ns, "after kube-proxy --cleanup", "PP-SERVICES")
	} else {
		assertTables(t, tp, ns, "after kube-proxy --cleanup", "proxyplane", true)
	}
	answers("kube-proxy cleaned", true)
	// The hand-over is kube-proxy's table going, in one transaction.
	figure(t, "migration-nft-takeover", "agent-mode=%s to=proxyplane node=%s programmed-and-acked=%s kube-proxy-cleanup=%s", agentMode, node.Name(), ms(programmed), ms(cleanup))
	echoes.exchange(t, "after kube-proxy's nftables rules were removed")
	waitProbes(10)

	// 4. proxyplane -> kube-proxy (nftables).
	echoes = openEchoes(ctx, t, b, echoAddr, tp.ClientNS(), ns, podNS)
	start = time.Now()
	if err := kp.Start(); err != nil {
		t.Fatal(err)
	}
	waitKubeProxyNFT(ctx, t, tp, kp.Process, ns, clusterIP, mt.svc.Spec.Ports[0].Port)
	figure(t, "migration-nft-takeover", "agent-mode=%s to=kube-proxy node=%s rules-in=%s", agentMode, node.Name(), ms(time.Since(start)))
	// kube-proxy's chains are the newest on the hooks now (the agent's
	// syncs flush and refill its chains, never create them anew).
	answers("both running, kube-proxy started last", false)
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	if out, err := tp.Exec(ns, a.Args()[0], "--cleanup"); err != nil {
		t.Fatalf("nodeagent --cleanup: %v\n%s", err, out)
	}
	assertNoChains(t, tp, ns, "after nodeagent --cleanup", "PP-")
	assertTables(t, tp, ns, "after nodeagent --cleanup", "proxyplane", false)
	assertTables(t, tp, ns, "after nodeagent --cleanup", "kube-proxy", true)
	if err := kp.WaitSynced(ctx); err != nil {
		t.Fatalf("kube-proxy never took 10249 after the agent stopped: %v\n%s", err, kp.LogTail(20))
	}
	figure(t, "migration-nft-ports", "to=kube-proxy node=%s served-after=%s", node.Name(), ms(time.Since(stoppedAt)))
	echoes.exchange(t, "after proxyplane's rules were removed")
	waitProbes(10)
	probes.stop()
}

// answerDials is how many new connections each probe makes while
// ppClusterIPHits counts.
const answerDials = 5

// ppClusterIPHits returns how many new connections the agent's rule for
// TCP to clusterIP:box.ServicePort (in PP-SERVICES, IPv4 nat) counted
// over the next answerDials dials of each probe (and whatever other
// probes dialled meanwhile).
func ppClusterIPHits(ctx context.Context, t *testing.T, tp *nstest.Topology, ns, clusterIP string, probes ...*box.Probe) uint64 {
	t.Helper()
	// nstest bounds its own commands; it takes no context.
	before := serviceRuleHits(t, tp, ns, "PP-SERVICES", clusterIP, box.ServicePort) //nolint:contextcheck
	for _, p := range probes {
		if err := p.WaitDials(ctx, answerDials); err != nil {
			t.Fatal(err)
		}
	}
	return serviceRuleHits(t, tp, ns, "PP-SERVICES", clusterIP, box.ServicePort) - before //nolint:contextcheck
}

// iptablesNATChains reports whether iptables-nft's IPv4 nat table has its
// PREROUTING and OUTPUT base chains in ns.
func iptablesNATChains(t *testing.T, tp *nstest.Topology, ns string) bool {
	t.Helper()
	for _, c := range []string{"PREROUTING", "OUTPUT"} {
		if _, err := tp.Exec(ns, "nft", "list", "chain", "ip", "nat", c); err != nil {
			return false
		}
	}
	return true
}

// assertTables fails t unless the nftables tables named name in ns, in
// families ip and ip6, are there (want) or absent (!want).
func assertTables(t *testing.T, tp *nstest.Topology, ns, when, name string, want bool) {
	t.Helper()
	if err := tables(tp, ns, name, want); err != nil {
		t.Errorf("%s: %v", when, err)
	}
}

// tables returns an error unless the nftables tables named name in ns, in
// families ip and ip6, are there (want) or absent (!want).
func tables(tp *nstest.Topology, ns, name string, want bool) error {
	out, err := tp.Exec(ns, "nft", "list", "tables")
	if err != nil {
		return fmt.Errorf("nft list tables: %w\n%s", err, out)
	}
	var errs []error
	for _, family := range []string{"ip", "ip6"} {
		if has := strings.Contains(string(out), "table "+family+" "+name+"\n"); has != want {
			errs = append(errs, fmt.Errorf("table %s %s present=%v, want %v", family, name, has, want))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w; nft list tables:\n%s", errors.Join(errs...), out)
	}
	return nil
}

// waitPPRule waits until the agent's nat PREROUTING and OUTPUT jump to
// PP-SERVICES and it holds the rule for clusterIP, failing at once if the
// agent exits.
func waitPPRule(ctx context.Context, t *testing.T, tp *nstest.Topology, agent *box.Process, ns, clusterIP string) {
	t.Helper()
	exited := agent.Exited()
	// nstest bounds its own commands; it takes no context.
	err := box.Eventually(ctx, func() error { //nolint:contextcheck
		select {
		case <-exited:
			return box.Permanent(fmt.Errorf("%s exited: %w\n%s", agent.Name(), agent.ExitError(), agent.LogTail(20)))
		default:
		}
		save := saves(t, tp, ns, "nat", false)["iptables-nft-save"]
		for _, hook := range []string{"PREROUTING", "OUTPUT"} {
			if i, _ := ruleOrder(save, hook, "PP-SERVICES", ""); i < 0 {
				return fmt.Errorf("no jump from nat %s to PP-SERVICES yet", hook)
			}
		}
		if !strings.Contains(save, "-A PP-SERVICES -d "+clusterIP+"/32 ") {
			return fmt.Errorf("PP-SERVICES has no rule for %s yet", clusterIP)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for the agent's rules: %v", err)
	}
}

// waitKubeProxyNFT waits until kube-proxy's nftables map of Service IPs
// (table ip kube-proxy, map service-ips) holds clusterIP's TCP port:
// kube-proxy writes a sync in one nftables transaction, so its rules for
// the Service are whole from then on. It fails at once if kube-proxy
// exits.
func waitKubeProxyNFT(ctx context.Context, t *testing.T, tp *nstest.Topology, kp *box.Process, ns, clusterIP string, port int32) {
	t.Helper()
	exited := kp.Exited()
	elem := fmt.Sprintf("%s . tcp . %d ", clusterIP, port)
	err := box.Eventually(ctx, func() error { //nolint:contextcheck
		select {
		case <-exited:
			return box.Permanent(fmt.Errorf("%s exited: %w\n%s", kp.Name(), kp.ExitError(), kp.LogTail(20)))
		default:
		}
		out, err := tp.Exec(ns, "nft", "list", "map", "ip", "kube-proxy", "service-ips")
		if err != nil {
			return fmt.Errorf("nft list map ip kube-proxy service-ips: %w: %s", err, out)
		}
		if !strings.Contains(string(out), elem) {
			return fmt.Errorf("kube-proxy's service-ips has no %q yet", elem)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for kube-proxy's nftables rules: %v", err)
	}
}

// traceTable is the test's own nftables table, which marks for tracing
// the first packet of the connections traceAnswers watches; it neither
// drops nor translates anything.
const traceTable = "pp-e2e-trace"

// natTraceLine is a line of `nft monitor trace` from a dstnat base chain:
// trace id, table. Those of kube-proxy and of the agent's nftables mode
// are nat-prerouting and nat-output; iptables-nft's are table nat's
// PREROUTING and OUTPUT (not those of its other tables).
var natTraceLine = regexp.MustCompile(`^trace id (\S+) ip (nat (?:PREROUTING|OUTPUT)|\S+ nat-(?:prerouting|output)) `)

// traceAnswers checks, with the kernel's nftables tracing, which NAT
// chains DNAT new connections to ip:port over the next answerDials dials
// of each probe: the agent's (table proxyplane, when agent) or
// kube-proxy's. For each traced connection the last NAT table it met is
// the one that bound it (the kernel stops at the first that binds).
func traceAnswers(ctx context.Context, t *testing.T, tp *nstest.Topology, ns, ip string, port int, when string, agent bool, probes ...*box.Probe) {
	t.Helper()
	match := fmt.Sprintf("ip daddr %s tcp dport %d tcp flags & (syn | ack) == syn meta nftrace set 1", ip, port)
	rules := fmt.Sprintf("table ip %s {\n chain pre { type filter hook prerouting priority -300; %s; }\n chain out { type filter hook output priority -300; %s; }\n}\n", traceTable, match, match)
	// nstest bounds its own commands; it takes no context.
	if out, err := tp.Exec(ns, "nft", "-f", writeTemp(t, rules)); err != nil { //nolint:contextcheck
		t.Fatalf("adding the trace table: %v\n%s", err, out)
	}
	defer func() { //nolint:contextcheck // as above
		if out, err := tp.Exec(ns, "nft", "delete", "table", "ip", traceTable); err != nil {
			t.Errorf("deleting the trace table: %v\n%s", err, out)
		}
	}()
	// nstest runs commands to completion; the monitor runs until killed.
	mctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(mctx, "ip", "netns", "exec", ns, "nft", "monitor", "trace")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("nft monitor trace: %v", err)
	}
	var (
		wg   sync.WaitGroup
		last = map[string]string{} // by trace id: the last NAT table met
	)
	wg.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := natTraceLine.FindStringSubmatch(sc.Text()); m != nil {
				last[m[1]] = strings.Fields(m[2])[0]
			}
		}
	})
	// The monitor subscribes before it prints; a connection or two
	// before that goes untraced, which the count below allows.
	for _, p := range probes {
		if err := p.WaitDials(ctx, answerDials); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	_ = cmd.Wait()
	wg.Wait()
	byTable := map[string]int{}
	for _, table := range last {
		byTable[table]++
	}
	want, other := "kube-proxy", "proxyplane"
	if agent {
		want, other = other, want
	}
	figure(t, "migration-nft-new-connections", "when=%q traced-by-table=%v want=%s", when, byTable, want)
	if byTable[want] < answerDials || len(byTable) != 1 {
		t.Errorf("%s: new connections to %s:%d were DNATed by the NAT chains of tables %v; want every one by %s's (table %s), none by %s's", when, ip, port, byTable, want, want, other)
	}
}

// writeTemp writes s to a file that lives as long as t, and returns its
// path.
func writeTemp(t *testing.T, s string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "nft-*.conf")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
