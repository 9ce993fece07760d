package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
)

// Options configures a run. Defaults are in newOptions, with reasons.
type Options struct {
	// APIServer is e2e-apiserver; ControlPlane the controlplane binary.
	APIServer, ControlPlane string
	// Dir receives the API server's state, every process's log and
	// fleet.json; a new temporary directory when empty.
	Dir string
	// Nodes (N) is the number of Node objects and agents.
	Nodes int
	// Services (S) and EndpointsPer, the endpoints of each Service.
	Services, EndpointsPer int
	// HintedPercent of Services are topology-hinted; LocalPercent have
	// externalTrafficPolicy Local.
	HintedPercent, LocalPercent float64
	// Changes (C) endpoint changes, one per Pace.
	Changes int
	Pace    time.Duration
	// Spread is the time over which the agents connect at cold start.
	Spread time.Duration
	// Idle is the quiet window before the changes that measures the
	// control plane's idle CPU (keepalives, resyncs).
	Idle time.Duration
	// HeapSample is how often a phase scrapes the control plane's heap
	// in use for its peak; 0 only at the phase's end.
	HeapSample time.Duration
	// Peer runs the peer; PeerSets is its number of informer sets and
	// PeerChanges its changes.
	Peer                  bool
	PeerSets, PeerChanges int
	// Floor runs the gRPC floor after the restart, FloorRounds rounds at
	// Pace; OnlyFloor runs it alone, without the API server and the
	// control plane.
	Floor, OnlyFloor bool
	FloorRounds      int
	// Workers create objects in parallel over Clients connections.
	Workers, Clients int
	// Decoders bounds responses the agents decode at once.
	Decoders int
	// ZstdEntries makes the agents announce Capabilities.zstd_entries and
	// zstd_entries_unhashed, as nodeagent does, and inflate the compressed
	// snapshots they get (computing the hashes of unhashed runs).
	ZstdEntries bool
	// Replicas is the number of control plane processes; the agents
	// split over them by rendezvous, and with more than one the replica
	// loss phase (replicas.go) replaces the restart.
	Replicas int
	// PhaseTimeout bounds each wait for a phase to complete.
	PhaseTimeout time.Duration
	// ControlPlaneArgs are passed to the control plane as they are.
	ControlPlaneArgs []string
	// Secure runs the control plane as production does (TLS from its
	// bootstrapped CA, agents' ServiceAccount tokens reviewed), with a
	// Pod and a bound token per node; otherwise it runs with --insecure.
	Secure bool
	// Seed makes the world and the changes reproducible.
	Seed uint64
	// JSON is where the raw figures go; empty means Dir/fleet.json.
	JSON string
	// Profile, when set, runs the control plane with --profiling and
	// writes its CPU profile of the idle window to Profile.idle.cpu and
	// of the steady phase to Profile.cpu, its heap
	// and goroutine profiles at the phase's end to Profile.heap and
	// Profile.goroutine, and the restarted process's CPU profile from its
	// readiness to Profile.restart.cpu.
	Profile string
}

func newOptions() *Options {
	return &Options{
		// Small enough to run in a minute; the sizes are flags.
		Nodes: 100, Services: 1000, EndpointsPer: 3,
		// The mix.
		HintedPercent: 10, LocalPercent: 5,
		Changes: 100, Pace: 100 * time.Millisecond,
		// "Within about a second", as a rolling restart of a DaemonSet
		// never does but a control plane failover can.
		Spread: time.Second,
		Idle:   2 * time.Second,
		// Each scrape costs the control plane CPU counted in the phase:
		// every 250 ms (as before 2026-11-27) it was 10% of a 1,000-agent
		// cold start's. Every 2 s still sees a cold start's peak, which
		// lasts as long as the agents connect.
		HeapSample: 2 * time.Second,
		Peer:       true,
		// The peer holds every Service and slice per set: 200 sets of
		// 10,000 Services is already several GB here.
		PeerSets: 200,
		// As many rounds as the steady phase has changes: the same window
		// of CPU ticks (10 ms each).
		Floor: true, FloorRounds: 100,
		// Two cores: more workers only queue in the API server.
		Workers: 32, Clients: 4,
		// Twice the cores.
		Decoders: 4,
		// One replica: the figures per replica; --replicas=3 measures a
		// loss.
		Replicas:     1,
		PhaseTimeout: 10 * time.Minute,
		// Insecure for now, so that existing runs compare with earlier
		// ones; --secure measures what production pays for TLS and tokens.
		Secure: false,
		Seed:   1,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.APIServer, "apiserver", o.APIServer, "Path of e2e-apiserver (default: $E2E_APISERVER, or .bin/e2e-apiserver in a parent directory).")
	fs.StringVar(&o.ControlPlane, "controlplane", o.ControlPlane, "Path of the controlplane binary (default: $E2E_BIN_DIR/controlplane, or .bin/controlplane in a parent directory).")
	fs.StringVar(&o.Dir, "dir", o.Dir, "Directory for the API server's state, the logs and fleet.json (default: a new temporary directory, kept).")
	fs.IntVar(&o.Nodes, "nodes", o.Nodes, "Nodes and agents (N).")
	fs.IntVar(&o.Services, "services", o.Services, "Services (S).")
	fs.IntVar(&o.EndpointsPer, "endpoints", o.EndpointsPer, "Endpoints per Service.")
	fs.Float64Var(&o.HintedPercent, "hinted-percent", o.HintedPercent, "Percent of Services topology-hinted (trafficDistribution PreferClose).")
	fs.Float64Var(&o.LocalPercent, "local-percent", o.LocalPercent, "Percent of Services with externalTrafficPolicy Local (LoadBalancer and NodePort alternately).")
	fs.IntVar(&o.Changes, "changes", o.Changes, "Endpoint changes in the steady phase (C).")
	fs.DurationVar(&o.Pace, "pace", o.Pace, "Time between changes.")
	fs.DurationVar(&o.Spread, "spread", o.Spread, "Cold start: the agents connect evenly over this time.")
	fs.DurationVar(&o.Idle, "idle", o.Idle, "Quiet window measuring the control plane's idle CPU before the changes.")
	fs.DurationVar(&o.HeapSample, "heap-sample", o.HeapSample, "How often a phase scrapes the control plane's /metrics for its peak heap (a cost to the control plane's CPU, counted in the phase); 0 scrapes only at the phase's end. 250ms is the harness's cadence before 2026-11-27.")
	fs.BoolVar(&o.Peer, "peer", o.Peer, "Run the peer (kube-proxy-style informer sets); --peer=false skips it.")
	fs.IntVar(&o.PeerSets, "peer-sets", o.PeerSets, "Informer sets of the peer (capped at --nodes).")
	fs.IntVar(&o.PeerChanges, "peer-changes", o.PeerChanges, "Changes in the peer phase (default: --changes).")
	fs.BoolVar(&o.Floor, "floor", o.Floor, "Run the gRPC floor after the restart; --floor=false skips it.")
	fs.IntVar(&o.FloorRounds, "floor-rounds", o.FloorRounds, "Rounds of the gRPC floor, one per --pace.")
	fs.BoolVar(&o.OnlyFloor, "only-floor", o.OnlyFloor, "Run only the gRPC floor, with --nodes clients (no API server, no control plane).")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Parallel object creations.")
	fs.IntVar(&o.Clients, "clients", o.Clients, "API server connections the workers share.")
	fs.IntVar(&o.Decoders, "decoders", o.Decoders, "Responses the agents decode at once.")
	fs.BoolVar(&o.ZstdEntries, "zstd-entries", o.ZstdEntries, "Agents announce compressed snapshots (Capabilities.zstd_entries and zstd_entries_unhashed), as nodeagent does (default: plain, as agents before it).")
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "Control plane processes; the agents split over them by rendezvous, and with more than one, one is killed after the steady changes in place of the restart.")
	fs.DurationVar(&o.PhaseTimeout, "phase-timeout", o.PhaseTimeout, "Bound on each phase's wait.")
	fs.StringArrayVar(&o.ControlPlaneArgs, "controlplane-arg", o.ControlPlaneArgs, "Extra control plane flag, as --controlplane-arg=--log-level=warn (repeatable).")
	fs.BoolVar(&o.Secure, "secure", o.Secure, "Run as production does: TLS from the control plane's bootstrapped CA and a bound ServiceAccount token per agent, reviewed by the control plane (default: --insecure).")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "Seed of the world and the changes.")
	fs.StringVar(&o.JSON, "json", o.JSON, "Where to write the raw figures (default: <dir>/fleet.json).")
	fs.StringVar(&o.Profile, "profile", o.Profile, "Run the control plane with --profiling and write its CPU profile of the idle window (its whole seconds, with --idle of 1s or more) to <this>.idle.cpu, of the steady phase (at most 25 s of it) to <this>.cpu, its heap and goroutine profiles at the phase's end to <this>.heap and <this>.goroutine, and the restarted control plane's CPU profile from its readiness to <this>.restart.cpu (go tool pprof reads them).")
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	// Node pod CIDRs are /24s of 10.0.0.0/9.
	if o.Nodes < 3 || o.Nodes > 32768 {
		errs = append(errs, fmt.Errorf("--nodes %d: between 3 (one per zone) and 32768", o.Nodes))
	}
	// Cluster IPs come from the API server's /16.
	if o.Services < 1 || o.Services > 60000 {
		errs = append(errs, fmt.Errorf("--services %d: between 1 and 60000", o.Services))
	}
	if o.EndpointsPer < 1 || o.EndpointsPer > 1000 {
		errs = append(errs, fmt.Errorf("--endpoints %d: between 1 and 1000 (one slice per Service)", o.EndpointsPer))
	}
	if o.HintedPercent < 0 || o.LocalPercent < 0 || o.HintedPercent+o.LocalPercent > 100 {
		errs = append(errs, errors.New("--hinted-percent and --local-percent: not negative, at most 100 together"))
	}
	if o.Changes < 1 || o.PeerChanges < 0 {
		errs = append(errs, errors.New("--changes must be at least 1, --peer-changes not negative"))
	}
	if o.Pace <= 0 || o.Spread < 0 || o.Idle < 0 || o.HeapSample < 0 || o.PhaseTimeout <= 0 {
		errs = append(errs, errors.New("--pace and --phase-timeout must be positive, --spread, --idle and --heap-sample not negative"))
	}
	if o.Peer && o.PeerSets < 1 {
		errs = append(errs, errors.New("--peer-sets must be at least 1 (or --peer=false)"))
	}
	if (o.Floor || o.OnlyFloor) && o.FloorRounds < 1 {
		errs = append(errs, errors.New("--floor-rounds must be at least 1 (or --floor=false)"))
	}
	if o.OnlyFloor && o.Secure {
		errs = append(errs, errors.New("--secure: the gRPC floor alone (--only-floor) runs no control plane"))
	}
	if o.Replicas < 1 || o.Replicas > 16 {
		errs = append(errs, fmt.Errorf("--replicas %d: between 1 and 16", o.Replicas))
	}
	if o.Replicas > 1 && o.Secure {
		// Each replica would bootstrap and publish the CA; the harness
		// reads one bundle.
		errs = append(errs, errors.New("--replicas above 1 runs insecure only (not with --secure)"))
	}
	if o.Workers < 1 || o.Clients < 1 || o.Decoders < 1 {
		errs = append(errs, errors.New("--workers, --clients and --decoders must be at least 1"))
	}
	return errors.Join(errs...)
}

// complete fills in what depends on other options.
func (o *Options) complete() {
	if o.PeerChanges == 0 {
		o.PeerChanges = o.Changes
	}
	o.PeerSets = min(o.PeerSets, o.Nodes)
	if o.JSON == "" {
		o.JSON = filepath.Join(o.Dir, "fleet.json")
	}
}
