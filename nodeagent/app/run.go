package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/cli"
	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
	"github.com/proxyplane/proxyplane/nodeagent/client"
	"github.com/proxyplane/proxyplane/nodeagent/conntrack"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/nftables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/healthcheck"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
	"github.com/proxyplane/proxyplane/nodeagent/sysctl"
)

// BuildVersion returns the agent's version as the build stamped it (make
// build and the images: cli.Version). The hello and --version report it.
func BuildVersion() string { return cli.Version("") }

// Run runs the node agent until ctx ends. o must be valid.
func Run(ctx context.Context, o *Options, log *slog.Logger) error {
	// Before any rule, as kube-proxy's platformSetup: the dataplanes ask
	// the kernel whether TCP conntrack is liberal.
	ct := sysctl.New(log.With("component", "sysctl"))
	if err := ct.Apply(ctx, o.Conntrack); err != nil {
		return err
	}
	o.conntrackTCPBeLiberal = ct.TCPBeLiberal()
	families := nodeFamilies(log)
	for _, f := range families {
		if o.DetectLocalMode == string(dataplane.LocalClusterCIDR) && len(cidrsOf(f, o.ClusterCIDRs)) == 0 {
			log.Warn("detectLocalMode is ClusterCIDR but no cluster CIDR of the family is set: pod traffic is not told apart from other traffic, as with kube-proxy",
				"family", f)
		}
	}
	// The health tracker hears of each family's syncs from the
	// dataplane, as each of kube-proxy's proxiers reports its own.
	health := newHealth(o, families, time.Now())
	drift := agent.NewDriftLog()
	dps, err := newDataplanes(o, families, func(r dataplane.SyncResult) {
		metrics.ObserveSync(r)
		drift.Observe(r)
		if r.Err == nil {
			health.Synced(r.Family, time.Now())
		}
	})
	if err != nil {
		// Before anything is touched: a mode that cannot run here (IPVS
		// on a kernel without it) leaves the old mode's rules in force.
		return err
	}
	dp := dataplane.Join(dps...)
	// What other modes and backends left goes only after this mode's
	// first successful sync (switch.go).
	sweep := newSweeper(o, families, dps, log)
	// The cache is loaded, and programmed by the agent, before the control
	// plane is contacted: the node forwards even when none is reachable.
	c, cached, err := cache.Open(o.CachePath(), log.With("component", "cache"))
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if cached != nil {
		log.Info("loaded cached table", "version", cached.Version, "services", len(cached.Entries))
	}
	// The health check server and the conntrack cleaners follow the table
	// in force: the agent hands them each table after programming it.
	hc := healthcheck.New(healthcheck.Config{
		NodePortAddresses:    o.NodePortCIDRs(),
		NodePortAddressesFor: healthCheckAddresses(o, families),
		Healthy:              func() bool { return health.Check(time.Now()).Live },
	}, log.With("component", "healthcheck"))
	defer func() { _ = hc.Close() }()
	var cleaners []*conntrack.Cleaner
	for _, f := range families {
		cleaners = append(cleaners, conntrack.New(f, log.With("component", "conntrack", "family", f)))
	}
	a := agent.New(agent.Config{
		SyncPeriod: o.SyncPeriod, RetryMin: time.Second, RetryMax: o.SyncPeriod,
		Health:    health,
		AfterSync: append(afterSync(hc, families, cleaners, log), sweep.afterSync),
		Families:  families,
		Policy:    o.policy(ctx, log),
	}, dp, c, cached, log.With("component", "agent"))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics.Register(reg, o.ProxyMode)
	metrics.ObserveConnected(false, time.Now())
	configz, err := newConfigz(o)
	if err != nil {
		return err
	}
	servers := []*http.Server{
		boundedServer(o.HealthzBindAddress, healthHandler(health, time.Now)),
		boundedServer(o.MetricsBindAddress, metricsHandler(reg, o.ProxyMode, configz)),
	}

	// Listen before starting anything, so a wrong address fails cleanly;
	// a port in use (kube-proxy's, during a migration) is served once free.
	ports := portBinder{listen: net.Listen, interval: portRetryInterval, log: log}
	listeners := make([]net.Listener, len(servers))
	for i, s := range servers {
		if listeners[i], err = ports.bind(s.Addr); err != nil {
			for _, l := range listeners[:i] {
				if l != nil {
					_ = l.Close()
				}
			}
			return err
		}
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.Run(ctx) })
	g.Go(func() error {
		// The cached table is programmed (or tried) before any control
		// plane is contacted, as the design requires.
		select {
		case <-a.Started():
		case <-ctx.Done():
			return nil
		}
		return client.Run(ctx, client.Options{
			// The configured addresses are a seed: the client dials those
			// the control plane reports too, from the cached table until
			// one is in force.
			Addresses: o.ControlPlanes,
			Cached:    cached,
			NodeName:  o.NodeName,
			Capabilities: &pb.Capabilities{
				Deltas: true, Dataplane: o.ProxyMode, AgentVersion: BuildVersion(),
				// The client inflates compressed snapshot entries within
				// MaxRecvMessageBytes, and computes the hashes of those
				// sent without.
				ZstdEntries: true, ZstdEntriesUnhashed: true,
			},
			Credentials:         o.Credentials(),
			BackoffMin:          500 * time.Millisecond,
			BackoffMax:          30 * time.Second,
			SilenceTimeout:      time.Minute,
			FailbackInterval:    o.FailbackInterval,
			MaxRecvMessageBytes: 64 << 20,
			OnConnected: func(up bool) {
				now := time.Now()
				metrics.ObserveConnected(up, now)
				health.ControlPlane(up, now)
			},
			Drift:         drift.Report,
			NodeAddresses: reportedAddrs(log),
		}, a, log.With("component", "client"))
	})
	for i, s := range servers {
		g.Go(func() error {
			l := listeners[i]
			if l == nil {
				var err error
				if l, err = ports.wait(ctx, s.Addr); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
			// Serve after Shutdown closes l and returns ErrServerClosed.
			if err := s.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving %s: %w", s.Addr, err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(sctx)
		}
		return nil
	})
	if o.Insecure {
		log.Warn("INSECURE: --insecure dials the control plane in plaintext and sends no token. " +
			"Anyone on the path can read this node's table, and anyone answering on a control plane address " +
			"can program any rule on this node. For tests only.")
	} else {
		log.Info("control plane credentials", "caFile", o.CAFile, "tlsServerName", o.TLSServerName, "tokenFile", o.TokenFile)
	}
	log.Info("node agent started", "node", o.NodeName, "controlPlanes", o.ControlPlanes, "mode", o.ProxyMode)
	return g.Wait()
}

// afterSync is what follows each programmed table, as in kube-proxy's
// syncProxyRules after the restore: the healthCheckNodePort server takes
// the new local endpoint counts, and UDP flows to endpoints that are gone
// are deleted so their next datagram picks a live one (cleaners[i] is
// families[i]'s); the gauge of ports without local endpoints follows.
func afterSync(hc *healthcheck.Server, families []dataplane.Family, cleaners []*conntrack.Cleaner, log *slog.Logger) []func(context.Context, *proxytable.Table) {
	noLocal := metrics.NewNoLocalEndpoints(families)
	return []func(context.Context, *proxytable.Table){
		func(_ context.Context, t *proxytable.Table) { noLocal.Observe(t) },
		func(_ context.Context, t *proxytable.Table) {
			// Sync logs and keeps every port it could open; the next sync
			// retries the others.
			if err := hc.Sync(t); err != nil {
				metrics.HealthCheckErrorsTotal.Inc()
			}
		},
		func(ctx context.Context, t *proxytable.Table) {
			for i, c := range cleaners {
				start := time.Now()
				n, err := c.Clean(ctx, t)
				family := families[i].String()
				metrics.ConntrackReconcilerDeletedEntriesTotal.WithLabelValues(family).Add(float64(n))
				metrics.ConntrackReconcilerSyncDuration.WithLabelValues(family).Observe(time.Since(start).Seconds())
				// An interrupted dump was retried and is cleaned next sync.
				if err != nil && !conntrack.IsInterrupted(err) {
					log.Error("deleting stale conntrack entries", "err", err)
				}
			}
		},
	}
}

// nodeFamilies returns the IP families the node has. Like kube-proxy, the
// agent leaves out IPv6 on a node without it (a kernel booted with
// ipv6.disable=1 has no /proc/net/if_inet6): programming it there would
// fail every sync and reject every table.
func nodeFamilies(log *slog.Logger) []dataplane.Family {
	families := []dataplane.Family{dataplane.IPv4}
	if _, err := os.Stat("/proc/net/if_inet6"); err == nil {
		families = append(families, dataplane.IPv6)
	} else {
		log.Warn("IPv6 is not available on this node; programming IPv4 only", "err", err)
	}
	return families
}

// modes are the dataplanes this build offers, by --proxy-mode: each
// builds one IP family's dataplane from the settings every dataplane takes
// and the options that are its own. A new dataplane is one package and
// one line here.
var modes = map[string]func(o *Options, s dataplane.Settings, observe dataplane.Observer) (dataplane.Dataplane, error){
	"iptables": func(o *Options, s dataplane.Settings, observe dataplane.Observer) (dataplane.Dataplane, error) {
		return iptables.New(iptables.Config{Settings: s, Backend: xtables.Backend(o.IPTablesBackend)}, observe)
	},
	"nftables": func(_ *Options, s dataplane.Settings, observe dataplane.Observer) (dataplane.Dataplane, error) {
		return nftables.New(nftables.Config{Settings: s}, observe)
	},
	// IPVS fails at once on a kernel without IPVS, naming what is
	// missing, and the agent exits non-zero rather than run without a
	// dataplane.
	"ipvs": func(o *Options, s dataplane.Settings, observe dataplane.Observer) (dataplane.Dataplane, error) {
		cfg := ipvs.DefaultConfig(s.Family)
		cfg.Settings, cfg.Scheduler, cfg.Backend = s, o.IPVSScheduler, xtables.Backend(o.IPTablesBackend)
		cfg.TCPTimeout, cfg.TCPFinTimeout, cfg.UDPTimeout = o.IPVSTCPTimeout, o.IPVSTCPFinTimeout, o.IPVSUDPTimeout
		// The agent's logger, as main builds it: the dataplane warns of
		// sysctls the init container did not set.
		cfg.Log = o.Logging.Logger(os.Stderr).With("component", "dataplane", "mode", "ipvs", "family", s.Family.String())
		return ipvs.New(cfg, observe)
	},
}

// newHealth returns the health tracker of /healthz, /livez and /readyz
// for families, created at now: kube-proxy's timeout of twice the sync
// period, and the control plane timeout, off unless the operator opts in.
func newHealth(o *Options, families []dataplane.Family, now time.Time) *agent.Health {
	return agent.NewHealth(2*o.SyncPeriod, o.ControlPlaneTimeout, families, now)
}

// newDataplanes builds one dataplane of the selected mode per IP family,
// each reporting its syncs to observe.
func newDataplanes(o *Options, families []dataplane.Family, observe dataplane.Observer) ([]dataplane.Dataplane, error) {
	newMode, ok := modes[o.ProxyMode]
	if !ok {
		return nil, fmt.Errorf("--proxy-mode %q: not built in", o.ProxyMode)
	}
	dps := make([]dataplane.Dataplane, 0, len(families))
	for _, family := range families {
		dp, err := newMode(o, settingsFor(o, family), observe)
		if err != nil {
			return nil, fmt.Errorf("%s %s dataplane: %w", family, o.ProxyMode, err)
		}
		dps = append(dps, dp)
	}
	return dps, nil
}

// InitOnly does what needs a writable /proc/sys and returns: kube-proxy's
// --init-only, for a privileged init container. It sets the conntrack
// sysctls and, in IPVS mode, those IPVS needs (ipvs.Sysctls), which the
// agent, its /proc/sys read-only, only checks.
func InitOnly(ctx context.Context, o *Options, log *slog.Logger) error {
	return initOnly(ctx, o, sysctl.New(log.With("component", "sysctl")), ipvs.CheckKernel, nodeFamilies(log))
}

// initSetter is what initOnly needs of a *sysctl.Setter.
type initSetter interface {
	Apply(ctx context.Context, c sysctl.Conntrack) error
	Set(ctx context.Context, settings []sysctl.Setting) error
}

// initOnly is InitOnly over seams: the sysctls, the IPVS check and the
// node's families.
func initOnly(ctx context.Context, o *Options, s initSetter, checkIPVS func() error, families []dataplane.Family) error {
	if err := s.Apply(ctx, o.Conntrack); err != nil {
		return err
	}
	if o.ProxyMode != "ipvs" {
		return nil
	}
	// First: on a kernel without IPVS, say so, rather than that
	// /proc/sys/net/ipv4/vs is missing.
	if err := checkIPVS(); err != nil {
		return fmt.Errorf("setting the sysctls IPVS mode needs: %w", err)
	}
	var settings []sysctl.Setting
	seen := map[string]bool{} // the net/ipv4/vs ones serve both families
	for _, f := range families {
		for _, c := range ipvs.Sysctls(f) {
			if !seen[c.Name] {
				seen[c.Name] = true
				settings = append(settings, sysctl.Setting{Path: "/proc/sys/" + c.Name, Value: c.Value})
			}
		}
	}
	return s.Set(ctx, settings)
}

// settingsFor is what every dataplane takes from the options for family.
func settingsFor(o *Options, family dataplane.Family) dataplane.Settings {
	s := dataplane.DefaultSettings(family)
	s.MasqueradeBit = o.MasqueradeBit
	s.MasqueradeAll = o.MasqueradeAll
	s.NoRandomFully = !o.RandomFully
	s.ConntrackTCPBeLiberal = o.conntrackTCPBeLiberal
	// Upstream offers localhost NodePorts in iptables mode, IPv4 only.
	s.LocalhostNodePorts = o.LocalhostNodePorts && o.ProxyMode == "iptables" && family == dataplane.IPv4
	if a, err := netip.ParseAddr(o.BindAddress); err == nil && !a.IsUnspecified() {
		if family.Has(a.Unmap()) {
			s.NodeIPs = []string{a.Unmap().String()}
		}
	}
	s.LocalMode = dataplane.LocalMode(o.DetectLocalMode)
	s.ClusterCIDRs = cidrsOf(family, o.ClusterCIDRs)
	s.NodePortPrimary = o.NodePortsPrimary()
	for _, p := range o.NodePortCIDRs() {
		if family.Has(p.Addr()) {
			s.NodePortAddresses = append(s.NodePortAddresses, p.String())
		}
	}
	if s.LocalMode == dataplane.LocalClusterCIDR && len(s.ClusterCIDRs) == 0 {
		// No pod CIDR of this family: nothing to recognise.
		s.LocalMode = dataplane.LocalNone
	}
	return s
}

// healthCheckAddresses is where health check ports listen with
// nodePortAddresses "primary", as NodePorts do: the node's primary IP of
// each family, or every address of a family without one; nil without
// "primary", when the static CIDRs apply.
func healthCheckAddresses(o *Options, families []dataplane.Family) func(*pb.NodeInfo) []netip.Prefix {
	if !o.NodePortsPrimary() {
		return nil
	}
	return func(node *pb.NodeInfo) []netip.Prefix {
		var out []netip.Prefix
		for _, f := range families {
			// A family left out listens on all its addresses.
			s := settingsFor(o, f)
			if all, cidrs := s.NodePorts(s.PrimaryIPs(node)); !all {
				out = append(out, cidrs...)
			}
		}
		return out
	}
}

// cidrsOf keeps the CIDRs of family; Validate has parsed them all.
func cidrsOf(family dataplane.Family, cidrs []string) []string {
	var out []string
	for _, p := range family.Prefixes(cidrs) {
		out = append(out, p.String())
	}
	return out
}

// metricsHandler serves what kube-proxy serves on its metrics port:
// /metrics, /proxyMode, the dataplane in use as plain text (tools and
// e2e suites ask it which mode runs), and /configz (newConfigz).
func metricsHandler(reg *prometheus.Registry, mode string, configz http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/configz", configz)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(mode))
	})
	return mux
}
