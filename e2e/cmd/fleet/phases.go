package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"strconv"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/procfs"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// pollInterval is how often a phase looks at its children's reports:
// fine enough for the figures (which come from the children's own
// timestamps, not from the polling), coarse enough to cost little.
const pollInterval = 100 * time.Millisecond

func (h *harness) agentsReport(ctx context.Context, query string) (contract.AgentsReport, error) {
	var r contract.AgentsReport
	err := getJSON(ctx, h.agentsURL+"/report?"+query, &r)
	return r, err
}

// coldStart connects every agent, with empty caches, within o.Spread,
// and waits until each holds a valid table.
func (h *harness) coldStart(ctx context.Context) error {
	before, err := h.agentsReport(ctx, "")
	if err != nil {
		return err
	}
	if err := procfs.ResetPeak(h.cp.pid()); err != nil {
		return err
	}
	reviews0, err := h.reviews(ctx)
	if err != nil {
		return err
	}
	heap := sampleHeap(ctx, h.cp, h.o.HeapSample)
	cpu0 := h.m.cpu()
	if err := post(ctx, fmt.Sprintf("%s/start?spread=%s", h.agentsURL, h.o.Spread)); err != nil {
		return err
	}
	var rep contract.AgentsReport
	err = poll(ctx, "every agent holding a valid table", pollInterval, h.o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if rep, err = h.agentsReport(ctx, ""); err != nil {
			return false, err
		}
		return rep.FirstAckMax != 0, nil
	})
	cpu := h.m.since(cpu0)
	f := &h.res.Cold
	f.CPU, f.Mem = cpu, h.cpMem(ctx, heap.stop())
	f.Agents, f.Tables, f.AgentsHeap = sub(rep.Counters, before.Counters), rep.Tables, rep.HeapInuse
	h.res.Checks.ValidAgents = rep.Valid
	if err != nil {
		return fmt.Errorf("%w (%d of %d valid; session ends: %v)", err, rep.Valid, rep.Agents, rep.SessionEnds)
	}
	f.AllValid = time.Duration(rep.FirstAckMax - rep.Started)
	log.Printf("every agent valid %v after start", f.AllValid.Round(time.Millisecond))
	f.Reviews, err = h.reviewsSince(ctx, reviews0)
	return err
}

// idle measures the control plane's CPU while nothing changes.
func (h *harness) idle(ctx context.Context) error {
	if h.o.Idle == 0 {
		return nil
	}
	prof := h.profileIdle(ctx)
	cpu0 := h.m.cpu()
	t0 := time.Now()
	// A measurement window, not a wait for a condition.
	select {
	case <-ctx.Done():
		return fmt.Errorf("idle window: %w", context.Cause(ctx))
	case <-time.After(h.o.Idle):
	}
	cpu := h.m.since(cpu0)
	h.res.Idle = time.Duration(float64(cpu[pControlPlane]) / time.Since(t0).Seconds())
	if err := prof(); err != nil {
		log.Printf("idle profile: %v", err)
	}
	return nil
}

// profileIdle starts the idle window's CPU profile (--profile, an idle
// window of at least a second) into Profile.idle.cpu, for the window's
// whole seconds up to maxProfile, and returns the function that waits
// for it.
func (h *harness) profileIdle(ctx context.Context) func() error {
	secs := int(min(h.o.Idle, maxProfile) / time.Second)
	if h.o.Profile == "" || secs < 1 {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		done <- h.cp.profile(ctx, "profile", fmt.Sprintf("seconds=%d", secs), h.o.Profile+".idle.cpu")
	}()
	return func() error { return <-done }
}

// maxProfile bounds the CPU profile: the control plane's HTTP server
// ends any answer after 30 s (httpWriteTimeout), and pprof refuses a
// profile longer than that.
const maxProfile = 25 * time.Second

// profileSteady starts the steady phase's CPU profile (--profile) and
// returns the function that waits for it, then takes the heap and
// goroutine profiles. The CPU profile covers the changes, from their
// start, at most maxProfile; it costs the control plane about 1% of a
// core while it runs, counted in the phase.
func (h *harness) profileSteady(ctx context.Context) func() error {
	if h.o.Profile == "" {
		return func() error { return nil }
	}
	secs := int(min(max(time.Duration(h.o.Changes)*h.o.Pace, time.Second), maxProfile) / time.Second)
	done := make(chan error, 1)
	go func() {
		done <- h.cp.profile(ctx, "profile", fmt.Sprintf("seconds=%d", secs), h.o.Profile+".cpu")
	}()
	return func() error {
		return errors.Join(<-done,
			h.cp.profile(ctx, "heap", "", h.o.Profile+".heap"),
			h.cp.profile(ctx, "goroutine", "", h.o.Profile+".goroutine"))
	}
}

// profileRestart starts the restarted control plane's CPU profile from
// its readiness (--profile), for about as long as admitting every agent
// takes (the default 1,000 a second, plus a second), into
// Profile.restart.cpu, and returns the function that waits for it.
func (h *harness) profileRestart(ctx context.Context) func() error {
	if h.o.Profile == "" {
		return func() error { return nil }
	}
	secs := min(h.o.Nodes/1000+2, int(maxProfile/time.Second))
	done := make(chan error, 1)
	go func() {
		done <- h.cp.profile(ctx, "profile", fmt.Sprintf("seconds=%d", secs), h.o.Profile+".restart.cpu")
	}()
	return func() error { return <-done }
}

// steady makes the changes and waits until every agent that must see
// each has ACKed it.
func (h *harness) steady(ctx context.Context) error {
	before, err := h.agentsReport(ctx, "")
	if err != nil {
		return err
	}
	if err := procfs.ResetPeak(h.cp.pid()); err != nil {
		return err
	}
	reviews0, err := h.reviews(ctx)
	if err != nil {
		return err
	}
	heap := sampleHeap(ctx, h.cp, h.o.HeapSample)
	prof := h.profileSteady(ctx)
	cpu0 := h.m.cpu()
	t0 := time.Now()
	recs, err := h.ch.run(ctx, h.o.Changes, h.o.Pace)
	if err != nil {
		return err
	}
	var figs []changeFig
	var rep contract.AgentsReport
	since := strconv.FormatInt(recs[0].Trigger.UnixNano(), 10)
	err = poll(ctx, "every change ACKed by every agent that must see it", pollInterval, h.o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if rep, err = h.agentsReport(ctx, "bitmaps=1&since="+since); err != nil {
			return false, err
		}
		figs = h.changeFigures(recs, rep.Changes)
		for _, f := range figs {
			if f.Missing > 0 {
				return false, nil
			}
		}
		return true, nil
	})
	cpu := h.m.since(cpu0)
	f := &h.res.Steady
	f.Window = time.Since(t0)
	if perr := prof(); perr != nil {
		log.Printf("profiles: %v", perr)
	}
	if err == nil {
		// After the CPU window: ListNodes costs the control plane too.
		if f.Convergence, err = h.convergence(ctx, recs); err != nil {
			return err
		}
	}
	f.Changes, f.CPU, f.Mem = figs, cpu, h.cpMem(ctx, heap.stop())
	f.Agents = sub(rep.Counters, before.Counters)
	for _, c := range figs {
		h.res.Checks.Missing += c.Missing
		f.Duration = max(f.Duration, c.Trigger.Add(c.LastAck).Sub(recs[0].Trigger))
	}
	if err != nil {
		return fmt.Errorf("%w (%d change-agent pairs missing)", err, h.res.Checks.Missing)
	}
	f.Reviews, err = h.reviewsSince(ctx, reviews0)
	return err
}

// changeFigures matches the agents' reports to the changes made.
func (h *harness) changeFigures(recs []changeRec, reports []contract.ChangeReport) []changeFig {
	byTrigger := make(map[int64]contract.ChangeReport, len(reports))
	for _, r := range reports {
		byTrigger[r.Trigger] = r
	}
	out := make([]changeFig, len(recs))
	for i, rec := range recs {
		f := changeFig{changeRec: rec}
		r, ok := byTrigger[rec.Trigger.UnixNano()]
		for n := range h.o.Nodes {
			if !rec.expects(n) {
				continue
			}
			f.Expected++
			if !ok || r.AckedBy == nil || r.AckedBy[n/8]&(1<<(n%8)) == 0 {
				f.Missing++
			}
		}
		if ok {
			f.Reached, f.Acked = r.Reached, r.Acked
			f.LastReach = time.Duration(r.LastReach - rec.Trigger.UnixNano())
			f.LastAck = time.Duration(r.LastAck - rec.Trigger.UnixNano())
		}
		out[i] = f
	}
	return out
}

// restart stops the control plane with every agent current, starts a
// new one, and waits until every agent is current on it again.
func (h *harness) restart(ctx context.Context) error {
	var rep contract.AgentsReport
	var err error
	if err := poll(ctx, "every agent current before the restart", pollInterval, h.o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if rep, err = h.agentsReport(ctx, "versions=1"); err != nil {
			return false, err
		}
		n, _, err := h.cp.current(ctx, rep.Versions)
		return err == nil && n == h.o.Nodes, err
	}); err != nil {
		return err
	}
	before := rep
	reviews0, err := h.reviews(ctx)
	if err != nil {
		return err
	}
	oldPid := h.cp.pid()
	oldCPU, err := procfs.CPU(oldPid)
	if err != nil {
		return err
	}
	cpu0 := h.m.cpu()
	tTerm := time.Now()
	if err := h.cp.proc.stop(); err != nil {
		return err
	}
	f := &h.res.Restart
	f.Stop = time.Since(tTerm)
	if st := h.cp.proc.cmd.ProcessState; st != nil {
		f.OldCPU = st.UserTime() + st.SystemTime() - oldCPU
	}
	h.m.set(pControlPlane, 0)
	tStart := time.Now()
	if err := h.cp.start(ctx, h.o.PhaseTimeout); err != nil {
		return err
	}
	f.Ready = time.Since(tStart)
	tReady := time.Now()
	h.m.set(pControlPlane, h.cp.pid())
	heap := sampleHeap(ctx, h.cp, h.o.HeapSample)
	prof := h.profileRestart(ctx)
	defer func() {
		if perr := prof(); perr != nil {
			log.Printf("restart profile: %v", perr)
		}
	}()
	var lastCurrent time.Time
	err = poll(ctx, "every agent current after the restart", pollInterval, h.o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if rep, err = h.agentsReport(ctx, "versions=1"); err != nil {
			return false, err
		}
		for _, s := range rep.SessionStarts {
			if s < tTerm.UnixNano() {
				return false, nil // still on the old stream, or none
			}
		}
		if rep.Connected < h.o.Nodes {
			return false, nil
		}
		n, last, err := h.cp.current(ctx, rep.Versions)
		lastCurrent = last
		return err == nil && n == h.o.Nodes, nil
	})
	cpu := h.m.since(cpu0)
	if d, cerr := procfs.CPU(h.cp.pid()); cerr == nil {
		cpu[pControlPlane] = d // all of the new process's
	}
	f.CPU, f.Mem = cpu, h.cpMem(ctx, heap.stop())
	f.Agents = sub(rep.Counters, before.Counters)
	h.res.Checks.RestartTableBytes = f.Agents.SnapshotBytes + f.Agents.DeltaBytes
	if err != nil {
		return fmt.Errorf("%w (%d of %d connected)", err, rep.Connected, rep.Agents)
	}
	// An agent is current once the control plane has taken its hello
	// (and found nothing to send) or its ACK: ListNodes' acked_at, the
	// control plane's own time. The agents' hellos go out before the new
	// process is ready, so their times would be too early.
	f.Current = lastCurrent.Sub(tTerm)
	f.CurrentAfterReady = lastCurrent.Sub(tReady)
	log.Printf("every agent current %v after SIGTERM, %d table bytes resent", f.Current.Round(time.Millisecond), h.res.Checks.RestartTableBytes)
	if f.Reviews, err = h.reviewsSince(ctx, reviews0); err != nil {
		return err
	}
	return h.finishAgents(ctx)
}

// finishAgents records the run's agent totals and stops the agents and
// the control plane, so that the peer runs alone with the API server.
func (h *harness) finishAgents(ctx context.Context) error {
	rep, err := h.agentsReport(ctx, "")
	if err != nil {
		return err
	}
	h.res.Agents = rep.Counters
	h.res.Checks.Nacks, h.res.Checks.NackErrors = rep.Counters.Nacks, rep.NackErrors
	if err := h.agents.stop(); err != nil {
		return err
	}
	h.m.set(pAgents, 0)
	for i, cp := range h.cps {
		if cp.proc == nil || !cp.proc.running() {
			continue // a replica lost (replicaLoss)
		}
		if err := cp.proc.stop(); err != nil {
			return err
		}
		h.m.set(replicaName(i), 0)
	}
	h.m.set(pControlPlane, 0)
	return nil
}

// peer runs the informer sets with the control plane stopped: their
// initial sync, then changes at the same pace.
func (h *harness) peer(ctx context.Context) error {
	o := h.o
	f := &peerFigures{Sets: o.PeerSets, Changes: o.PeerChanges}
	h.res.Peer = f
	if c := o.Changes; c > 0 {
		f.BaselineAPICPU = h.res.Steady.CPU[pAPIServer] / time.Duration(c)
	}
	cpu0 := h.m.cpu()
	p, url, err := startChild(ctx, rolePeer, []string{
		"--kubeconfig=" + h.cluster.AdminKubeconfig(), fmt.Sprintf("--sets=%d", o.PeerSets),
		"--node-prefix=" + nodePrefix, "--spread=" + o.Spread.String(),
	}, filepath.Join(o.Dir, "peer.log"))
	if err != nil {
		return err
	}
	defer func() {
		if err := p.stop(); err != nil {
			log.Print(err)
		}
		h.m.set(pPeer, 0)
	}()
	h.m.set(pPeer, p.pid())
	var rep contract.PeerReport
	if err := poll(ctx, "every informer set synced", pollInterval, o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if err := getJSON(ctx, url+"/report", &rep); err != nil {
			return false, err
		}
		return rep.Synced == rep.Sets, nil
	}); err != nil {
		return fmt.Errorf("%w (%d of %d synced; errors %v)", err, rep.Synced, rep.Sets, rep.Errors)
	}
	f.Sync = time.Duration(rep.SyncedMax - rep.Started)
	f.SyncCPU, f.SyncWire, f.SyncBody = h.m.since(cpu0), rep.WireBytes, rep.BodyBytes
	log.Printf("%d informer sets synced in %v", rep.Sets, f.Sync.Round(time.Millisecond))

	before := rep
	cpu1 := h.m.cpu()
	recs, err := h.ch.run(ctx, o.PeerChanges, o.Pace)
	if err != nil {
		return err
	}
	if err := poll(ctx, "every informer set seeing every change", pollInterval, o.PhaseTimeout, func(ctx context.Context) (bool, error) {
		if err := getJSON(ctx, url+"/report", &rep); err != nil {
			return false, err
		}
		return rep.SliceUpdatesMin >= uint64(o.PeerChanges), nil
	}); err != nil {
		return err
	}
	f.Delivered = time.Since(recs[0].Trigger)
	f.CPU = h.m.since(cpu1)
	f.Wire, f.Body = rep.WireBytes-before.WireBytes, rep.BodyBytes-before.BodyBytes
	f.Heap, f.Errors = rep.HeapInuse, rep.Errors
	return nil
}

// convergence reads the control plane's convergence SLI (ListNodes) for
// the changes made: those it lists whose start is a change's trigger
// time. It waits for listNodesEvery since the harness's last call, which
// a control plane may limit.
func (h *harness) convergence(ctx context.Context, recs []changeRec) ([]convergenceFig, error) {
	if wait := listNodesEvery - time.Since(h.cp.lastList); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	h.cp.lastList = time.Now()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := h.cp.client.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListNodes: %w", err)
	}
	made := make(map[int64]bool, len(recs))
	for _, r := range recs {
		made[r.Trigger.UnixNano()] = true
	}
	var out []convergenceFig
	for _, c := range resp.GetConvergence() {
		start := c.GetStartedAt().AsTime()
		if !c.GetFromTriggerTime() || !made[start.UnixNano()] {
			continue
		}
		f := convergenceFig{Trigger: start, Nodes: int(c.GetNodes()), Converged: int(c.GetConverged()), Reached: map[string]time.Duration{}}
		for _, q := range c.GetReached() {
			f.Reached[strconv.FormatFloat(q.GetQuantile(), 'f', -1, 64)] = q.GetAfter().AsDuration()
		}
		out = append(out, f)
	}
	return out, nil
}
