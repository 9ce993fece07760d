package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
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

// Version is the agent's version as the build stamped it (-ldflags -X, as
// the image does); empty otherwise. BuildVersion is what it reports.
var Version string

// BuildVersion returns the agent's version: Version, or what the Go build
// recorded (cli.Version). The hello and --version report it.
func BuildVersion() string { return cli.Version(Version) }

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
	dp, err := newDataplane(o, families)
	if err != nil {
		return err
	}
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
	var a *agent.Agent
	nodePortAddresses, _ := parseCIDRs(o.NodePortAddresses) // Validate parsed them
	hc := healthcheck.New(healthcheck.Config{
		NodePortAddresses: nodePortAddresses,
		Healthy:           func() bool { return a.Health().Check(time.Now()).Live },
	}, log.With("component", "healthcheck"))
	defer func() { _ = hc.Close() }()
	var cleaners []*conntrack.Cleaner
	for _, f := range families {
		cleaners = append(cleaners, conntrack.New(f, log.With("component", "conntrack", "family", f)))
	}
	a = agent.New(agent.Config{
		SyncPeriod: o.SyncPeriod, RetryMin: time.Second, RetryMax: o.SyncPeriod,
		ControlPlaneTimeout: o.ControlPlaneTimeout,
		AfterSync:           afterSync(hc, families, cleaners, log),
		Families:            families,
	}, dp, c, cached, log.With("component", "agent"))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics.Register(reg, o.ProxyMode)
	servers := []*http.Server{
		{Addr: o.HealthzBindAddress, Handler: healthHandler(a.Health()), ReadHeaderTimeout: 10 * time.Second},
		{Addr: o.MetricsBindAddress, Handler: metricsHandler(reg, o.ProxyMode), ReadHeaderTimeout: 10 * time.Second},
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
			Addresses: o.ControlPlanes,
			NodeName:  o.NodeName,
			Capabilities: &pb.Capabilities{
				Deltas: true, Dataplane: o.ProxyMode, AgentVersion: BuildVersion(),
			},
			Credentials:         o.Credentials(),
			BackoffMin:          500 * time.Millisecond,
			BackoffMax:          30 * time.Second,
			SilenceTimeout:      time.Minute,
			FailbackInterval:    o.FailbackInterval,
			MaxRecvMessageBytes: 64 << 20,
			OnConnected: func(up bool) {
				metrics.Connected.Set(map[bool]float64{true: 1, false: 0}[up])
				a.Health().ControlPlane(up, time.Now())
			},
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
		return ipvs.New(cfg, observe)
	},
}

// Cleanup removes what every mode programs in every family of the node,
// whichever mode ran before. A mode that cannot run here (no IPVS in the
// kernel, no iptables tools) cannot have left anything and is skipped,
// saying why. It returns every failure, joined.
func Cleanup(ctx context.Context, o *Options, log *slog.Logger) error {
	var errs []error
	for _, mode := range slices.Sorted(maps.Keys(modes)) {
		for _, family := range nodeFamilies(log) {
			dp, err := modes[mode](o, settingsFor(o, family), nil)
			if err != nil {
				log.Info("nothing to clean up", "mode", mode, "family", family.String(), "why", err)
				continue
			}
			c, ok := dp.(dataplane.Cleaner) // the Driver of each mode is one
			if !ok {
				errs = append(errs, fmt.Errorf("%s %s dataplane cannot clean up", family, mode))
				continue
			}
			if err := c.Cleanup(ctx); err != nil {
				errs = append(errs, err)
				continue
			}
			log.Info("cleaned up", "mode", mode, "family", family.String())
		}
	}
	return errors.Join(errs...)
}

// newDataplane builds one dataplane of the selected mode per IP family.
func newDataplane(o *Options, families []dataplane.Family) (dataplane.Dataplane, error) {
	newMode, ok := modes[o.ProxyMode]
	if !ok {
		return nil, fmt.Errorf("--proxy-mode %q: not built in", o.ProxyMode)
	}
	dps := make([]dataplane.Dataplane, 0, len(families))
	for _, family := range families {
		dp, err := newMode(o, settingsFor(o, family), metrics.ObserveSync)
		if err != nil {
			return nil, fmt.Errorf("%s %s dataplane: %w", family, o.ProxyMode, err)
		}
		dps = append(dps, dp)
	}
	return dataplane.Join(dps...), nil
}

// InitOnly does what needs a writable /proc/sys, the conntrack sysctls,
// and returns: kube-proxy's --init-only, for a privileged init container.
func InitOnly(ctx context.Context, o *Options, log *slog.Logger) error {
	return sysctl.New(log.With("component", "sysctl")).Apply(ctx, o.Conntrack)
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
	s.NodePortAddresses = cidrsOf(family, o.NodePortAddresses)
	if s.LocalMode == dataplane.LocalClusterCIDR && len(s.ClusterCIDRs) == 0 {
		// No pod CIDR of this family: nothing to recognise.
		s.LocalMode = dataplane.LocalNone
	}
	return s
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
// /metrics, and /proxyMode, the dataplane in use as plain text (tools and
// e2e suites ask it which mode runs).
func metricsHandler(reg *prometheus.Registry, mode string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(mode))
	})
	return mux
}

// healthHandler serves /healthz and /livez with kube-proxy's meaning and
// body (see agent.Health): /livez while the rules are fresh, /healthz
// while they are, the node is not being deleted, and a control plane
// answers or has answered within --control-plane-timeout.
func healthHandler(h *agent.Health) http.Handler {
	serve := func(healthz bool) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			now := time.Now()
			st := h.Check(now)
			body := map[string]any{"lastUpdated": st.LastUpdated.Format(time.RFC3339Nano), "currentTime": now.Format(time.RFC3339Nano)}
			ok, counter := st.Live, metrics.ProxyLivezTotal
			if healthz {
				ok, counter = st.Healthy, metrics.ProxyHealthzTotal
				body["nodeEligible"] = st.NodeEligible
				if !st.ControlPlaneLost.IsZero() {
					body["controlPlaneLost"] = st.ControlPlaneLost.Format(time.RFC3339Nano)
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			code := http.StatusOK
			if !ok {
				code = http.StatusServiceUnavailable
			}
			counter.WithLabelValues(strconv.Itoa(code)).Inc()
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(body)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/healthz", serve(true))
	mux.Handle("/livez", serve(false))
	return mux
}
