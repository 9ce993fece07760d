package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/proxyplane/proxyplane/e2e/cluster"
	"github.com/proxyplane/proxyplane/e2e/cmd/fleet/internal/procfs"
)

// binDirEnv is where `make e2e` puts the binaries (as e2e/box reads it).
const binDirEnv = "E2E_BIN_DIR"

// harness is one run's state, driven from one goroutine.
type harness struct {
	o       *Options
	m       *meter
	cluster *cluster.Cluster
	css     []kubernetes.Interface
	w       *world
	ch      *changer
	cp      *controlPlane
	// cps are every control plane replica, cp first (--replicas).
	cps    []*controlPlane
	agents *proc
	// creds are the agents' CA bundle and tokens; nil in plaintext.
	creds *agentCredentials
	// agentsURL is the agents' process's control endpoint.
	agentsURL string
	// trackAfter: the agents track trigger times after it.
	trackAfter time.Time
	res        *Results
}

// run runs every phase and returns the figures.
func run(ctx context.Context, o *Options) (*Results, error) {
	if !o.OnlyFloor {
		if err := resolveBinaries(o); err != nil {
			return nil, err
		}
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "fleet-")
		if err != nil {
			return nil, fmt.Errorf("creating run directory: %w", err)
		}
		o.Dir = d
	}
	// A --dir that does not exist yet: the API server's would create it,
	// but --only-floor runs none.
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating run directory: %w", err)
	}
	o.complete()
	log.Printf("logs and state in %s", o.Dir)
	// Room for every agent's connection, here and in the children, which
	// inherit it.
	if err := procfs.RaiseNoFile(uint64(2*o.Nodes + 8192)); err != nil {
		return nil, err
	}
	h := &harness{o: o, m: newMeter(), res: &Results{Machine: machineFacts()}}
	defer h.close(ctx)
	type step struct {
		name string
		f    func(context.Context) error
	}
	var steps []step
	if o.OnlyFloor {
		h.res.OnlyFloor = true
		h.res.Sizes = sizes{Nodes: o.Nodes, Pace: o.Pace}
		steps = []step{{"gRPC floor", h.floor}}
	} else {
		if err := h.setup(ctx); err != nil {
			return nil, err
		}
		steps = []step{
			{"cold start", h.coldStart},
			{"idle", h.idle},
			{"steady changes", h.steady},
			{"restart", h.restart},
		}
		if o.Replicas > 1 {
			steps[len(steps)-1] = step{"replica loss", h.replicaLoss}
		}
		if o.Floor {
			steps = append(steps, step{"gRPC floor", h.floor})
		}
		if o.Peer {
			steps = append(steps, step{"peer", h.peer})
		}
	}
	for _, s := range steps {
		log.Printf("phase: %s", s.name)
		if err := s.f(ctx); err != nil {
			return h.res, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	h.res.Machine.Load[1] = loadAverage()
	if err := writeJSON(o.JSON, h.res); err != nil {
		return h.res, err
	}
	log.Printf("raw figures in %s", o.JSON)
	return h.res, nil
}

// setup starts the API server, creates the world and starts the control
// plane and the agents' process (whose agents wait for /start).
func (h *harness) setup(ctx context.Context) error {
	o := h.o
	startCtx, cancel := context.WithTimeout(ctx, cluster.DefaultReadyTimeout+time.Minute)
	c, err := cluster.New(startCtx, cluster.Config{
		Binary: o.APIServer, Dir: filepath.Join(o.Dir, "cluster"), APIServerArgs: apiServerArgs(o),
	})
	cancel()
	if err != nil {
		return fmt.Errorf("starting e2e-apiserver: %w", err)
	}
	h.cluster = c
	pid, err := procfs.FindByArg(o.APIServer, "--dir="+c.Dir())
	if err != nil {
		return fmt.Errorf("finding the API server's process: %w", err)
	}
	h.m.set(pAPIServer, pid)
	cfg, err := c.AdminConfig()
	if err != nil {
		return err
	}
	if h.css, err = clients(cfg, o.Clients); err != nil {
		return err
	}
	h.w = newWorld(o)
	h.ch = newChanger(h.w, h.css[0], o.Changes+o.PeerChanges)
	h.res.Sizes = sizes{
		Nodes: o.Nodes, Services: o.Services, EndpointsPer: o.EndpointsPer,
		Hinted: len(h.w.byClass[hinted]), Local: len(h.w.byClass[local]), LoadBalancers: (len(h.w.byClass[local]) + 1) / 2,
		Changes: o.Changes, Pace: o.Pace, HeapSample: o.HeapSample,
	}
	if o.Peer {
		h.res.Sizes.PeerSets, h.res.Sizes.PeerChanges = o.PeerSets, o.PeerChanges
	}
	t0 := time.Now()
	// Every object's trigger time is its creation; the agents track only
	// later ones, the changes'.
	if err := createWorld(ctx, h.css, h.w, o.Workers, t0); err != nil {
		return err
	}
	h.res.Create = time.Since(t0)
	h.res.Secure = o.Secure
	h.res.ZstdEntries = o.ZstdEntries
	if o.Secure {
		if err := h.setupSecure(ctx); err != nil {
			return err
		}
	}

	extra := o.ControlPlaneArgs
	if o.Profile != "" {
		extra = append(slices.Clone(extra), "--profiling")
	}
	cpCfg := controlPlaneConfig{
		Binary: o.ControlPlane, Kubeconfig: c.AdminKubeconfig(), Dir: o.Dir, Secure: o.Secure, Extra: extra,
	}
	if h.cp, err = newControlPlane(ctx, cpCfg); err != nil {
		return err
	}
	h.cps = []*controlPlane{h.cp}
	h.res.ControlPlaneArgs = h.cp.args
	if err := h.startControlPlane(ctx); err != nil {
		return err
	}
	if o.Secure {
		err = h.connectSecure(ctx, cfg.BearerToken)
	} else {
		err = h.cp.connect(nil, "")
	}
	if err != nil {
		return err
	}
	if o.Replicas > 1 {
		if err := h.startReplicas(ctx, cpCfg); err != nil {
			return err
		}
	}
	h.trackAfter = time.Now()
	h.agents, h.agentsURL, err = startChild(ctx, roleAgents, append([]string{
		"--address=" + strings.Join(h.addresses(), ","), fmt.Sprintf("--nodes=%d", o.Nodes), "--node-prefix=" + nodePrefix,
		fmt.Sprintf("--track-after=%d", h.trackAfter.UnixNano()), fmt.Sprintf("--decoders=%d", o.Decoders),
		fmt.Sprintf("--max-changes=%d", o.Changes+o.PeerChanges+16),
		fmt.Sprintf("--zstd-entries=%t", o.ZstdEntries),
	}, h.creds.agentArgs()...), filepath.Join(o.Dir, "agents.log"))
	if err != nil {
		return err
	}
	h.m.set(pAgents, h.agents.pid())
	return nil
}

// startControlPlane starts the first control plane and records what its
// start cost.
func (h *harness) startControlPlane(ctx context.Context) error {
	cpu0 := h.m.cpu()
	t0 := time.Now()
	if err := h.cp.start(ctx, h.o.PhaseTimeout); err != nil {
		return err
	}
	h.res.Start.Ready = time.Since(t0)
	h.m.set(pControlPlane, h.cp.pid())
	cpu := h.m.since(cpu0)
	// The control plane's CPU is all since its start.
	if d, err := procfs.CPU(h.cp.pid()); err == nil {
		cpu[pControlPlane] = d
	}
	h.res.Start.CPU = cpu
	h.res.Start.Mem = h.cpMem(ctx, 0)
	log.Printf("control plane ready in %v (flags %s)", h.res.Start.Ready.Round(time.Millisecond), strings.Join(h.cp.args, " "))
	return nil
}

// cpMem reads the control plane's memory now; peakHeap is the sampled
// peak, raised to the heap now.
func (h *harness) cpMem(ctx context.Context, peakHeap uint64) memFigures {
	var f memFigures
	if m, err := procfs.Mem(h.cp.pid()); err == nil {
		f.RSS, f.PeakRSS = m.RSS, m.HWM
	}
	if rt, err := h.cp.runtimeMem(ctx); err == nil {
		f.Heap, f.Runtime = rt.HeapInuse, &rt
	}
	f.PeakHeap = max(peakHeap, f.Heap)
	return f
}

// close stops everything still running; ctx may be done (an interrupt),
// so the API server's stop gets a deadline of its own.
func (h *harness) close(ctx context.Context) {
	if h.agents != nil && h.agents.running() {
		if err := h.agents.stop(); err != nil {
			log.Print(err)
		}
	}
	if h.cp != nil {
		for _, cp := range h.cps {
			cp.close()
		}
	}
	if h.cluster != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cluster.DefaultStopTimeout)
		defer cancel()
		if err := h.cluster.Stop(ctx); err != nil {
			log.Printf("stopping e2e-apiserver: %v", err)
		}
	}
}

// apiServerArgs widens the NodePort range when the default one (2,768
// ports) cannot hold the eTP Local Services' node ports and health check
// ports.
func apiServerArgs(o *Options) []string {
	need := int(float64(o.Services)*o.LocalPercent/100*2) + 100
	if need <= 2768 {
		return nil
	}
	return []string{fmt.Sprintf("--service-node-port-range=30000-%d", min(30000+need, 65535))}
}

// resolveBinaries fills in the default binary paths and checks them.
func resolveBinaries(o *Options) error {
	if o.APIServer == "" {
		p, err := cluster.BinaryPath()
		if err != nil {
			return fmt.Errorf("%w (build it with make e2e-apiserver)", err)
		}
		o.APIServer = p
	}
	if o.ControlPlane == "" {
		p, err := findControlPlane()
		if err != nil {
			return err
		}
		o.ControlPlane = p
	}
	for _, p := range []*string{&o.APIServer, &o.ControlPlane} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("resolving %s: %w", *p, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%w (make bench-fleet builds it)", err)
		}
		*p = abs
	}
	return nil
}

// findControlPlane returns $E2E_BIN_DIR/controlplane, or .bin/controlplane
// in the nearest directory above the working directory that has one.
func findControlPlane() (string, error) {
	if d := os.Getenv(binDirEnv); d != "" {
		return filepath.Join(d, "controlplane"), nil
	}
	p, err := cluster.FindBin("controlplane")
	if err != nil {
		return "", fmt.Errorf("%w ($%s unset; make build)", err, binDirEnv)
	}
	return p, nil
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding figures: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing figures: %w", err)
	}
	return nil
}
