// Command kpbench compares proxyplane's nftables and iptables dataplanes
// with upstream kube-proxy's nftables and iptables modes on the same
// kernel, in one run, on several worlds: numbers of Services with 3
// endpoints each (--sizes: 1,000, 5,000 and 10,000 by default) and
// endpoint-heavy ones (--worlds: 5,000 x 50 and 10,000 x 25, 250,000
// endpoints each, the shape of kubernetes/kubernetes#135639).
//
// For each world it creates the NodePort Services with their ready
// endpoints in a real API server (e2e-apiserver), then, for each mode
// (--modes):
//
//   - runs upstream kube-proxy (v1.36.4, built from k8s.io/kubernetes by
//     `make bench-upstream`) with --proxy-mode=MODE in a fresh network
//     namespace, and reads its own sync durations from its metrics: the
//     first full sync, the syncs after one EndpointSlice changed and after
//     one Service was added; and its resident memory;
//   - programs the same Services with proxyplane's Dataplane of that mode
//     (nodeagent/dataplane/nftables or iptables) in another fresh
//     namespace, in a child process of its own (for its memory), timing
//     full syncs, one-endpoint and one-Service-added partial syncs;
//   - times the floors: each ruleset loaded by nft -f (or
//     iptables-restore) into an empty namespace, and one map element
//     added with nft and over netlink.
//
// It needs root (network namespaces, nf_tables) and the nft binary, and
// prints a Markdown table on stdout; progress goes to stderr, and
// kube-proxy's logs and both rulesets as `nft list table` printed them
// (kube-proxy-N.nft, proxyplane-N.nft) to --dir. Run it with
// `make bench-upstream`.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/proxyplane/proxyplane/e2e/cluster"
)

// Options configures a run. Defaults are in newOptions, with reasons.
type Options struct {
	// APIServer is the e2e-apiserver binary.
	APIServer string
	// KubeProxy is the upstream kube-proxy binary.
	KubeProxy string
	// Dir receives the API server's state and kube-proxy's logs; a new
	// temporary directory when empty.
	Dir string
	// Sizes are the numbers of Services with 3 endpoints each, measured
	// in increasing order (each adds Services to the API server), before
	// Worlds ("SxE": S Services of E endpoints), in the order given.
	Sizes  []int
	Worlds []string
	// Modes are the proxy modes measured in each world: nftables,
	// iptables.
	Modes []string
	// Reps is the number of proxyplane full syncs and nft -f loads per
	// size; UpstreamReps the number of kube-proxy processes (each one
	// first full sync). Medians are reported.
	Reps, UpstreamReps int
	// Partials is the number of one-Service updates per size, on each
	// side, and of one-element floors.
	Partials int
	// UpstreamTimeout bounds kube-proxy's first sync, and each nft
	// command on its ruleset.
	UpstreamTimeout time.Duration
	// Workers create objects in the API server in parallel.
	Workers int
	// Profile, in the proxyplane child, is where its syncs' profiles go.
	Profile string
}

func newOptions() *Options {
	return &Options{
		Sizes: []int{1000, 5000, 10000},
		// kubernetes/kubernetes#135639's world (5,006 Services, 250,000
		// endpoints), and as many endpoints over twice the Services.
		Worlds: []string{"5000x50", "10000x25"},
		Modes:  []string{"nftables"},
		// Medians of 3, as the other kernel benchmarks; partial syncs are
		// cheap enough for 5.
		Reps: 3, UpstreamReps: 3, Partials: 5,
		// kube-proxy's layout loads 10,000 Services in about a minute on
		// this kernel (docs/benchmarks.md); ten times that is a hang.
		UpstreamTimeout: 10 * time.Minute,
		// Two cores: more workers only queue in the API server.
		Workers: 8,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.APIServer, "apiserver", o.APIServer, "Path of e2e-apiserver (default: $E2E_APISERVER, or .bin/e2e-apiserver in a parent directory).")
	fs.StringVar(&o.KubeProxy, "kube-proxy", o.KubeProxy, "Path of upstream kube-proxy (default: kube-proxy next to e2e-apiserver).")
	fs.StringVar(&o.Dir, "dir", o.Dir, "Directory for the API server's state and kube-proxy's logs (default: a new temporary directory, kept).")
	fs.IntSliceVar(&o.Sizes, "sizes", o.Sizes, "Numbers of Services of 3 endpoints to measure (--sizes=0 for none).")
	fs.StringSliceVar(&o.Worlds, "worlds", o.Worlds, "Worlds of SERVICESxENDPOINTS to measure after --sizes (--worlds= for none).")
	fs.StringSliceVar(&o.Modes, "modes", o.Modes, "Proxy modes to compare: nftables, iptables.")
	fs.IntVar(&o.Reps, "reps", o.Reps, "proxyplane full syncs and nft -f loads per size (median reported).")
	fs.IntVar(&o.UpstreamReps, "upstream-reps", o.UpstreamReps, "kube-proxy processes per size, each timed on its first full sync (median reported).")
	fs.IntVar(&o.Partials, "partials", o.Partials, "One-Service updates per size and side (median reported).")
	fs.DurationVar(&o.UpstreamTimeout, "upstream-timeout", o.UpstreamTimeout, "Bound on kube-proxy's first full sync; past it the size is reported as exceeding the bound.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Parallel object creations in the API server.")
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	ws, err := o.worlds()
	if err != nil {
		errs = append(errs, err)
	}
	if len(ws) == 0 {
		errs = append(errs, errors.New("--sizes and --worlds: at least one world"))
	}
	for _, w := range ws {
		if w.Services < 2 || w.Services > 50000 {
			errs = append(errs, fmt.Errorf("world %s: Services not between 2 and 50000 (the service CIDR is a /16)", w))
		}
		if w.Endpoints < 1 || w.Endpoints > 1000 || w.Services*w.Endpoints > 1<<22 {
			errs = append(errs, fmt.Errorf("world %s: endpoints per Service not between 1 and 1000 (one EndpointSlice), or more than 4 million in all", w))
		}
	}
	if len(o.Modes) == 0 {
		errs = append(errs, errors.New("--modes: at least one"))
	}
	for _, m := range o.Modes {
		if m != "nftables" && m != "iptables" {
			errs = append(errs, fmt.Errorf("--modes: %q is not nftables or iptables", m))
		}
	}
	if o.Reps < 1 || o.UpstreamReps < 1 || o.Partials < 1 {
		errs = append(errs, errors.New("--reps, --upstream-reps and --partials must be at least 1"))
	}
	if o.UpstreamTimeout <= 0 {
		errs = append(errs, errors.New("--upstream-timeout must be positive"))
	}
	if o.Workers < 1 {
		errs = append(errs, errors.New("--workers must be at least 1"))
	}
	return errors.Join(errs...)
}

// worlds returns the worlds to measure: --sizes, sorted, of 3 endpoints
// (0 stands for none), then --worlds in their order.
func (o *Options) worlds() ([]world, error) {
	var out []world
	for _, n := range slices.Compact(slices.Sorted(slices.Values(o.Sizes))) {
		if n == 0 {
			continue // --sizes=0: none
		}
		out = append(out, world{Services: n, Endpoints: defaultEndpoints})
	}
	for _, s := range o.Worlds {
		w, err := parseWorld(s)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if os.Getenv(roleEnv) == "proxyplane" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := proxyplaneChild(ctx, os.Args[1:])
		stop()
		if err != nil {
			log.Fatalf("kpbench proxyplane: %v", err)
		}
		return
	}
	o := newOptions()
	fs := pflag.NewFlagSet("kpbench", pflag.ExitOnError)
	o.AddFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := o.Validate(); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Printf("kpbench: %v", err)
		stop()
		os.Exit(1)
	}
}

// nodeIP is nstest's node-0 address, which every namespace here uses; the
// Node object carries it as kube-proxy's primary IP.
var nodeIP = netip.MustParseAddr("192.168.100.1")

func run(ctx context.Context, o *Options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: network namespaces and nf_tables")
	}
	if err := resolveBinaries(o); err != nil {
		return err
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "kpbench-")
		if err != nil {
			return err
		}
		o.Dir = d
	}
	log.Printf("logs and state in %s", o.Dir)
	worlds, err := o.worlds()
	if err != nil {
		return err
	}
	maxServices := 0
	for _, w := range worlds {
		maxServices = max(maxServices, w.Services)
	}
	api := &apiWorld{opts: o, maxServices: maxServices}
	defer api.stop(ctx)

	var rows []row
	for _, w := range worlds {
		if err := api.ensure(ctx, w); err != nil {
			return err
		}
		for _, mode := range o.Modes {
			r := row{w: w, mode: mode}
			r.load[0] = loadAverage()
			for rep := range o.UpstreamReps {
				last := rep == o.UpstreamReps-1
				partials := 0
				if last {
					partials = o.Partials
				}
				res, err := api.up.run(ctx, mode, w, rep, partials, last)
				if err != nil {
					return err
				}
				if res.timedOut {
					r.upTimedOut = true
					r.up = append(r.up, res)
					break
				}
				r.up = append(r.up, res)
			}
			if r.pp, err = proxyplaneBench(ctx, o, mode, w); err != nil {
				return err
			}
			r.load[1] = loadAverage()
			rows = append(rows, r)
			printTable(os.Stderr, o, rows)
		}
	}
	printTable(os.Stdout, o, rows)
	printDetails(os.Stdout, rows)
	return nil
}

// apiWorld is the API server and the world it holds: Services [0, have)
// of per endpoints each.
type apiWorld struct {
	opts        *Options
	maxServices int
	starts      int
	c           *cluster.Cluster
	up          *upstream
	per, have   int
}

// ensure makes the API server hold world w: it adds the missing Services
// when w has as many endpoints per Service as those it holds and no
// fewer Services, and otherwise starts a new, empty API server (deleting
// a world costs as much as creating one).
func (a *apiWorld) ensure(ctx context.Context, w world) error {
	if a.c != nil && (a.per != w.Endpoints || a.have > w.Services) {
		a.stop(ctx)
	}
	if a.c == nil {
		if err := a.start(ctx); err != nil {
			return err
		}
		a.per, a.have = w.Endpoints, 0
	}
	if err := createServices(ctx, a.up.cs, a.have, w.Services, w.Endpoints, a.opts.Workers); err != nil {
		return err
	}
	a.have = w.Services
	return nil
}

// start starts an empty API server with the namespace and the Node.
func (a *apiWorld) start(ctx context.Context) error {
	a.starts++
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	c, err := cluster.New(startCtx, cluster.Config{
		Binary: a.opts.APIServer, Dir: filepath.Join(a.opts.Dir, fmt.Sprintf("cluster-%d", a.starts)),
		APIServerArgs: []string{"--service-node-port-range=" + nodePortRange(a.maxServices)},
	})
	cancel()
	if err != nil {
		return fmt.Errorf("starting e2e-apiserver: %w", err)
	}
	a.c = c
	cfg, err := c.AdminConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := setupCluster(ctx, cs, nodeIP); err != nil {
		return err
	}
	u, err := url.Parse(c.URL())
	if err != nil {
		return err
	}
	a.up = &upstream{opts: a.opts, cs: cs, kubeconfig: c.AdminKubeconfig(), apiAddr: u.Host}
	return nil
}

// stop stops the API server, if one runs.
func (a *apiWorld) stop(ctx context.Context) {
	if a.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cluster.DefaultStopTimeout)
	defer cancel()
	if err := a.c.Stop(ctx); err != nil {
		log.Printf("stopping e2e-apiserver: %v", err)
	}
	a.c = nil
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
	if o.KubeProxy == "" {
		o.KubeProxy = filepath.Join(filepath.Dir(o.APIServer), "kube-proxy")
	}
	for _, p := range []*string{&o.APIServer, &o.KubeProxy} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%w (make bench-upstream builds both)", err)
		}
		*p = abs
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("needs the nft binary: apt-get install -y nftables")
	}
	return nil
}
