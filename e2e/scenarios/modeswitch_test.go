package scenarios

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/e2e/box"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// modeLine is the mode setting of the agent's KubeProxyConfiguration.
var modeLine = regexp.MustCompile(`(?m)^mode:.*$`)

// testModeSwitch switches node-0's agent from the mode deploy/ gives it
// (iptables) to nftables and back, as an operator does: the mode edited
// in the agent's configuration file (the ConfigMap's copy the box mounts
// for it) and the agent rolled (stopped, then started on the same state
// directory). Under steady probes through a ClusterIP and a NodePort from
// outside the cluster, from node-0 and from a pod on it, with long-lived
// connections opened before each switch, it checks that no connection
// fails, that the old mode's rules are gone (iptables-nft-save, nft list
// tables) and the agent's metrics count them, and that the agent is
// healthy and current after each switch.
func (e *env) testModeSwitch(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	const k = 0
	a := b.Agents[k]
	node := a.Node
	ns := node.NS()
	config := agentConfig(t, a)
	original, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(modeLine.Find(original)), "iptables") {
		t.Skipf("the agent's configuration is not in iptables mode (%q): this scenario starts from deploy/'s default", modeLine.Find(original))
	}
	// Whatever happens, the agent ends in deploy/'s mode, running.
	back := false
	defer func() {
		if back {
			return
		}
		if err := os.WriteFile(config, original, 0o600); err != nil {
			t.Errorf("restoring %s: %v", config, err)
		}
		if err := a.Restart(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("restarting %s in iptables mode: %v", a.Name(), err)
		}
	}()

	mt := programmedMigrationService(ctx, t, b, node)
	clusterAddr, nodePortAddr, echoAddr := mt.clusterAddr, mt.nodePortAddr, mt.echoAddr
	podNS := tp.PodNS(podOn(b, k))
	probes := startPathProbes(t, b, "mode-switch-probe", "", "across the mode switches",
		probePath{"client->clusterip", tp.ClientNS(), clusterAddr},
		probePath{"client->nodeport", tp.ClientNS(), nodePortAddr},
		probePath{node.Name() + "->clusterip", ns, clusterAddr},
		probePath{podName(podOn(b, k)) + "->clusterip", podNS, clusterAddr},
	)
	defer probes.stop()
	waitProbes := func(n int) {
		t.Helper()
		probes.wait(ctx, n)
	}
	waitProbes(5)

	for _, step := range []struct {
		to, from string
		conf     []byte
	}{
		{"nftables", "iptables", modeLine.ReplaceAll(original, []byte("mode: nftables"))},
		{"iptables", "nftables", original},
	} {
		echoes := openEchoes(ctx, t, b, echoAddr, tp.ClientNS(), ns, podNS)
		if err := os.WriteFile(config, step.conf, 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// The rollout: the old pod stops (its rules stay), the new one
		// starts on the same state directory and reads the new file.
		if err := a.Restart(ctx); err != nil {
			t.Fatalf("rolling %s to %s mode: %v\n%s", a.Name(), step.to, err, a.LogTail(20))
		}
		if err := box.Eventually(ctx, func() error { return onlyMode(t, tp, ns, step.to) }); err != nil {
			t.Fatalf("after switching to %s: %v\n%s", step.to, err, a.LogTail(20))
		}
		figure(t, "mode-switch", "from=%s to=%s node=%s old-rules-gone-after=%s", step.from, step.to, node.Name(), ms(time.Since(start)))
		if err := box.Eventually(ctx, func() error {
			s, err := a.State(ctx)
			switch {
			case err != nil:
				return err
			case !s.Connected:
				return errors.New("not connected")
			}
			_, err = a.Healthz(ctx)
			return err
		}); err != nil {
			t.Fatalf("the agent in %s mode is not connected and healthy: %v\n%s", step.to, err, a.LogTail(20))
		}
		m, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		removed := 0.0
		for _, mt := range m["proxyplane_agent_leftover_objects_removed_total"].GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "mode" && l.GetValue() == step.from {
					removed = mt.GetCounter().GetValue()
				}
			}
		}
		if removed == 0 {
			t.Errorf("the agent in %s mode reports no %s leftovers removed", step.to, step.from)
		}
		if !strings.Contains(a.LogTail(400), "removed what another mode left") {
			t.Errorf("the agent in %s mode did not log what it removed:\n%s", step.to, a.LogTail(20))
		}
		// Opened under the old mode, they carry on under the new one alone.
		echoes.exchange(t, "after the switch to "+step.to)
		waitProbes(10)
	}
	back = true
	probes.stop()
}

// agentConfig returns the host path of the agent's --config file: the
// last --config argument, the box's copy of the ConfigMap's file.
func agentConfig(t *testing.T, a *box.Agent) string {
	t.Helper()
	var path string
	for _, arg := range a.Args() {
		if v, ok := strings.CutPrefix(arg, "--config="); ok {
			path = v
		}
	}
	if path == "" {
		t.Fatalf("%s has no --config argument: %q", a.Name(), a.Args())
	}
	return path
}

// onlyMode reports, as an error, what in node namespace ns is not mode's:
// PP- chains in iptables-nft (the box's backend) for nftables, the
// proxyplane nftables tables for iptables; and whether mode's own are
// there.
func onlyMode(t *testing.T, tp *nstest.Topology, ns, mode string) error {
	t.Helper()
	out, err := tp.Exec(ns, "nft", "list", "tables")
	if err != nil {
		return fmt.Errorf("nft list tables: %w", err)
	}
	tables := strings.Count(string(out), " proxyplane\n")
	var chains []string
	for _, table := range []string{"nat", "filter"} {
		for save, dump := range saves(t, tp, ns, table, false) {
			for line := range strings.Lines(dump) {
				if strings.HasPrefix(line, ":PP-") {
					chains = append(chains, save+" "+table+" "+strings.Fields(line[1:])[0])
				}
			}
		}
	}
	switch mode {
	case "nftables":
		if len(chains) > 0 {
			return fmt.Errorf("the iptables mode's chains are still there: %q", chains)
		}
		if tables != 2 {
			return fmt.Errorf("%d proxyplane nftables tables, want ip and ip6:\n%s", tables, out)
		}
	case "iptables":
		if tables > 0 {
			return fmt.Errorf("the nftables mode's tables are still there:\n%s", out)
		}
		if len(chains) == 0 {
			return errors.New("no PP- chain: the iptables mode has not programmed")
		}
	}
	return nil
}
