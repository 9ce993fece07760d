package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/e2e/cluster"
)

// TestFleetSmoke runs a tiny fleet end to end with the real binaries, in
// both modes (insecure: plaintext, no tokens, plain snapshots; secure: TLS
// from the control plane's bootstrapped CA and a bound token per agent,
// reviewed on every connect, and compressed snapshots): 20 agents, 60 Services, 10 changes, 5 rounds of the gRPC
// floor, 3 informer sets. It asserts what must hold at any size (every
// table valid, every change ACKed by every agent that must see it,
// nothing resent after a restart, every floor client replying in every
// round) and logs the table; timings are printed, never asserted.
func TestFleetSmoke(t *testing.T) {
	apiserver := cluster.RequireBinary(t)
	cp, err := findControlPlane()
	if err == nil {
		_, err = os.Stat(cp)
	}
	if err != nil {
		t.Skipf("controlplane is not built (%v): run `make build`, or `make e2e` to build and run everything", err)
	}
	for _, secure := range []bool{false, true} {
		name := map[bool]string{false: "insecure", true: "secure"}[secure]
		t.Run(name, func(t *testing.T) {
			o := newOptions()
			o.APIServer, o.ControlPlane, o.Dir, o.Secure = apiserver, cp, t.TempDir(), secure
			// Production's agents announce compressed snapshots; the
			// insecure run keeps the plain ones of agents before them.
			o.ZstdEntries = secure
			if listed, err := listsFlag(context.Background(), cp, "--profiling"); err == nil && listed {
				o.Profile = filepath.Join(o.Dir, "controlplane")
			}
			smoke(t, o)
			checkProfiles(t, o)
		})
	}
}

// smoke runs o at the smoke test's sizes and checks the run.
func smoke(t *testing.T, o *Options) {
	t.Helper()
	o.Nodes, o.Services, o.Changes = 20, 60, 10
	// Every class changes at least once: 2 hinted and 1 or 2 eTP Local.
	o.HintedPercent, o.LocalPercent = 20, 10
	o.Pace, o.Spread, o.Idle = 50*time.Millisecond, 200*time.Millisecond, 0
	o.PeerSets, o.PeerChanges = 3, 3
	o.FloorRounds = 5
	o.Workers, o.Clients = 8, 2
	// Bounds for a machine shared with builds; a healthy run takes
	// seconds per phase.
	o.PhaseTimeout = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	res, err := run(ctx, o)
	if err != nil {
		logTails(t, o.Dir)
		t.Fatalf("run: %v", err)
	}
	var out strings.Builder
	printTable(&out, res)
	t.Logf("figures:\n%s", out.String())

	if res.Secure != o.Secure || res.ZstdEntries != o.ZstdEntries {
		t.Errorf("the run's mode is secure=%t, zstd-entries=%t; want %t, %t", res.Secure, res.ZstdEntries, o.Secure, o.ZstdEntries)
	}
	if o.Secure {
		if slices.Contains(res.ControlPlaneArgs, "--insecure") {
			t.Errorf("a secure run passed --insecure: %v", res.ControlPlaneArgs)
		}
		if id := res.Identities; id == nil || id.TokenBytes == 0 {
			t.Errorf("a secure run without identity figures: %+v", id)
		}
	}
	ck := res.Checks
	if ck.ValidAgents != o.Nodes {
		t.Errorf("%d of %d agents hold a valid table after the cold start", ck.ValidAgents, o.Nodes)
	}
	if ck.Nacks != 0 {
		t.Errorf("%d NACKs: %v", ck.Nacks, ck.NackErrors)
	}
	if ck.Missing != 0 {
		t.Errorf("%d (change, agent) pairs not ACKed", ck.Missing)
	}
	for _, c := range res.Steady.Changes {
		if c.Acked < c.Expected {
			t.Errorf("change of %s (%s, zone %q): %d of %d expected agents ACKed it", c.Service, c.Class, c.Zone, c.Acked, c.Expected)
		}
	}
	if ck.RestartTableBytes != 0 {
		t.Errorf("the restarted control plane sent %d table bytes to agents that were current", ck.RestartTableBytes)
	}
	if res.Cold.Agents.Snapshots < uint64(o.Nodes) {
		t.Errorf("%d snapshots at cold start for %d agents", res.Cold.Agents.Snapshots, o.Nodes)
	}
	if res.Peer == nil || res.Peer.Sets != o.PeerSets || len(res.Peer.Errors) != 0 {
		t.Errorf("peer: %+v", res.Peer)
	}
	if rt := res.Steady.Mem.Runtime; rt == nil || rt.HeapInuse == 0 || rt.Stacks == 0 || rt.Goroutines < o.Nodes {
		t.Errorf("the control plane's memory as its runtime accounts for it: %+v", rt)
	}
	checkFloor(t, res.Floor, o.Nodes, o.FloorRounds)
}

// checkProfiles checks that a run with --profile wrote the control
// plane's profiles.
func checkProfiles(t *testing.T, o *Options) {
	t.Helper()
	if o.Profile == "" {
		t.Log("the control plane has no --profiling: no profiles taken")
		return
	}
	for _, kind := range []string{"cpu", "heap", "goroutine", "restart.cpu"} {
		if st, err := os.Stat(o.Profile + "." + kind); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", kind, err)
		}
	}
}

// TestFloorOnly runs the gRPC floor alone (--only-floor), which needs no
// other binary: 5 clients, 3 rounds.
func TestFloorOnly(t *testing.T) {
	o := newOptions()
	o.Dir, o.OnlyFloor = t.TempDir(), true
	o.Nodes, o.FloorRounds, o.Pace = 5, 3, 50*time.Millisecond
	o.PhaseTimeout = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	res, err := run(ctx, o)
	if err != nil {
		logTails(t, o.Dir)
		t.Fatalf("run: %v", err)
	}
	var out strings.Builder
	printTable(&out, res)
	t.Logf("figures:\n%s", out.String())
	checkFloor(t, res.Floor, o.Nodes, o.FloorRounds)
}

// checkFloor asserts that every one of clients replied in every one of
// rounds.
func checkFloor(t *testing.T, f *floorFigures, clients, rounds int) {
	t.Helper()
	if f == nil {
		t.Fatal("no gRPC floor figures")
	}
	if f.Expected != clients || len(f.Replies) != rounds || f.Missing != 0 {
		t.Errorf("gRPC floor: %d streams for %d clients, %d of %d rounds, %d replies missing", f.Expected, clients, len(f.Replies), rounds, f.Missing)
	}
	for i, n := range f.Replies {
		if n != clients {
			t.Errorf("gRPC floor round %d: %d of %d clients replied", i, n, clients)
		}
	}
}

// logTails logs the end of every log of the run.
func logTails(t *testing.T, dir string) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	more, _ := filepath.Glob(filepath.Join(dir, "cluster", "*.log"))
	for _, p := range append(logs, more...) {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		t.Logf("last lines of %s:\n%s", p, strings.Join(lines[max(0, len(lines)-30):], "\n"))
	}
}
