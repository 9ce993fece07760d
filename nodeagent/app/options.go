// Package app wires the node agent binary: flags, the cache, the
// dataplane, the agent, the control plane client and the operational
// endpoints.
package app

import (
	"errors"
	"fmt"
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
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
)

// Options configures the node agent. NewOptions sets the defaults, each
// with its reason.
type Options struct {
	// Cleanup removes every rule proxyplane programs, in every mode, and
	// exits (kube-proxy's --cleanup): for leaving proxyplane, or going
	// back to kube-proxy.
	Cleanup bool
	// ControlPlanes are the control plane addresses (host:port), tried in
	// turn. They must not be a Service ClusterIP: the agent must reach the
	// control plane without the rules it programs.
	ControlPlanes []string
	// NodeName is this node's name.
	NodeName string
	// StateDir holds the table cache.
	StateDir string
	// ProxyMode selects the dataplane: iptables, nftables or ipvs.
	ProxyMode string
	// IPVSScheduler is the IPVS scheduler in ipvs mode.
	IPVSScheduler string
	// HealthzBindAddress serves /healthz and /livez.
	HealthzBindAddress string
	// MetricsBindAddress serves /metrics.
	MetricsBindAddress string
	// ClusterCIDRs are the pod CIDRs, for local-traffic detection in
	// ClusterCIDR mode.
	ClusterCIDRs []string
	// DetectLocalMode is ClusterCIDR, NodeCIDR or None, as kube-proxy's.
	DetectLocalMode string
	// MasqueradeBit is the fwmark bit marking packets to masquerade.
	MasqueradeBit int
	// NodePortAddresses limits NodePorts to these CIDRs; empty means all
	// local addresses.
	NodePortAddresses []string
	// SyncPeriod is the interval between full syncs.
	SyncPeriod time.Duration
	// ControlPlaneTimeout is how long /healthz stays healthy while no
	// control plane answers; 0 forever.
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
		// kube-proxy's default mode, so replacing it changes nothing
		// unless asked; nftables is the faster choice (docs/benchmarks.md).
		ProxyMode: "iptables",
		// kube-proxy's default scheduler: round robin.
		IPVSScheduler: "rr",
		// kube-proxy's ports, so existing probes and scrapes keep working.
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		DetectLocalMode:    "ClusterCIDR",
		// kube-proxy's default masquerade bit.
		MasqueradeBit: 14,
		// kube-proxy's default iptables syncPeriod.
		SyncPeriod: 30 * time.Second,
		// Often enough that replicas are even again within a minute of a
		// rollout; each check is one health RPC on a new connection.
		FailbackInterval: 30 * time.Second,
		// Long enough to ride out a control plane rollout or an API
		// server upgrade many times over; short enough that a node cut
		// off from the cluster's changes leaves load balancers' rotation
		// within the hour. /livez never fails for it.
		ControlPlaneTimeout: 30 * time.Minute,
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
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Cleanup, "cleanup", o.Cleanup, "Remove every rule proxyplane programs, in every mode and family (iptables chains and jumps, the nftables tables, IPVS virtual servers, addresses and sets), and exit.")
	fs.StringSliceVar(&o.ControlPlanes, "control-plane", o.ControlPlanes, "Control plane address (host:port); repeat or comma-separate for failover. Not a Service ClusterIP.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "This node's name (default: $NODE_NAME, else the hostname).")
	fs.StringVar(&o.StateDir, "state-dir", o.StateDir, "Directory holding the table cache.")
	fs.StringVar(&o.ProxyMode, "proxy-mode", o.ProxyMode, "Dataplane: iptables, nftables or ipvs.")
	fs.StringVar(&o.IPVSScheduler, "ipvs-scheduler", o.IPVSScheduler, "IPVS scheduler in ipvs mode: "+strings.Join(ipvs.Schedulers, ", ")+".")
	fs.StringVar(&o.HealthzBindAddress, "healthz-bind-address", o.HealthzBindAddress, "Address serving /healthz and /livez.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "Address serving /metrics.")
	fs.StringSliceVar(&o.ClusterCIDRs, "cluster-cidr", o.ClusterCIDRs, "Pod CIDRs of the cluster, for --detect-local-mode=ClusterCIDR.")
	fs.StringVar(&o.DetectLocalMode, "detect-local-mode", o.DetectLocalMode, "How to tell pod traffic from other traffic: ClusterCIDR, NodeCIDR or None.")
	fs.IntVar(&o.MasqueradeBit, "masquerade-bit", o.MasqueradeBit, "fwmark bit (0-31) marking packets to masquerade.")
	fs.StringSliceVar(&o.NodePortAddresses, "nodeport-addresses", o.NodePortAddresses, "CIDRs whose local addresses accept NodePorts; empty for all.")
	fs.DurationVar(&o.SyncPeriod, "sync-period", o.SyncPeriod, "Interval between full syncs of the kernel rules.")
	fs.DurationVar(&o.ControlPlaneTimeout, "control-plane-timeout", o.ControlPlaneTimeout, "How long /healthz stays healthy while no control plane answers (the rules in force keep forwarding; /livez is unaffected); 0 forever, as kube-proxy never fails for the API server's absence.")
	fs.DurationVar(&o.FailbackInterval, "failback-interval", o.FailbackInterval, "How often an agent streaming from a replica other than its preferred one checks whether the preferred one serves again, and returns to it; 0 never.")
	fs.StringVar(&o.IPTablesBackend, "iptables-backend", o.IPTablesBackend, "iptables backend: auto, nft or legacy.")
	o.Logging.AddFlags(fs)
	fs.StringVar(&o.CAFile, "ca-file", o.CAFile, "PEM bundle the control plane's serving certificate must chain to; read on every connect.")
	fs.StringVar(&o.TLSServerName, "tls-server-name", o.TLSServerName, "Name the control plane's serving certificate must carry.")
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "Bearer token proving this node to the control plane (a projected ServiceAccount token); read on every connect.")
	fs.BoolVar(&o.Insecure, "insecure", o.Insecure, "TESTS ONLY: plaintext to the control plane and no token. Anyone on the path can then read this node's table, and anyone answering on a control plane address can program any rule on this node.")
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if len(o.ControlPlanes) == 0 && !o.Cleanup {
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
	if _, err := parseCIDRs(o.NodePortAddresses); err != nil {
		errs = append(errs, fmt.Errorf("--nodeport-addresses: %w", err))
	}
	switch o.DetectLocalMode {
	case "ClusterCIDR":
		// --cleanup removes rules whatever CIDR they were written for.
		if len(o.ClusterCIDRs) == 0 && !o.Cleanup {
			errs = append(errs, errors.New("--detect-local-mode=ClusterCIDR needs --cluster-cidr"))
		}
	case "NodeCIDR", "None":
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
	if o.SyncPeriod < time.Second {
		errs = append(errs, fmt.Errorf("--sync-period %s: want at least 1s", o.SyncPeriod))
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
