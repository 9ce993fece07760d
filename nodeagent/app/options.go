// Package app wires the node agent binary: flags, the cache, the
// dataplane, the agent, the control plane client and the operational
// endpoints.
package app

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/internal/cli"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyplane/proxyplane/nodeagent/client"
	"github.com/proxyplane/proxyplane/nodeagent/config"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Options configures the node agent. NewOptions sets the defaults, each
// with its reason.
type Options struct {
	// Cleanup removes every rule proxyplane programs, in every mode, and
	// exits (kube-proxy's --cleanup): for leaving proxyplane, or going
	// back to kube-proxy.
	Cleanup bool
	// ControlPlanes are the configured control plane addresses
	// (host:port), tried in turn with those the control plane reports in
	// each table: a seed. They must not be a Service ClusterIP: the agent
	// must reach the control plane without the rules it programs.
	ControlPlanes []string
	// NodeName is this node's name.
	NodeName string
	// StateDir holds the table cache.
	StateDir string
	// Proxy is what kube-proxy's configuration names: from the
	// KubeProxyConfiguration at ConfigFile when one is given (its flags
	// are then ignored, as kube-proxy ignores them), else from the flags.
	config.Proxy
	// ConfigFile is a KubeProxyConfiguration (kube-proxy's --config).
	ConfigFile string
	// InitOnly sets the conntrack sysctls and exits (kube-proxy's
	// --init-only): for a privileged init container, so that the agent
	// itself needs no writable /proc/sys.
	InitOnly bool
	// RandomFully masquerades with fully random source ports. kube-proxy
	// decides it from its iptables version; the agent's images all have
	// it, and this turns it off for kernels or tools without it.
	RandomFully bool
	// ControlPlaneTimeout is how long /healthz stays healthy while no
	// control plane answers; 0 (the default) forever.
	ControlPlaneTimeout time.Duration
	// FailbackInterval is how often an agent that failed over checks
	// whether its preferred control plane replica serves again; 0 never.
	FailbackInterval time.Duration
	// IPTablesBackend is auto, nft or legacy.
	IPTablesBackend string
	// Logging is the logging flags: --log-level, --v, --logging-format.
	Logging cli.Logging
	// Insecure dials the control plane in plaintext without a token: for
	// tests only.
	Insecure bool
	// CAFile is the PEM bundle the control plane's certificate must chain
	// to, read on every connect.
	CAFile string
	// TLSServerName is the name the control plane's certificate must
	// carry.
	TLSServerName string
	// TokenFile is the bearer token proving this node, read on every
	// connect.
	TokenFile string
	// NodePortRange is the API server's --service-node-port-range: tables
	// with a nodePort or healthCheckNodePort outside it are refused, so
	// that no table takes a host port such as 22 or 2379.
	NodePortRange string
	// NodeAddressServicePorts lets external and load balancer IPs that
	// are the node's own addresses take any port, as kube-proxy lets them
	// (k3s's ServiceLB, Services exposing port 80 on node addresses);
	// off, only node port range ports.
	NodeAddressServicePorts bool

	// proxyFlags are the names of the flags of Proxy, which --config
	// overrides.
	proxyFlags []string
	// conntrackTCPBeLiberal is the kernel's nf_conntrack_tcp_be_liberal,
	// which Run reads once it has set the sysctls.
	conntrackTCPBeLiberal bool
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	name := os.Getenv("NODE_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	return &Options{
		NodeName: strings.ToLower(name),
		StateDir: "/var/lib/proxyplane",
		// Upstream's defaults, each with its reason there.
		Proxy:       config.DefaultProxy(),
		RandomFully: true,
		// Often enough that replicas are even again within a minute of a
		// rollout; each check is one health RPC on a new connection.
		FailbackInterval: 30 * time.Second,
		// Off, as kube-proxy never fails /healthz for the API server's
		// absence: cloud load balancers probe /healthz on every node, so
		// any timeout would take every node out of every load balancer
		// at the same moment of one control plane outage, while the
		// rules in force keep forwarding. The staleness shows in
		// proxyplane_agent_control_plane_last_answered_timestamp_seconds
		// instead; operators may opt in.
		ControlPlaneTimeout: 0,
		IPTablesBackend:     "auto",
		Logging:             cli.DefaultLogging(),
		// Where deploy/nodeagent.yaml mounts the proxyplane-ca ConfigMap,
		// which the control plane publishes with the CA it bootstraps.
		CAFile: "/var/run/proxyplane/ca/ca.crt",
		// The control plane's Service name in deploy/'s namespace, which
		// its certificate carries. Agents dial node addresses, not the
		// Service, so the name to verify cannot come from the address.
		TLSServerName: "proxyplane-controlplane.proxyplane-system.svc",
		// Where deploy/nodeagent.yaml projects the agent's token (audience
		// proxyplane, bound to its pod and so to its node).
		TokenFile: "/var/run/secrets/proxyplane/token",
		// The API server's default.
		NodePortRange: proxytable.DefaultNodePortRange.String(),
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "A KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1, as kubeadm's kube-proxy ConfigMap holds). As kube-proxy, the flags it covers are then ignored, except the logging flags and --node-name/--hostname-override.")
	fs.BoolVar(&o.InitOnly, "init-only", o.InitOnly, "Set the conntrack sysctls (which needs a writable /proc/sys) and exit, as kube-proxy's --init-only; the agent then needs only NET_ADMIN and NET_RAW.")
	fs.BoolVar(&o.Cleanup, "cleanup", o.Cleanup, "Remove every rule proxyplane programs, in every mode and family (iptables chains and jumps, the nftables tables, IPVS virtual servers, addresses and sets), and exit.")
	fs.StringSliceVar(&o.ControlPlanes, "control-plane", o.ControlPlanes, "Control plane address (host:port); repeat or comma-separate for failover. Not a Service ClusterIP. A seed: the agent also dials the replica addresses the control plane reports in each table, kept in its cache.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "This node's name (default: $NODE_NAME, else the hostname).")
	fs.StringVar(&o.NodeName, "hostname-override", o.NodeName, "kube-proxy's name for --node-name.")
	fs.StringVar(&o.StateDir, "state-dir", o.StateDir, "Directory holding the table cache.")
	fs.BoolVar(&o.RandomFully, "random-fully", o.RandomFully, "Masquerade with fully random source ports (NF_NAT_RANGE_PROTO_RANDOM_FULLY); false for kernels or iptables older than 1.6.2 without it.")
	pfs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	o.addProxyFlags(pfs)
	pfs.VisitAll(func(f *pflag.Flag) { o.proxyFlags = append(o.proxyFlags, f.Name) })
	fs.AddFlagSet(pfs)
	fs.DurationVar(&o.ControlPlaneTimeout, "control-plane-timeout", o.ControlPlaneTimeout, "How long /healthz stays healthy while no control plane answers (the rules in force keep forwarding; /livez and /readyz are unaffected). 0 (the default): forever, as kube-proxy never fails for the API server's absence; a timeout fails every node's /healthz at once in a control plane outage, taking them all out of load balancers.")
	fs.DurationVar(&o.FailbackInterval, "failback-interval", o.FailbackInterval, "How often an agent streaming from a replica other than its preferred one checks whether the preferred one serves again, and returns to it; 0 never.")
	fs.StringVar(&o.IPTablesBackend, "iptables-backend", o.IPTablesBackend, "iptables backend: auto, nft or legacy.")
	o.Logging.AddFlags(fs)
	fs.StringVar(&o.CAFile, "ca-file", o.CAFile, "PEM bundle the control plane's serving certificate must chain to; read on every connect.")
	fs.StringVar(&o.TLSServerName, "tls-server-name", o.TLSServerName, "Name the control plane's serving certificate must carry.")
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "Bearer token proving this node to the control plane (a projected ServiceAccount token); read on every connect.")
	fs.StringVar(&o.NodePortRange, "service-node-port-range", o.NodePortRange, "The API server's --service-node-port-range: tables with a nodePort or healthCheckNodePort outside it are refused (NACKed), so that no table takes a host port.")
	fs.BoolVar(&o.NodeAddressServicePorts, "allow-node-address-service-ports", o.NodeAddressServicePorts, "Let external and load balancer IPs that are this node's own addresses take any port, as kube-proxy does (load balancers handing out node addresses, such as k3s's ServiceLB); by default they may take node port range ports only, so that no table takes a host port such as 22.")
	fs.BoolVar(&o.Insecure, "insecure", o.Insecure, "TESTS ONLY: plaintext to the control plane and no token. Anyone on the path can then read this node's table, and anyone answering on a control plane address can program any rule on this node.")
}

// addProxyFlags registers the flags of Proxy, under kube-proxy's names
// (and the agent's older ones beside some).
func (o *Options) addProxyFlags(fs *pflag.FlagSet) {
	p, ct := &o.Proxy, &o.Conntrack
	fs.StringVar(&p.ProxyMode, "proxy-mode", p.ProxyMode, "Dataplane: iptables, nftables or ipvs.")
	fs.StringVar(&p.IPVSScheduler, "ipvs-scheduler", p.IPVSScheduler, "IPVS scheduler in ipvs mode: "+strings.Join(ipvs.Schedulers, ", ")+".")
	fs.DurationVar(&p.IPVSTCPTimeout, "ipvs-tcp-timeout", p.IPVSTCPTimeout, "Timeout of idle IPVS TCP connections in ipvs mode; 0 leaves the kernel's.")
	fs.DurationVar(&p.IPVSTCPFinTimeout, "ipvs-tcpfin-timeout", p.IPVSTCPFinTimeout, "Timeout of IPVS TCP connections after a FIN in ipvs mode; 0 leaves the kernel's.")
	fs.DurationVar(&p.IPVSUDPTimeout, "ipvs-udp-timeout", p.IPVSUDPTimeout, "Timeout of IPVS UDP flows in ipvs mode; 0 leaves the kernel's.")
	fs.StringVar(&p.HealthzBindAddress, "healthz-bind-address", p.HealthzBindAddress, "Address serving /healthz and /livez.")
	fs.StringVar(&p.MetricsBindAddress, "metrics-bind-address", p.MetricsBindAddress, "Address serving /metrics.")
	fs.StringVar(&p.BindAddress, "bind-address", p.BindAddress, "This node's primary IP, as kube-proxy's (it binds nothing): lets the node reach its own load balancer IPs past loadBalancerSourceRanges.")
	fs.StringSliceVar(&p.ClusterCIDRs, "cluster-cidr", p.ClusterCIDRs, "Pod CIDRs of the cluster, for --detect-local-mode=ClusterCIDR.")
	fs.StringVar(&p.DetectLocalMode, "detect-local-mode", p.DetectLocalMode, "How to tell pod traffic from other traffic: ClusterCIDR, NodeCIDR or None.")
	fs.IntVar(&p.MasqueradeBit, "masquerade-bit", p.MasqueradeBit, "fwmark bit (0-31) marking packets to masquerade.")
	fs.IntVar(&p.MasqueradeBit, "iptables-masquerade-bit", p.MasqueradeBit, "kube-proxy's name for --masquerade-bit.")
	fs.BoolVar(&p.MasqueradeAll, "masquerade-all", p.MasqueradeAll, "Masquerade all traffic to Service ClusterIPs (some CNI plugins need it).")
	fs.BoolVar(&p.LocalhostNodePorts, "iptables-localhost-nodeports", p.LocalhostNodePorts, "Accept NodePorts on 127.0.0.1 in iptables mode (IPv4 only; sets route_localnet=1 and drops martians), kube-proxy's default; off by default here (docs/semantics.md).")
	fs.StringSliceVar(&p.NodePortAddresses, "nodeport-addresses", p.NodePortAddresses, "CIDRs whose local addresses accept NodePorts, or 'primary' alone for the node's primary IPs (from its Node object, as the control plane sends them, or --bind-address). Unset: every local address, except in nftables mode, where it means 'primary', as kube-proxy's defaults.")
	fs.DurationVar(&p.SyncPeriod, "sync-period", p.SyncPeriod, "Interval between full syncs of the kernel rules.")
	fs.IntVar(&ct.MaxPerCore, "conntrack-max-per-core", ct.MaxPerCore, "nf_conntrack_max per CPU (0 leaves it and ignores --conntrack-min).")
	fs.IntVar(&ct.Min, "conntrack-min", ct.Min, "Least nf_conntrack_max, whatever --conntrack-max-per-core gives.")
	fs.DurationVar(&ct.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", ct.TCPEstablishedTimeout, "Idle timeout of established TCP flows (0 leaves the kernel's).")
	fs.DurationVar(&ct.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", ct.TCPCloseWaitTimeout, "Timeout of TCP flows in CLOSE_WAIT (0 leaves the kernel's).")
	fs.BoolVar(&ct.TCPBeLiberal, "conntrack-tcp-be-liberal", ct.TCPBeLiberal, "Set nf_conntrack_tcp_be_liberal: out-of-window TCP packets are not INVALID (and INVALID packets are then not dropped).")
	fs.DurationVar(&ct.UDPTimeout, "conntrack-udp-timeout", ct.UDPTimeout, "Idle timeout of unanswered UDP flows (0 leaves the kernel's).")
	fs.DurationVar(&ct.UDPStreamTimeout, "conntrack-udp-timeout-stream", ct.UDPStreamTimeout, "Idle timeout of answered UDP flows (0 leaves the kernel's).")
}

// Loaded is what Complete read from --config, for Log once logging is set
// up.
type Loaded struct {
	// Path is the file.
	Path string
	// Ignored are the file's fields that do not apply to the agent.
	Ignored []string
	// IgnoredFlags are flags given beside --config that the file
	// overrides.
	IgnoredFlags []string
	// Lenient is the strict decoding error of a file decoded leniently.
	Lenient error
}

// Log writes one warning per kind of thing the file's reading left aside.
func (l *Loaded) Log(log *slog.Logger) {
	if l == nil {
		return
	}
	if l.Lenient != nil {
		log.Warn("using lenient decoding as strict decoding failed", "file", l.Path, "err", l.Lenient)
	}
	if len(l.Ignored) > 0 {
		log.Warn("the kube-proxy configuration sets fields that do not apply to the node agent; they are ignored", "file", l.Path, "fields", l.Ignored)
	}
	if len(l.IgnoredFlags) > 0 {
		log.Warn("flags ignored: --config overrides them, as it does kube-proxy's", "file", l.Path, "flags", l.IgnoredFlags)
	}
}

// Complete reads --config, if given, as kube-proxy does: the file's
// settings replace those of the flags (upstream's defaults standing for
// what it leaves unset), except that the logging flags and
// --node-name/--hostname-override given on the command line win. fs is
// the parsed flag set AddFlags registered on.
func (o *Options) Complete(fs *pflag.FlagSet) (*Loaded, error) {
	if o.ConfigFile == "" {
		return nil, nil
	}
	f, err := config.Load(o.ConfigFile)
	if err != nil {
		return nil, err
	}
	l := &Loaded{Path: o.ConfigFile, Ignored: f.Ignored, Lenient: f.Lenient}
	for _, name := range o.proxyFlags {
		if fs.Changed(name) {
			l.IgnoredFlags = append(l.IgnoredFlags, "--"+name)
		}
	}
	o.Proxy = f.Proxy
	if f.HostnameOverride != "" && !fs.Changed("node-name") && !fs.Changed("hostname-override") {
		o.NodeName = f.HostnameOverride
	}
	if f.LoggingFormat != "" && !fs.Changed("logging-format") {
		o.Logging.Format = f.LoggingFormat
	}
	if f.Verbosity > 0 && !fs.Changed("v") && !fs.Changed("log-level") {
		o.Logging.V = f.Verbosity
	}
	return l, nil
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if len(o.ControlPlanes) == 0 && !o.Cleanup && !o.InitOnly {
		errs = append(errs, errors.New("--control-plane is required"))
	}
	for _, cp := range o.ControlPlanes {
		if _, _, err := net.SplitHostPort(cp); err != nil {
			errs = append(errs, fmt.Errorf("--control-plane %q: %w", cp, err))
		}
	}
	if msgs := validation.IsDNS1123Subdomain(o.NodeName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--node-name %q: %s", o.NodeName, msgs[0]))
	}
	if !filepath.IsAbs(o.StateDir) {
		errs = append(errs, fmt.Errorf("--state-dir %q must be an absolute path", o.StateDir))
	}
	if _, ok := modes[o.ProxyMode]; !ok {
		errs = append(errs, fmt.Errorf("--proxy-mode %q: want one of %s", o.ProxyMode, strings.Join(slices.Sorted(maps.Keys(modes)), ", ")))
	}
	if !slices.Contains(ipvs.Schedulers, o.IPVSScheduler) {
		errs = append(errs, fmt.Errorf("--ipvs-scheduler %q: want one of %s", o.IPVSScheduler, strings.Join(ipvs.Schedulers, ", ")))
	}
	for _, a := range []struct{ flag, addr string }{
		{"--healthz-bind-address", o.HealthzBindAddress}, {"--metrics-bind-address", o.MetricsBindAddress},
	} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", a.flag, a.addr, err))
		}
	}
	if _, err := parseCIDRs(o.ClusterCIDRs); err != nil {
		errs = append(errs, fmt.Errorf("--cluster-cidr: %w", err))
	}
	if err := config.ValidateNodePortAddresses(o.NodePortAddresses); err != nil {
		errs = append(errs, fmt.Errorf("--nodeport-addresses: %w", err))
	} else if err := o.validateLoopbackNodePorts(o.NodePortCIDRs()); err != nil {
		errs = append(errs, err)
	}
	switch o.DetectLocalMode {
	case "ClusterCIDR", "NodeCIDR", "None":
		// ClusterCIDR without a CIDR is valid, as kube-proxy's: the
		// family is then not told apart (Run warns).
	default:
		errs = append(errs, fmt.Errorf("--detect-local-mode %q: want ClusterCIDR, NodeCIDR or None", o.DetectLocalMode))
	}
	if o.MasqueradeBit < 0 || o.MasqueradeBit > 31 {
		errs = append(errs, fmt.Errorf("--masquerade-bit %d: want 0 to 31", o.MasqueradeBit))
	}
	if o.ControlPlaneTimeout < 0 {
		errs = append(errs, fmt.Errorf("--control-plane-timeout %s: want 0 or more", o.ControlPlaneTimeout))
	}
	if o.FailbackInterval < 0 {
		errs = append(errs, fmt.Errorf("--failback-interval %s: want 0 or more", o.FailbackInterval))
	}
	if _, err := proxytable.ParsePortRange(o.NodePortRange); err != nil {
		errs = append(errs, fmt.Errorf("--service-node-port-range: %w", err))
	}
	if o.SyncPeriod < time.Second {
		errs = append(errs, fmt.Errorf("--sync-period %s: want at least 1s", o.SyncPeriod))
	}
	if a, err := netip.ParseAddr(o.BindAddress); err != nil {
		errs = append(errs, fmt.Errorf("--bind-address %q: %w", o.BindAddress, err))
	} else if a.Zone() != "" {
		errs = append(errs, fmt.Errorf("--bind-address %q: want an address without a zone", o.BindAddress))
	}
	for _, d := range []struct {
		flag string
		d    time.Duration
	}{{"--ipvs-tcp-timeout", o.IPVSTCPTimeout}, {"--ipvs-tcpfin-timeout", o.IPVSTCPFinTimeout}, {"--ipvs-udp-timeout", o.IPVSUDPTimeout}} {
		if d.d < 0 {
			errs = append(errs, fmt.Errorf("%s %s: want 0 or more", d.flag, d.d))
		}
	}
	if err := o.Conntrack.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch o.IPTablesBackend {
	case "auto", "nft", "legacy":
	default:
		errs = append(errs, fmt.Errorf("--iptables-backend %q: want auto, nft or legacy", o.IPTablesBackend))
	}
	if err := o.Logging.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !o.Insecure {
		// The files themselves may appear later (the agent retries); their
		// names cannot.
		for _, f := range []struct{ flag, path string }{{"--ca-file", o.CAFile}, {"--token-file", o.TokenFile}} {
			if !filepath.IsAbs(f.path) {
				errs = append(errs, fmt.Errorf("%s %q must be an absolute path (or --insecure, for tests)", f.flag, f.path))
			}
		}
		if msgs := validation.IsDNS1123Subdomain(o.TLSServerName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--tls-server-name %q: %s", o.TLSServerName, msgs[0]))
		}
	}
	return errors.Join(errs...)
}

// validateLoopbackNodePorts names the setting a loopback CIDR among the
// NodePort addresses needs: the dataplanes would only say their own
// settings are wrong.
func (o *Options) validateLoopbackNodePorts(cidrs []netip.Prefix) error {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	for _, p := range cidrs {
		if p.Bits() == 0 || !p.Overlaps(loopback) {
			continue
		}
		switch {
		case o.ProxyMode != "iptables":
			return fmt.Errorf("--nodeport-addresses %s: localhost NodePorts exist in iptables mode only, as kube-proxy's", p)
		case !o.LocalhostNodePorts:
			return fmt.Errorf("--nodeport-addresses %s: localhost NodePorts need --iptables-localhost-nodeports (iptables.localhostNodePorts)", p)
		}
	}
	return nil
}

// CachePath is where the table cache lives.
func (o *Options) CachePath() string { return filepath.Join(o.StateDir, "table.db") }

// Credentials returns how the client authenticates the control plane and
// itself.
func (o *Options) Credentials() client.Credentials {
	return client.Credentials{Insecure: o.Insecure, CAFile: o.CAFile, ServerName: o.TLSServerName, TokenFile: o.TokenFile}
}

func parseCIDRs(in []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(in))
	for _, s := range in {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
