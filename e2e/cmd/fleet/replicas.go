package main

import (
	"context"
	"fmt"
	"log"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/procfs"
	"github.com/proxyplane/proxyplane/internal/rendezvous"
)

// With --replicas=R above 1, the harness runs R control plane processes
// against the same API server. The agents get every replica's address
// and each starts at its own rendezvous choice (internal/rendezvous, as
// nodeagent/client does), so they split over the replicas; after the
// steady changes, the replica loss phase kills one replica (SIGKILL: a
// machine lost, not a rolling update) in place of the restart, and
// measures how its agents went over the survivors.

// evenTolerance is how far from an even share of a lost replica's agents
// each survivor may take (issue 23: within 10% of even).
const evenTolerance = 0.10

// replicaName is replica i's (from 0) name in CPU figures when there are
// several; the first replica's CPU is also under pControlPlane, with the
// others added (meter.cpu).
func replicaName(i int) string { return fmt.Sprintf("%s-%d", pControlPlane, i+1) }

// rendezvousSplit returns how many of the n agents named with prefix
// pick each of addrs first.
func rendezvousSplit(prefix string, n int, addrs []string) map[string]int {
	out := make(map[string]int, len(addrs))
	for _, a := range addrs {
		out[a] = 0
	}
	for i := range n {
		out[rendezvous.Order(contract.NodeName(prefix, i), addrs)[0]]++
	}
	return out
}

// spreadFig is where the agents of a lost replica went.
type spreadFig struct {
	// Lost is the lost replica's address; Agents the agents it served.
	Lost   string `json:"lost"`
	Agents int    `json:"agents"`
	// Moved counts those agents at each survivor afterwards; Even is
	// their even share, MaxDeviation the largest |moved - even| / even,
	// and Within says every survivor is within evenTolerance of Even.
	Moved        map[string]int `json:"moved"`
	Even         float64        `json:"even"`
	MaxDeviation float64        `json:"maxDeviation"`
	Within       bool           `json:"within"`
	// Unplaced are lost agents with no stream afterwards; Strays are
	// agents of the survivors that moved although their replica stayed.
	Unplaced int `json:"unplaced"`
	Strays   int `json:"strays"`
}

// spreadOf compares each agent's replica before (node name to address)
// and after the loss of lost, whose survivors are survivors.
func spreadOf(before, after map[string]string, lost string, survivors []string) spreadFig {
	f := spreadFig{Lost: lost, Moved: make(map[string]int, len(survivors))}
	for _, s := range survivors {
		f.Moved[s] = 0
	}
	for node, was := range before {
		now, ok := after[node]
		switch {
		case was == lost && !ok:
			f.Agents++
			f.Unplaced++
		case was == lost:
			f.Agents++
			f.Moved[now]++
		case now != was:
			f.Strays++
		}
	}
	if len(survivors) == 0 || f.Agents == 0 {
		return f
	}
	f.Even = float64(f.Agents) / float64(len(survivors))
	for _, s := range survivors {
		f.MaxDeviation = max(f.MaxDeviation, math.Abs(float64(f.Moved[s])-f.Even)/f.Even)
	}
	f.Within = f.Unplaced == 0 && f.MaxDeviation <= evenTolerance
	return f
}

// replicaFig is one replica before and after the loss.
type replicaFig struct {
	Addr   string `json:"addr"`
	Killed bool   `json:"killed"`
	// Expected is its share of the agents by rendezvous; AgentsBefore
	// and AgentsAfter the agents streaming from it.
	Expected     int `json:"expected"`
	AgentsBefore int `json:"agentsBefore"`
	AgentsAfter  int `json:"agentsAfter"`
	// RSSBefore and RSSAfter are its resident memory.
	RSSBefore uint64 `json:"rssBefore"`
	RSSAfter  uint64 `json:"rssAfter"`
	// CPUBefore and CPUAfter are its CPU over a quiet window (Window)
	// before the loss and after the failover; CPUFailover its CPU from
	// the kill until every agent was current again.
	CPUBefore   time.Duration `json:"cpuBefore"`
	CPUFailover time.Duration `json:"cpuFailover"`
	CPUAfter    time.Duration `json:"cpuAfter"`
}

// replicaLossFigures are the replica loss phase's.
type replicaLossFigures struct {
	Replicas []replicaFig `json:"replicas"`
	Spread   spreadFig    `json:"spread"`
	// Window is the length of the quiet windows; Failover the time from
	// the kill until every agent was streaming from a survivor with its
	// version acknowledged there.
	Window   time.Duration `json:"window"`
	Failover time.Duration `json:"failover"`
	// Agents are the agents' counters over the failover.
	Agents contract.Counters `json:"agents"`
}

// addresses returns the replicas' gRPC addresses, in replica order.
func (h *harness) addresses() []string {
	out := make([]string, len(h.cps))
	for i, cp := range h.cps {
		out[i] = cp.grpcAddr
	}
	return out
}

// startReplicas starts replicas 2 to R, after the first, with the same
// flags but their own ports, and connects the harness's client to each.
func (h *harness) startReplicas(ctx context.Context, cfg controlPlaneConfig) error {
	h.m.set(pControlPlane, 0)
	h.m.set(replicaName(0), h.cp.pid())
	for i := 1; i < h.o.Replicas; i++ {
		cfg.Dir = h.o.Dir
		cp, err := newControlPlane(ctx, cfg)
		if err != nil {
			return err
		}
		cp.logPrefix = fmt.Sprintf("controlplane-r%d", i+1)
		h.cps = append(h.cps, cp)
		if err := cp.start(ctx, h.o.PhaseTimeout); err != nil {
			return fmt.Errorf("replica %d: %w", i+1, err)
		}
		h.m.set(replicaName(i), cp.pid())
		if err := cp.connect(nil, ""); err != nil {
			return err
		}
	}
	log.Printf("%d control plane replicas ready at %s", len(h.cps), strings.Join(h.addresses(), ", "))
	return nil
}

// replicaCPU reads every replica's CPU so far (0 for one not running).
func (h *harness) replicaCPU() []time.Duration {
	out := make([]time.Duration, len(h.cps))
	for i, cp := range h.cps {
		if cp.proc != nil && cp.proc.running() {
			out[i], _ = procfs.CPU(cp.pid())
		}
	}
	return out
}

// replicaRSS reads every running replica's resident memory.
func (h *harness) replicaRSS() []uint64 {
	out := make([]uint64, len(h.cps))
	for i, cp := range h.cps {
		if cp.proc != nil && cp.proc.running() {
			if m, err := procfs.Mem(cp.pid()); err == nil {
				out[i] = m.RSS
			}
		}
	}
	return out
}

// quietWindow waits d: a measurement window, not a wait for a condition.
func quietWindow(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("measurement window: %w", context.Cause(ctx))
	case <-time.After(d):
		return nil
	}
}

// replicaLoss kills the last replica with every agent current, waits
// until every agent streams from a survivor with its version
// acknowledged there, and records each replica's agents, CPU and RSS
// before and after, and where the lost replica's agents went.
func (h *harness) replicaLoss(ctx context.Context) error {
	o := h.o
	f := &replicaLossFigures{Window: max(o.Idle, 2*time.Second)}
	h.res.ReplicaLoss = f
	addrs := h.addresses()
	expected := rendezvousSplit(nodePrefix, o.Nodes, addrs)
	var rep contract.AgentsReport
	var err error
	if err := poll(ctx, "every agent current before the loss", pollInterval, o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if rep, err = h.agentsReport(ctx, "versions=1"); err != nil {
			return false, err
		}
		n, err := h.currentOnReplicas(ctx, rep.Versions)
		return err == nil && n == o.Nodes, err
	}); err != nil {
		return err
	}
	before := rep
	cpu0 := h.replicaCPU()
	if err := quietWindow(ctx, f.Window); err != nil {
		return err
	}
	cpu1 := h.replicaCPU()
	rss0 := h.replicaRSS()

	lost := len(h.cps) - 1
	tKill := time.Now()
	h.cps[lost].proc.kill()
	h.m.set(replicaName(lost), 0)
	log.Printf("killed replica %d (%s), which served %d agents", lost+1, addrs[lost], before.Replicas[addrs[lost]])
	err = poll(ctx, "every agent current on a surviving replica", pollInterval, o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if rep, err = h.agentsReport(ctx, "versions=1"); err != nil {
			return false, err
		}
		if rep.Connected < o.Nodes || rep.Replicas[addrs[lost]] > 0 {
			return false, nil
		}
		n, err := h.currentOnReplicas(ctx, rep.Versions)
		return err == nil && n == o.Nodes, nil
	})
	f.Failover = time.Since(tKill)
	cpu2 := h.replicaCPU()
	f.Agents = sub(rep.Counters, before.Counters)
	f.Spread = spreadOf(before.Addresses, rep.Addresses, addrs[lost], slices.Delete(slices.Clone(addrs), lost, lost+1))
	if err != nil {
		return fmt.Errorf("%w (%d of %d connected, %d still on the lost replica)", err, rep.Connected, rep.Agents, rep.Replicas[addrs[lost]])
	}
	log.Printf("every agent current on a survivor %v after the kill; the lost replica's %d agents: %v (even %.0f, within %.0f%%: %t)",
		f.Failover.Round(time.Millisecond), f.Spread.Agents, f.Spread.Moved, f.Spread.Even, 100*evenTolerance, f.Spread.Within)
	if err := quietWindow(ctx, f.Window); err != nil {
		return err
	}
	cpu3 := h.replicaCPU()
	rss1 := h.replicaRSS()
	for i, a := range addrs {
		r := replicaFig{
			Addr: a, Killed: i == lost, Expected: expected[a],
			AgentsBefore: before.Replicas[a], AgentsAfter: rep.Replicas[a],
			RSSBefore: rss0[i], RSSAfter: rss1[i],
			CPUBefore: cpu1[i] - cpu0[i],
		}
		if i != lost {
			r.CPUFailover, r.CPUAfter = cpu2[i]-cpu1[i], cpu3[i]-cpu2[i]
		}
		f.Replicas = append(f.Replicas, r)
	}
	return h.finishAgents(ctx)
}

// currentOnReplicas counts the agents current on the running replicas:
// connected with the version they hold acknowledged (ListNodes on each).
// It answers -1 while a replica may not be asked again yet.
func (h *harness) currentOnReplicas(ctx context.Context, versions map[string]string) (int, error) {
	total := 0
	for _, cp := range h.cps {
		if cp.proc == nil || !cp.proc.running() {
			continue
		}
		n, _, err := cp.current(ctx, versions)
		if err != nil || n < 0 {
			return -1, err
		}
		total += n
	}
	return total, nil
}

// replicaRows report the replica loss phase.
func replicaRows(t *table, r *Results) {
	f := r.ReplicaLoss
	for i, x := range f.Replicas {
		name := fmt.Sprintf("replica %d", i+1)
		if x.Killed {
			name += " (killed)"
		}
		t.row("replicas", name+": agents expected by rendezvous; before; after", fmt.Sprintf("%d; %d; %d", x.Expected, x.AgentsBefore, x.AgentsAfter))
		t.row("replicas", name+": RSS before; after", fmt.Sprintf("%s; %s", mib(x.RSSBefore), mib(x.RSSAfter)))
		t.row("replicas", name+fmt.Sprintf(": CPU in %v before; failover; %v after", dur(f.Window), dur(f.Window)),
			fmt.Sprintf("%s; %s; %s", dur(x.CPUBefore), dur(x.CPUFailover), dur(x.CPUAfter)))
	}
	s := f.Spread
	moved := make([]string, 0, len(s.Moved))
	for _, x := range f.Replicas {
		if c, ok := s.Moved[x.Addr]; ok {
			moved = append(moved, fmt.Sprint(c))
		}
	}
	t.row("replicas", "kill to every agent current on a survivor", "**"+dur(f.Failover)+"**")
	t.row("replicas", "lost replica's agents at each survivor; even share", fmt.Sprintf("%s of %d; %.0f", strings.Join(moved, " / "), s.Agents, s.Even))
	t.row("replicas", fmt.Sprintf("each survivor within %.0f%% of even (largest deviation)", 100*evenTolerance), fmt.Sprintf("**%s** (%.1f%%)", yesNo(s.Within), 100*s.MaxDeviation))
	t.row("replicas", "agents left without a stream; survivors' agents moved (must be 0)", fmt.Sprintf("%d; %d", s.Unplaced, s.Strays))
	t.row("replicas", "failover: sessions, failed dials, snapshots, deltas, table bytes", fmt.Sprintf("%d, %d, %d, %d, %s",
		f.Agents.Sessions, f.Agents.Failures, f.Agents.Snapshots, f.Agents.Deltas, mib(f.Agents.SnapshotBytes+f.Agents.DeltaBytes)))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
