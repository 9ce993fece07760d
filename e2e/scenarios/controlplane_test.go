package scenarios

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// testControlPlaneRestart restarts both replicas (SIGTERM, then start):
// every agent reconnects to a process that never served it, and since
// versions are content hashes, the new process recognises what each
// agent holds and sends nothing. The proof is on both sides: on the
// replica, the stream's bytes_sent is 0, no version was sent and the
// agent's version counts as acknowledged (ListNodes), and no table bytes
// went out at all (sent_bytes_total); on the agent, the version in force
// and the time its cache was last written (it writes for every table it
// applies) are unchanged.
func (e *env) testControlPlaneRestart(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	versions, states := snapshotState(ctx, t, b)
	start := time.Now()
	if err := b.StopControlPlanes(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.StartControlPlanes(ctx); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	statuses := waitResynced(ctx, t, b, versions)
	done := time.Now()
	for node, st := range statuses {
		checkNothingSent(t, node, st, versions[node])
	}
	for _, c := range b.ControlPlanes {
		m, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sent := m.Sum("proxyplane_controlplane_sent_bytes_total"); sent != 0 {
			t.Errorf("%s sent %.0f table bytes since its restart, want 0", c.Name(), sent)
		}
	}
	checkNoApply(ctx, t, b, states)
	figure(t, "cp-restart-resync", "took=%s after-ready=%s nodes=%d table-bytes-sent=0 (both replicas restarted, every agent current)", ms(done.Sub(start)), ms(done.Sub(ready)), len(statuses))
}

// testAgentMovesReplica kills (SIGKILL) the replica serving the most
// agents: they fail over to the other replica, which has never served
// them and sends them nothing, because they are current. The proof is as
// in testControlPlaneRestart, and the surviving replica's
// sent_bytes_total does not move. The killed replica then comes back; the
// agents stay where they are.
func (e *env) testAgentMovesReplica(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	versions, states := snapshotState(ctx, t, b)
	on, _, err := b.Connections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := map[*box.ControlPlane][]string{}
	for node, c := range on {
		count[c] = append(count[c], node)
	}
	victim := b.ControlPlanes[0]
	for _, c := range b.ControlPlanes {
		if len(count[c]) > len(count[victim]) {
			victim = c
		}
	}
	moved := count[victim]
	if len(moved) == 0 {
		t.Fatalf("no agent is connected to any replica: %v", on)
	}
	sentBefore := map[*box.ControlPlane]float64{}
	for _, c := range b.ControlPlanes {
		if c == victim {
			continue
		}
		m, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sentBefore[c] = m.Sum("proxyplane_controlplane_sent_bytes_total")
	}

	start := time.Now()
	victim.Kill()
	statuses := waitResynced(ctx, t, b, versions)
	took := time.Since(start)
	for _, node := range moved {
		checkNothingSent(t, node, statuses[node], versions[node])
	}
	for c, before := range sentBefore {
		m, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sent := m.Sum("proxyplane_controlplane_sent_bytes_total"); sent != before {
			t.Errorf("%s sent %.0f table bytes while taking over %v, want 0", c.Name(), sent-before, moved)
		}
	}
	checkNoApply(ctx, t, b, states)
	figure(t, "agent-failover", "took=%s moved=%s from=%s table-bytes-sent=0", ms(took), strings.Join(moved, ","), victim.Name())

	if err := victim.StartReady(ctx); err != nil {
		t.Fatal(err)
	}
}

// Probe settings for the outage: a dial every 50 ms, each bounded by a
// second (a working dial takes about a millisecond), at most 4,000 dials
// (over three minutes), far more than the scenario needs.
const (
	probeInterval = 50 * time.Millisecond
	probeTimeout  = time.Second
	probeMaxDials = 4000
	// outageDials is how many dials each probe makes while every replica
	// is down, after the agents have noticed: about two seconds.
	outageDials = 40
)

// testControlPlaneDown kills (SIGKILL) every replica while two probes
// send new connections to web, one from the client through node-0, one
// from a pod on node-2: traffic keeps flowing from the rules in the
// kernel, and no connection fails. Meanwhile node-1's agent is killed,
// its node's rules are deleted, and it is started again with no control
// plane to reach: it programs its table from its bbolt cache, and node-1's
// pods reach the Service again. Then the replicas come back and every
// agent, node-1's included, resynchronises without receiving a byte.
func (e *env) testControlPlaneDown(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	web := webService(t, e)
	versions, _ := snapshotState(ctx, t, b)
	probes := map[string]*box.Probe{
		"client":                         b.StartProbe(tp.ClientNS(), box.ClusterAddr(web), probeInterval, probeTimeout, probeMaxDials),
		podName(podOn(b, 2)) + "@node-2": b.StartProbe(tp.PodNS(podOn(b, 2)), box.ClusterAddr(web), probeInterval, probeTimeout, probeMaxDials),
	}
	stopped := false
	stopProbes := func() map[string]box.ProbeResult {
		out := map[string]box.ProbeResult{}
		for name, p := range probes {
			out[name] = p.Stop()
		}
		stopped = true
		return out
	}
	defer func() {
		if !stopped {
			stopProbes()
		}
	}()
	for _, p := range probes {
		if err := p.WaitDials(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}

	down := time.Now()
	b.KillControlPlanes()
	err := box.Eventually(ctx, func() error {
		for _, a := range b.Agents {
			s, err := a.State(ctx)
			if err != nil {
				return err
			}
			if s.Connected {
				return fmt.Errorf("%s still reports a control plane stream", a.Name())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Node-1's agent is killed while no replica runs and every rule in
	// node-1 is deleted (as a reboot would); node-1's pod then cannot
	// reach web. The agent starts again and must program its cached table
	// without any control plane.
	t.Run("AgentRestartsFromCache", func(t *testing.T) {
		a := b.Agents[1]
		ns := tp.PodNS(podOn(b, 1))
		addr := box.ClusterAddr(web)
		a.Kill()
		if out, err := tp.ExecContext(ctx, a.Node.NS(), "nft", "flush", "ruleset"); err != nil {
			t.Fatalf("deleting node-1's rules: %v: %s", err, out)
		}
		out, err := tp.ExecContext(ctx, a.Node.NS(), "nft", "list", "ruleset")
		if err != nil {
			t.Fatalf("listing node-1's rules: %v", err)
		}
		if strings.Contains(string(out), "PP-") {
			t.Fatalf("node-1 still has PP- chains after the flush:\n%s", out)
		}
		// Without the rules a ClusterIP is just an address routed to the
		// LAN, where nothing answers it.
		if r, err := tp.DialTCP(ns, addr, probeTimeout); err == nil {
			t.Fatalf("node-1 reached %s (%s) with its rules deleted: the check below would prove nothing", addr, r.Backend)
		}
		start := time.Now()
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		at, err := b.DialUntil(ctx, ns, addr, "")
		if err != nil {
			t.Fatalf("node-1 after its agent restarted from cache: %v\n%s", err, a.LogTail(20))
		}
		// The agent's metric of the version in force must name the cached
		// table. The kernel forwards as soon as the restore commits, a
		// moment before the agent records the sync, so poll briefly.
		var s box.State
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = box.Eventually(wctx, func() error {
			var err error
			if s, err = a.State(wctx); err != nil {
				return err
			}
			if s.Version != versions[a.Node.Name()] {
				return fmt.Errorf("version %q in force", s.Version)
			}
			return nil
		})
		cancel()
		if err != nil {
			t.Errorf("%s restarted from its cache reports %v (proxyplane_agent_applied_version_info), want its cached %s\n%s",
				a.Name(), err, versions[a.Node.Name()], a.LogTail(20))
		}
		if s.Connected {
			t.Errorf("%s reports a control plane stream while every replica is down", a.Name())
		}
		figure(t, "agent-restart-from-cache", "traffic-restored-after=%s version=%s control-planes=0", ms(at.Sub(start)), s.Version)
	})

	for _, p := range probes {
		if err := p.WaitDials(ctx, outageDials); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.StartControlPlanes(ctx); err != nil {
		t.Fatal(err)
	}
	outage := time.Since(down)
	// Nothing changed while the replicas were away, so every agent,
	// node-1's restarted one included, must say hello with the version it
	// had and get nothing: node-1's cache held exactly its table.
	statuses := waitResynced(ctx, t, b, versions)
	for node, st := range statuses {
		checkNothingSent(t, node, st, versions[node])
	}
	for name, r := range stopProbes() {
		figure(t, "cp-outage-probe", "from=%s dials=%d failed=%d over=%s outage=%s backends=%d", name, r.Dials, r.Failures, ms(r.Duration), ms(outage), len(r.Backends))
		if r.Failures != 0 {
			t.Errorf("probe from %s: %d of %d connections failed while the control plane was down; first: %v", name, r.Failures, r.Dials, r.Errors)
		}
	}
}

// snapshotState waits until every node is current and returns each
// node's version and each agent's state.
func snapshotState(ctx context.Context, t *testing.T, b *box.Box) (map[string]string, map[string]box.State) {
	t.Helper()
	versions, err := b.WaitProgrammed(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]box.State{}
	for _, a := range b.Agents {
		s, err := a.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		states[a.Node.Name()] = s
	}
	return versions, states
}

// waitResynced waits until every node's agent is connected to a running
// replica that counts versions[node] as acknowledged, and returns those
// statuses.
func waitResynced(ctx context.Context, t *testing.T, b *box.Box, versions map[string]string) map[string]*pb.NodeStatus {
	t.Helper()
	var statuses map[string]*pb.NodeStatus
	err := box.Eventually(ctx, func() error {
		_, st, err := b.Connections(ctx)
		if err != nil {
			return err
		}
		for node, v := range versions {
			if st[node] == nil {
				return fmt.Errorf("%s is not connected", node)
			}
			if st[node].GetAckedVersion() != v {
				return fmt.Errorf("%s: acknowledged %q, want %s", node, st[node].GetAckedVersion(), v)
			}
		}
		statuses = st
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return statuses
}

// checkNothingSent fails t unless st shows a stream on which no table was
// sent and the agent's version counts as acknowledged from its hello.
func checkNothingSent(t *testing.T, node string, st *pb.NodeStatus, version string) {
	t.Helper()
	if st.GetBytesSent() != 0 || st.GetSentVersion() != "" {
		t.Errorf("%s: the replica sent %d table bytes (version %q) to a current agent, want none", node, st.GetBytesSent(), st.GetSentVersion())
	}
	if st.GetAckedVersion() != version {
		t.Errorf("%s: acknowledged %q, want %s", node, st.GetAckedVersion(), version)
	}
}

// checkNoApply fails t unless every agent still has the version and
// cache write time of before, and is connected.
func checkNoApply(ctx context.Context, t *testing.T, b *box.Box, before map[string]box.State) {
	t.Helper()
	for _, a := range b.Agents {
		s, err := a.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		was := before[a.Node.Name()]
		if s.Version != was.Version || s.CacheSaved != was.CacheSaved {
			t.Errorf("%s applied a table: version %s (cache written at %.3f), was %s (%.3f)", a.Name(), s.Version, s.CacheSaved, was.Version, was.CacheSaved)
		}
		if !s.Connected {
			t.Errorf("%s is not connected", a.Name())
		}
	}
}
