package main

import (
	"time"

	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/contract"
)

// Results are a run's raw figures, written as JSON and printed as a
// table.
type Results struct {
	Machine machine `json:"machine"`
	Sizes   sizes   `json:"sizes"`
	// ControlPlaneArgs are the control plane's flags.
	ControlPlaneArgs []string `json:"controlPlaneArgs"`
	// Create is how long creating the world took.
	Create time.Duration `json:"create"`
	// Secure: the run used TLS and agents' tokens (--secure); Identities
	// are the figures of their setup, nil without.
	Secure     bool             `json:"secure"`
	Identities *identityFigures `json:"identities,omitempty"`
	// ZstdEntries: the agents announced compressed snapshots
	// (--zstd-entries).
	ZstdEntries bool `json:"zstdEntries"`
	// Start is the control plane's first start: process start to ready
	// (informers synced, first world published).
	Start startFigures `json:"start"`
	Cold  coldFigures  `json:"cold"`
	// Idle is the control plane's CPU per second with agents connected
	// and nothing changing.
	Idle    time.Duration  `json:"idlePerSecond"`
	Steady  steadyFigures  `json:"steady"`
	Restart restartFigures `json:"restart"`
	// ReplicaLoss replaces Restart with several replicas (--replicas).
	ReplicaLoss *replicaLossFigures `json:"replicaLoss,omitempty"`
	// Floor is the gRPC floor's (floor.go); OnlyFloor, a run of it alone.
	Floor     *floorFigures     `json:"floor,omitempty"`
	OnlyFloor bool              `json:"onlyFloor,omitempty"`
	Peer      *peerFigures      `json:"peer,omitempty"`
	Checks    checks            `json:"checks"`
	Agents    contract.Counters `json:"agentCounters"`
}

type machine struct {
	Cores    int    `json:"cores"`
	CPU      string `json:"cpu"`
	MemTotal uint64 `json:"memTotal"`
	Kernel   string `json:"kernel"`
	Go       string `json:"go"`
	// Load is /proc/loadavg at the start and the end: other jobs may
	// share the cores.
	Load [2]string `json:"load"`
}

type sizes struct {
	Nodes, Services, EndpointsPer  int
	Hinted, Local, LoadBalancers   int
	Changes, PeerSets, PeerChanges int
	Pace                           time.Duration
	// HeapSample is Options.HeapSample.
	HeapSample time.Duration
}

type startFigures struct {
	Ready time.Duration            `json:"ready"`
	CPU   map[string]time.Duration `json:"cpu"`
	Mem   memFigures               `json:"mem"`
}

type coldFigures struct {
	// AllValid is /start to the last agent's first ACK.
	AllValid time.Duration            `json:"allValid"`
	CPU      map[string]time.Duration `json:"cpu"`
	Mem      memFigures               `json:"mem"`
	// Delta of the agents' counters over the phase.
	Agents     contract.Counters   `json:"agents"`
	Tables     contract.TableStats `json:"tables"`
	AgentsHeap uint64              `json:"agentsHeap"`
	// Reviews the control plane asked for (--secure only).
	Reviews *reviewCounts `json:"reviews,omitempty"`
}

type steadyFigures struct {
	Changes []changeFig              `json:"changes"`
	CPU     map[string]time.Duration `json:"cpu"`
	Mem     memFigures               `json:"mem"`
	Agents  contract.Counters        `json:"agents"`
	// Duration is the first change to the last expected ACK; Window the
	// CPU measurement's (until the harness saw every ACK).
	Duration time.Duration `json:"duration"`
	Window   time.Duration `json:"window"`
	// Reviews the control plane asked for (--secure only).
	Reviews *reviewCounts `json:"reviews,omitempty"`
	// Convergence is the control plane's own convergence SLI of the
	// changes it still lists (its latest 64), from ListNodes.
	Convergence []convergenceFig `json:"convergence,omitempty"`
}

// convergenceFig is one change as the control plane's convergence SLI
// saw it: the time from its trigger time until each share of the agents
// it counts (those whose table the change alters) had acknowledged it.
type convergenceFig struct {
	Trigger   time.Time                `json:"trigger"`
	Nodes     int                      `json:"nodes"`
	Converged int                      `json:"converged"`
	Reached   map[string]time.Duration `json:"reached"`
}

// changeFig is one change and what the agents saw of it.
type changeFig struct {
	changeRec
	Expected, Reached, Acked, Missing int
	// LastReach and LastAck are from the trigger time to the last agent
	// receiving and ACKing it.
	LastReach, LastAck time.Duration
}

type restartFigures struct {
	// Stop is SIGTERM to exit; Ready the new process's start to ready;
	// Current SIGTERM to every agent current again, CurrentAfterReady
	// from ready.
	Stop, Ready, Current, CurrentAfterReady time.Duration
	// OldCPU is the old process's CPU from SIGTERM to exit; CPU is every
	// process's from SIGTERM until all are current (the new control
	// plane's from its start).
	OldCPU time.Duration            `json:"oldCPU"`
	CPU    map[string]time.Duration `json:"cpu"`
	Mem    memFigures               `json:"mem"`
	Agents contract.Counters        `json:"agents"`
	// Reviews the new control plane asked for (--secure only): with
	// empty caches, one TokenReview per agent.
	Reviews *reviewCounts `json:"reviews,omitempty"`
}

type peerFigures struct {
	Sets int `json:"sets"`
	// Sync is process start to every set synced.
	Sync      time.Duration            `json:"sync"`
	SyncCPU   map[string]time.Duration `json:"syncCPU"`
	SyncWire  uint64                   `json:"syncWire"`
	SyncBody  uint64                   `json:"syncBody"`
	Changes   int                      `json:"changes"`
	CPU       map[string]time.Duration `json:"cpu"`
	Wire      uint64                   `json:"wire"`
	Body      uint64                   `json:"body"`
	Heap      uint64                   `json:"heap"`
	Errors    []string                 `json:"errors,omitempty"`
	Delivered time.Duration            `json:"delivered"`
	// BaselineAPICPU is the API server's CPU per change in the steady
	// phase, when the control plane was its only watcher.
	BaselineAPICPU time.Duration `json:"baselineAPICPU"`
}

// checks are what the smoke test asserts.
type checks struct {
	// ValidAgents hold a valid table after the cold start.
	ValidAgents int `json:"validAgents"`
	// Nacks over the whole run: every table validated.
	Nacks uint64 `json:"nacks"`
	// Missing counts (change, agent) pairs an agent should have ACKed
	// but did not.
	Missing int `json:"missing"`
	// RestartTableBytes are table bytes sent after the restart.
	RestartTableBytes uint64 `json:"restartTableBytes"`
	// NackErrors are the first few.
	NackErrors []string `json:"nackErrors,omitempty"`
	// FloorMissing counts (round, client) pairs of the gRPC floor without
	// a reply.
	FloorMissing int `json:"floorMissing"`
}

func sub(a, b contract.Counters) contract.Counters {
	return contract.Counters{
		Snapshots: a.Snapshots - b.Snapshots, Deltas: a.Deltas - b.Deltas, Keepalives: a.Keepalives - b.Keepalives,
		SnapshotBytes: a.SnapshotBytes - b.SnapshotBytes, DeltaBytes: a.DeltaBytes - b.DeltaBytes, WireBytes: a.WireBytes - b.WireBytes,
		Acks: a.Acks - b.Acks, Nacks: a.Nacks - b.Nacks,
		Sessions: a.Sessions - b.Sessions, Reconnects: a.Reconnects - b.Reconnects, Failures: a.Failures - b.Failures,
		TrackDropped: a.TrackDropped - b.TrackDropped,
	}
}
