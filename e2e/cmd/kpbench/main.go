// Command kpbench compares proxyplane's nftables dataplane with upstream
// kube-proxy's nftables mode on the same kernel, in one run, at several
// numbers of Services (1,000, 5,000 and 10,000 by default).
//
// For each size it creates that many NodePort Services with 3 ready
// endpoints each in a real API server (e2e-apiserver), then:
//
//   - runs upstream kube-proxy (v1.36.4, built from k8s.io/kubernetes by
//     `make bench-upstream`) with --proxy-mode=nftables in a fresh network
//     namespace, and reads its own sync durations from its metrics: the
//     first full sync, and partial syncs after one EndpointSlice changed;
//   - programs the same Services with proxyplane's nftables Dataplane
//     (nodeagent/dataplane/nftables) in another fresh namespace, timing a
//     full sync and one-Service partial syncs;
//   - times the floors: each ruleset loaded by nft -f into an empty
//     namespace, and one map element added with nft and over netlink.
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
	// Sizes are the numbers of Services, measured in increasing order
	// (each adds Services to the API server).
	Sizes []int
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
}

func newOptions() *Options {
	return &Options{
		Sizes: []int{1000, 5000, 10000},
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
	fs.IntSliceVar(&o.Sizes, "sizes", o.Sizes, "Numbers of Services to measure.")
	fs.IntVar(&o.Reps, "reps", o.Reps, "proxyplane full syncs and nft -f loads per size (median reported).")
	fs.IntVar(&o.UpstreamReps, "upstream-reps", o.UpstreamReps, "kube-proxy processes per size, each timed on its first full sync (median reported).")
	fs.IntVar(&o.Partials, "partials", o.Partials, "One-Service updates per size and side (median reported).")
	fs.DurationVar(&o.UpstreamTimeout, "upstream-timeout", o.UpstreamTimeout, "Bound on kube-proxy's first full sync; past it the size is reported as exceeding the bound.")
	fs.IntVar(&o.Workers, "workers", o.Workers, "Parallel object creations in the API server.")
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if len(o.Sizes) == 0 {
		errs = append(errs, errors.New("--sizes: at least one"))
	}
	for _, n := range o.Sizes {
		if n < 2 || n > 50000 {
			errs = append(errs, fmt.Errorf("--sizes: %d not between 2 and 50000 (the service CIDR is a /16)", n))
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

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
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
	sizes := slices.Sorted(slices.Values(o.Sizes))
	sizes = slices.Compact(sizes)

	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	c, err := cluster.New(startCtx, cluster.Config{
		Binary: o.APIServer, Dir: filepath.Join(o.Dir, "cluster"),
		APIServerArgs: []string{"--service-node-port-range=" + nodePortRange(sizes[len(sizes)-1])},
	})
	cancel()
	if err != nil {
		return fmt.Errorf("starting e2e-apiserver: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cluster.DefaultStopTimeout)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			log.Printf("stopping e2e-apiserver: %v", err)
		}
	}()
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
	up := &upstream{opts: o, cs: cs, kubeconfig: c.AdminKubeconfig(), apiAddr: u.Host}

	var rows []row
	have := 0
	for _, n := range sizes {
		if err := createServices(ctx, cs, have, n, o.Workers); err != nil {
			return err
		}
		have = n
		r := row{n: n}
		r.load[0] = loadAverage()
		for rep := range o.UpstreamReps {
			last := rep == o.UpstreamReps-1
			partials := 0
			if last {
				partials = o.Partials
			}
			res, err := up.run(ctx, n, rep, partials, last)
			if err != nil {
				return err
			}
			if res.timedOut {
				r.upTimedOut = true
				break
			}
			r.up = append(r.up, res)
		}
		if r.pp, err = proxyplaneBench(ctx, o, n); err != nil {
			return err
		}
		r.load[1] = loadAverage()
		rows = append(rows, r)
		printTable(os.Stderr, o, rows)
	}
	printTable(os.Stdout, o, rows)
	printDetails(os.Stdout, rows)
	return nil
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
