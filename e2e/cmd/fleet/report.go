package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// printTable writes every figure as one Markdown table: phase, figure,
// value.
func printTable(w io.Writer, r *Results) {
	t := &table{w: w}
	t.head(mode(r))
	m, s := r.Machine, r.Sizes
	t.row("machine", "cores, CPU, memory", fmt.Sprintf("%d x %s, %s", m.Cores, m.CPU, mib(m.MemTotal)))
	t.row("machine", "kernel, Go, load average (start / end)", fmt.Sprintf("%s, %s, %s / %s", m.Kernel, m.Go, m.Load[0], m.Load[1]))
	if r.OnlyFloor {
		floorRows(t, r)
		_, _ = fmt.Fprintln(w)
		return
	}
	t.row("sizes", "agents (N) x Services (S), endpoints each", fmt.Sprintf("%s x %s, %d", thousands(s.Nodes), thousands(s.Services), s.EndpointsPer))
	t.row("sizes", "hinted / eTP Local (of which LoadBalancer)", fmt.Sprintf("%d / %d (%d)", s.Hinted, s.Local, s.LoadBalancers))
	t.row("sizes", "changes, pace; peer sets, peer changes", fmt.Sprintf("%d, %v; %d, %d", s.Changes, s.Pace, s.PeerSets, s.PeerChanges))
	t.row("sizes", "control plane flags", "`"+strings.Join(redactKubeconfig(r.ControlPlaneArgs), " ")+"`")
	t.row("setup", "create Nodes, Services, EndpointSlices", dur(r.Create))
	if id := r.Identities; id != nil {
		t.row("setup", "create agent Pods; request their tokens (bound, 1 h)", fmt.Sprintf("%s; %s", dur(id.Pods), dur(id.Tokens)))
		t.row("setup", "tokens: total; per agent", fmt.Sprintf("%s; %.0f B", kib(float64(id.TokenBytes)), float64(id.TokenBytes)/float64(max(s.Nodes, 1))))
	}
	t.row("start", "control plane start to ready; CPU", fmt.Sprintf("%s; %s", dur(r.Start.Ready), dur(r.Start.CPU[pControlPlane])))
	t.row("start", "control plane RSS; heap", fmt.Sprintf("%s; %s", mib(r.Start.Mem.RSS), mib(r.Start.Mem.Heap)))
	if id := r.Identities; id != nil {
		t.row("start", "ready to CA bundle read from ConfigMap proxyplane-ca", dur(id.CAPublished))
	}

	c := r.Cold
	n := float64(max(s.Nodes, 1))
	t.row("cold start", "every agent holding a valid table", "**"+dur(c.AllValid)+"**")
	t.row("cold start", "control plane CPU; per agent", fmt.Sprintf("%s; **%s**", dur(c.CPU[pControlPlane]), us(float64(c.CPU[pControlPlane])/n)))
	t.row("cold start", "control plane peak RSS; peak heap (sampled "+heapSample(s.HeapSample)+")", fmt.Sprintf("**%s**; %s", mib(c.Mem.PeakRSS), mib(c.Mem.PeakHeap)))
	t.row("cold start", "control plane RSS; heap, after", fmt.Sprintf("%s; %s", mib(c.Mem.RSS), mib(c.Mem.Heap)))
	t.row("cold start", "snapshot bytes; per agent", fmt.Sprintf("%s; %s", mib(c.Agents.SnapshotBytes), kib(float64(c.Agents.SnapshotBytes)/n)))
	t.row("cold start", "snapshots, deltas, NACKs, reconnects", fmt.Sprintf("%d, %d, %d, %d", c.Agents.Snapshots, c.Agents.Deltas, c.Agents.Nacks, c.Agents.Reconnects))
	t.row("cold start", cpuLabel, cpuOthers(c.CPU))
	t.row("cold start", "agents' shared tables (live tables / buckets); agents' heap", fmt.Sprintf("%d / %d; %s", c.Tables.Live, c.Tables.LiveBuckets, mib(c.AgentsHeap)))
	reviewRow(t, "cold start", c.Reviews)
	t.row("idle", "control plane CPU per second, agents connected", dur(r.Idle))

	st := r.Steady
	nc := max(len(st.Changes), 1)
	var lastAck, lastReach []time.Duration
	var reached, expected int
	classes := map[string]int{}
	for _, ch := range st.Changes {
		lastAck, lastReach = append(lastAck, ch.LastAck), append(lastReach, ch.LastReach)
		reached += ch.Reached
		expected += ch.Expected
		classes[ch.Class]++
	}
	perChange := func(d time.Duration) time.Duration { return d / time.Duration(nc) }
	cpCPU := perChange(st.CPU[pControlPlane])
	avgReached := float64(reached) / float64(nc)
	t.row("steady", "changes (plain / hinted / eTP Local)", fmt.Sprintf("%d (%d / %d / %d)", len(st.Changes), classes[plain.String()], classes[hinted.String()], classes[local.String()]))
	t.row("steady", "agents reached per change (expected)", fmt.Sprintf("%.0f (%.0f)", avgReached, float64(expected)/float64(nc)))
	t.row("steady", "control plane CPU per change; net of idle", fmt.Sprintf("%s; %s", dur(cpCPU), dur(cpCPU-time.Duration(float64(r.Idle)*st.Window.Seconds())/time.Duration(nc))))
	t.row("steady", "control plane CPU per change per agent reached", "**"+us(cpPerAgentReached(st))+"**")
	t.row("steady", "trigger to last agent's ACK: p50 / p99 / max", "**"+percentiles(lastAck)+"**")
	t.row("steady", "trigger to last agent reached: p50 / p99 / max", percentiles(lastReach))
	convergenceRows(t, st)
	tableBytes := float64(st.Agents.SnapshotBytes+st.Agents.DeltaBytes) / float64(nc)
	t.row("steady", "table bytes per change; per agent reached", fmt.Sprintf("%s; %.0f B", kib(tableBytes), tableBytes/max(avgReached, 1)))
	t.row("steady", "wire bytes per change (all frames, keepalives)", kib(float64(st.Agents.WireBytes)/float64(nc)))
	t.row("steady", "snapshots, deltas, NACKs, reconnects", fmt.Sprintf("%d, %d, %d, %d", st.Agents.Snapshots, st.Agents.Deltas, st.Agents.Nacks, st.Agents.Reconnects))
	t.row("steady", "control plane RSS steady / peak", fmt.Sprintf("**%s** / %s", mib(st.Mem.RSS), mib(st.Mem.PeakRSS)))
	t.row("steady", "control plane heap steady / peak (sampled)", fmt.Sprintf("%s / %s", mib(st.Mem.Heap), mib(st.Mem.PeakHeap)))
	if rt := st.Mem.Runtime; rt != nil {
		t.row("steady", "control plane memory (Go runtime): heap in use; heap idle, not released; stacks; runtime; all from the OS; goroutines",
			fmt.Sprintf("%s; %s; %s; %s; %s; %s", mib(rt.HeapInuse), mib(rt.HeapUnreleased), mib(rt.Stacks), mib(rt.Runtime), mib(rt.Sys), thousands(rt.Goroutines)))
	}
	t.row("steady", "API server CPU per change (control plane its only watcher)", dur(perChange(st.CPU[pAPIServer])))
	t.row("steady", cpuLabel+", per change", cpuOthers(perChangeAll(st.CPU, nc)))
	reviewRow(t, "steady", st.Reviews)

	if r.ReplicaLoss != nil {
		replicaRows(t, r)
	} else {
		restartRows(t, r, n)
	}
	floorRows(t, r)

	if p := r.Peer; p != nil {
		sets := float64(max(p.Sets, 1))
		pc := time.Duration(max(p.Changes, 1))
		apiPeer := p.CPU[pAPIServer] / pc
		perWatcher := float64(apiPeer-p.BaselineAPICPU) / sets
		t.row("peer", "informer sets (Services, EndpointSlices, own Node, ServiceCIDRs)", fmt.Sprintf("%d", p.Sets))
		t.row("peer", "initial sync: every set synced", dur(p.Sync))
		t.row("peer", "initial sync: API server CPU; per set", fmt.Sprintf("%s; **%s**", dur(p.SyncCPU[pAPIServer]), us(float64(p.SyncCPU[pAPIServer])/sets)))
		t.row("peer", "initial sync: bytes at the watchers (wire; body) per set", fmt.Sprintf("%s; %s", kib(float64(p.SyncWire)/sets), kib(float64(p.SyncBody)/sets)))
		t.row("peer", "changes; every set had every change", fmt.Sprintf("%d; %s after the first", p.Changes, dur(p.Delivered)))
		t.row("peer", "API server CPU per change, with the sets; without (steady)", fmt.Sprintf("%s; %s", dur(apiPeer), dur(p.BaselineAPICPU)))
		perWatcherText := "**" + us(perWatcher) + "**"
		if perWatcher <= 0 {
			// CPU times are in 10 ms ticks: a few changes to a few sets
			// are below what they can show.
			perWatcherText = "below resolution (10 ms ticks)"
		}
		t.row("peer", "API server CPU per change per watcher (difference / sets)", perWatcherText)
		t.row("peer", "bytes per change at the watchers (wire; body); per set", fmt.Sprintf("%s; %s; %.0f B", kib(float64(p.Wire)/float64(pc)), kib(float64(p.Body)/float64(pc)), float64(p.Wire)/float64(pc)/sets))
		t.row("peer", "peer process CPU per change; heap", fmt.Sprintf("%s; %s", dur(p.CPU[pPeer]/pc), mib(p.Heap)))
		if len(p.Errors) > 0 {
			t.row("peer", "watch errors (first few)", strings.Join(p.Errors, "; "))
		}

		// Ratios: the peer's cost over ours, per node, like for like.
		t.row("ratio", "CPU per change: API server per watcher / control plane per agent reached", "**"+ratio(max(perWatcher, 0), cpPerAgentReached(st))+"**")
		agentWire := float64(st.Agents.WireBytes) / float64(nc) / max(avgReached, 1)
		t.row("ratio", "bytes per change: per watcher (wire) / per agent reached (wire)", ratio(float64(p.Wire)/float64(pc)/sets, agentWire))
		t.row("ratio", "initial sync CPU: API server per set / control plane per agent (cold start)", ratio(float64(p.SyncCPU[pAPIServer])/sets, float64(c.CPU[pControlPlane])/n))
		t.row("ratio", "initial sync bytes: per set (wire) / per agent (snapshot)", ratio(float64(p.SyncWire)/sets, float64(c.Agents.SnapshotBytes)/n))
		t.row("ratio", fmt.Sprintf("per change at N=%s: API server for N watchers / control plane", thousands(s.Nodes)),
			fmt.Sprintf("%s / %s = %s", dur(time.Duration(max(perWatcher, 0)*n)), dur(cpCPU), ratio(max(perWatcher, 0)*n, float64(cpCPU))))
	}
	ck := r.Checks
	t.row("checks", "valid agents; NACKs; change-agent pairs missing; restart table bytes", fmt.Sprintf("%d of %d; %d; %d; %d", ck.ValidAgents, s.Nodes, ck.Nacks, ck.Missing, ck.RestartTableBytes))
	_, _ = fmt.Fprintln(w)
}

// restartRows report the restart phase; n is the number of agents.
func restartRows(t *table, r *Results, n float64) {
	rs := r.Restart
	t.row("restart", "SIGTERM to exit; new process start to ready", fmt.Sprintf("%s; %s", dur(rs.Stop), dur(rs.Ready)))
	t.row("restart", "every agent current: after SIGTERM; after ready", fmt.Sprintf("**%s**; %s", dur(rs.Current), dur(rs.CurrentAfterReady)))
	t.row("restart", "table bytes sent after the restart (must be 0)", fmt.Sprintf("**%d**", rs.Agents.SnapshotBytes+rs.Agents.DeltaBytes))
	t.row("restart", "sessions, failed dials, snapshots, deltas", fmt.Sprintf("%d, %d, %d, %d", rs.Agents.Sessions, rs.Agents.Failures, rs.Agents.Snapshots, rs.Agents.Deltas))
	t.row("restart", "new control plane CPU (start to all current); per agent", fmt.Sprintf("%s; %s", dur(rs.CPU[pControlPlane]), us(float64(rs.CPU[pControlPlane])/n)))
	t.row("restart", "old control plane CPU, SIGTERM to exit", dur(rs.OldCPU))
	t.row("restart", "new control plane peak RSS; heap", fmt.Sprintf("%s; %s", mib(rs.Mem.PeakRSS), mib(rs.Mem.Heap)))
	t.row("restart", cpuLabel, cpuOthers(rs.CPU))
	reviewRow(t, "restart", rs.Reviews)
}

// convergenceRows show the control plane's own convergence SLI of the
// steady changes: per share of the agents, its time over the changes.
func convergenceRows(t *table, st steadyFigures) {
	if len(st.Convergence) == 0 {
		t.row("steady", "convergence SLI (control plane)", "not listed (a control plane without it, or --convergence-tracking=false)")
		return
	}
	nodes := 0
	for _, c := range st.Convergence {
		nodes += c.Nodes
	}
	t.row("steady", "convergence SLI: changes listed; agents counted per change", fmt.Sprintf("%d of %d; %.0f", len(st.Convergence), len(st.Changes), float64(nodes)/float64(len(st.Convergence))))
	for _, q := range []struct{ key, pct string }{{"0.5", "50"}, {"0.9", "90"}, {"0.99", "99"}, {"1", "100"}} {
		var ds []time.Duration
		for _, c := range st.Convergence {
			if d, ok := c.Reached[q.key]; ok {
				ds = append(ds, d)
			}
		}
		t.row("steady", "convergence SLI: trigger to "+q.pct+"% of agents ACKed: p50 / p99 / max", percentiles(ds))
	}
}

// reviewRow shows the reviews of a phase of a --secure run.
func reviewRow(t *table, phase string, r *reviewCounts) {
	if r != nil {
		t.row(phase, "TokenReviews; SubjectAccessReviews (API server's count)", fmt.Sprintf("%d; %d", r.Token, r.Access))
	}
}

// cpPerAgentReached is the steady phase's control plane CPU per change
// per agent reached, in nanoseconds: the figure the peer and the gRPC
// floor are compared with.
func cpPerAgentReached(st steadyFigures) float64 {
	nc := max(len(st.Changes), 1)
	reached := 0
	for _, c := range st.Changes {
		reached += c.Reached
	}
	cpCPU := st.CPU[pControlPlane] / time.Duration(nc)
	return float64(cpCPU) / max(float64(reached)/float64(nc), 1)
}

// cpPerResponse is the steady phase's control plane CPU per response
// (delta or snapshot) sent, in nanoseconds, and the same net of the
// idle CPU (keepalives, resyncs) over the phase's window.
func cpPerResponse(st steadyFigures, idle time.Duration) (float64, float64) {
	n := float64(max(st.Agents.Deltas+st.Agents.Snapshots, 1))
	cpu := float64(st.CPU[pControlPlane])
	return cpu / n, (cpu - float64(idle)*st.Window.Seconds()) / n
}

const cpuLabel = "CPU: API server (+etcd) / agents' process / peer / harness"

func cpuOthers(cpu map[string]time.Duration) string {
	return fmt.Sprintf("%s / %s / %s / %s", dur(cpu[pAPIServer]), dur(cpu[pAgents]), dur(cpu[pPeer]), dur(cpu[pHarness]))
}

func perChangeAll(cpu map[string]time.Duration, n int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, v := range cpu {
		out[k] = v / time.Duration(n)
	}
	return out
}

type table struct{ w io.Writer }

// head writes the header; the value column names the mode that ran, so
// that a table pasted alone still says what it measured.
func (t *table) head(mode string) {
	_, _ = fmt.Fprintf(t.w, "| phase | figure | value (%s) |\n", mode)
	_, _ = fmt.Fprintln(t.w, "|---|---|---|")
}

// mode names how the control plane and its clients talked.
func mode(r *Results) string {
	m := "insecure: plaintext, no tokens"
	switch {
	case r.OnlyFloor:
		return "gRPC floor only, plaintext"
	case r.Secure:
		m = "TLS + tokens"
	}
	if r.ZstdEntries {
		m += "; compressed snapshots"
	}
	return m
}

func (t *table) row(phase, figure, value string) {
	_, _ = fmt.Fprintf(t.w, "| %s | %s | %s |\n", phase, figure, value)
}

// redactKubeconfig shortens the kubeconfig path, which is the run's
// temporary directory.
func redactKubeconfig(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, "--kubeconfig=") {
			out[i] = "--kubeconfig=…/admin.kubeconfig"
		}
	}
	return out
}

func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n/a"
	}
	s := slices.Sorted(slices.Values(ds))
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("%s / %s / %s", dur(at(0.5)), dur(at(0.99)), dur(s[len(s)-1]))
}

func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < 10*time.Microsecond && d > -10*time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	case d < time.Millisecond && d > -time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < time.Second && d > -time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// us formats a duration given in nanoseconds, as a float so that
// per-agent shares of a few nanoseconds survive.
func us(ns float64) string { return dur(time.Duration(ns)) }

func kib(b float64) string {
	if b < 10*1024 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f KiB", b/1024)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", a/b)
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// heapSample says how often the heap was scraped for its peak.
func heapSample(d time.Duration) string {
	if d <= 0 {
		return "at the phase's end"
	}
	return "every " + d.String()
}
