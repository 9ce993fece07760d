// Package app wires the control plane binary: flags, the API server
// client, the watcher, the gRPC server and the metrics endpoint.
package app

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/proxyplane/proxyplane/internal/capture"
	"github.com/proxyplane/proxyplane/internal/cli"

	"github.com/proxyplane/proxyplane/controlplane/auth"
	"github.com/proxyplane/proxyplane/controlplane/config"
	"github.com/proxyplane/proxyplane/controlplane/limit"
	"github.com/proxyplane/proxyplane/controlplane/server"
)

// Options configures the control plane. Defaults are set by NewOptions,
// each with its reason.
type Options struct {
	// ConfigFile is a ControlPlaneConfiguration; flags given on the
	// command line win over it.
	ConfigFile string
	// Kubeconfig is the path of a kubeconfig file; empty means in-cluster.
	Kubeconfig string
	// GRPCAddress is where agents connect.
	GRPCAddress string
	// MetricsAddress serves /metrics, /healthz, /livez and /readyz: over
	// HTTPS with /metrics authorized by the API server, except on a
	// loopback address (secureMetrics).
	MetricsAddress string
	// ResyncPeriod is the informers' resync period.
	ResyncPeriod time.Duration
	// MaxPendingChanges bounds how far an agent may fall behind, in changed
	// Services, before it is reset with a snapshot.
	MaxPendingChanges int
	// MaxSendMessageBytes bounds one table response.
	MaxSendMessageBytes int
	// MaxRecvMessageBytes bounds one agent message (a hello lists its
	// entries' hashes).
	MaxRecvMessageBytes int
	// MaxStreamsPerConnection bounds concurrent streams on one connection.
	MaxStreamsPerConnection uint32
	// KeepaliveInterval, KeepaliveTimeout, WriteTimeout and AckTimeout: see
	// server.Options.
	KeepaliveInterval, KeepaliveTimeout, WriteTimeout, AckTimeout time.Duration
	// Logging is the logging flags: --log-level, --v, --logging-format.
	Logging cli.Logging

	// Insecure serves plaintext without authentication: for tests only.
	Insecure bool
	// TLSCertFile and TLSKeyFile hold a serving certificate issued
	// elsewhere, reloaded when they change; empty to bootstrap one from
	// the CA kept in Namespace.
	TLSCertFile, TLSKeyFile string
	// TLSSANs are extra DNS names or IPs of bootstrapped certificates.
	TLSSANs []string
	// Namespace holds the CA Secret and the CA bundle ConfigMap.
	Namespace string
	// TokenAudience is the audience of agent tokens.
	TokenAudience string
	// AgentServiceAccount is the agents' ServiceAccount, namespace/name.
	AgentServiceAccount string
	// AgentDaemonSet is the agents' DaemonSet, in AgentServiceAccount's
	// namespace.
	AgentDaemonSet string
	// IdentityRecheckInterval bounds how long a stream goes on before its
	// identity is checked again.
	IdentityRecheckInterval time.Duration
	// MaxAgents caps Sync streams; MaxStreams Sync and WatchTable streams;
	// MaxConnections open connections.
	MaxAgents, MaxStreams, MaxConnections int
	// PeerRate and PeerBurst limit new connections and calls per peer
	// address; a PeerRate of 0 turns the limit off.
	PeerRate  float64
	PeerBurst int
	// AdmissionRate and AdmissionBurst pace the start of Sync streams; see
	// server.Options.
	AdmissionRate  float64
	AdmissionBurst int
	// ConvergenceTracking measures the convergence SLI; see
	// server.Options.DisableConvergence.
	ConvergenceTracking bool
	// Profiling serves /debug/pprof/ on --metrics-address, authorized as
	// /metrics is (for the non-resource URL /debug/pprof/); off by
	// default, as kube-proxy's enableProfiling.
	Profiling bool
	// AgentControlPlane is the agents' --control-plane (host:port each),
	// NodePortRange the API server's --service-node-port-range and
	// NodeAddressServicePorts the agents'
	// --allow-node-address-service-ports: with them the control plane
	// leaves out of every table the external and load balancer IPs that
	// every agent would refuse (compute.Guard), so that one Service
	// cannot freeze every node's table.
	AgentControlPlane       []string
	NodePortRange           string
	NodeAddressServicePorts bool
}

// serviceAccountNamespaceFile is where the kubelet mounts the Pod's
// namespace along with its ServiceAccount token.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// defaultNamespace is the Pod's own namespace: the downward API's
// POD_NAMESPACE, else the mounted ServiceAccount's, else deploy/'s.
func defaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "proxyplane-system"
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		GRPCAddress:    ":9640",
		MetricsAddress: ":9641",
		// As kube-proxy's configSyncPeriod: a periodic full re-list repairs
		// anything a missed event broke, and changes nothing otherwise.
		ResyncPeriod: 15 * time.Minute,
		// A delta of 5,000 Services is already about as large as a
		// snapshot of a big cluster; past that a snapshot is simpler.
		MaxPendingChanges: 5000,
		// A 100k-service table is about 30 MB; beyond that, fail loudly.
		MaxSendMessageBytes: 64 << 20,
		// The largest agent message is the hello, one hash per Service
		// held: ~50 bytes each, 141 at most, so 8 MiB fits the 100k
		// Services above (5 MB). Every other message is refused past 4 KiB
		// (server.MaxSmallMessageBytes), but grpc-go reads up to this much
		// of a call that nobody has authenticated yet: times
		// limit.DefaultMaxUnverified, 128 MiB at most. A NACK's detail is
		// bounded by the agent far below it.
		MaxRecvMessageBytes: 8 << 20,
		// An agent needs one Sync stream; a few more allow grpcurl and
		// overlapping reconnects.
		MaxStreamsPerConnection: 8,
		KeepaliveInterval:       server.DefaultKeepaliveInterval,
		KeepaliveTimeout:        server.DefaultKeepaliveTimeout,
		WriteTimeout:            server.DefaultWriteTimeout,
		AckTimeout:              server.DefaultAckTimeout,
		Logging:                 cli.DefaultLogging(),
		// The CA and its bundle live next to the control plane, where its
		// Role grants access to them.
		Namespace:           defaultNamespace(),
		TokenAudience:       auth.DefaultAudience,
		AgentServiceAccount: auth.DefaultAgentServiceAccount,
		AgentDaemonSet:      auth.DefaultAgentDaemonSet,
		MaxAgents:           limit.DefaultMaxAgents,
		MaxStreams:          limit.DefaultMaxStreams,
		MaxConnections:      limit.DefaultMaxConnections,
		PeerRate:            limit.DefaultPeerRate,
		PeerBurst:           limit.DefaultPeerBurst,
		AdmissionRate:       server.DefaultAdmissionRate,
		AdmissionBurst:      server.DefaultAdmissionBurst,
		// On: the SLI costs little (docs/benchmarks.md); off only to
		// measure that cost.
		ConvergenceTracking: true,
		NodePortRange:       capture.DefaultNodePortRange.String(),

		// See auth.DefaultRecheckInterval.
		IdentityRecheckInterval: auth.DefaultRecheckInterval,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "A ControlPlaneConfiguration file (controlplane.proxyplane.io/v1alpha1); flags given on the command line win over it.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; empty for in-cluster configuration.")
	fs.StringVar(&o.GRPCAddress, "grpc-address", o.GRPCAddress, "Address (host:port) on which agents connect.")
	fs.StringVar(&o.MetricsAddress, "metrics-address", o.MetricsAddress, "Address (host:port) serving /metrics, /healthz, /livez and /readyz. HTTPS with the serving certificate, /metrics only to callers whose token the API server accepts and who may get the non-resource URL /metrics; plaintext and open on a loopback address (or with --insecure).")
	fs.DurationVar(&o.ResyncPeriod, "resync-period", o.ResyncPeriod, "Informer resync period; 0 disables resyncs.")
	fs.IntVar(&o.MaxPendingChanges, "max-pending-changes", o.MaxPendingChanges, "Changed Services an agent may lag behind by before it is reset with a snapshot.")
	fs.IntVar(&o.MaxSendMessageBytes, "max-send-message-bytes", o.MaxSendMessageBytes, "Largest table response sent to an agent.")
	fs.IntVar(&o.MaxRecvMessageBytes, "max-recv-message-bytes", o.MaxRecvMessageBytes, "Largest message accepted from an agent.")
	fs.Uint32Var(&o.MaxStreamsPerConnection, "max-streams-per-connection", o.MaxStreamsPerConnection, "Concurrent streams allowed on one connection.")
	fs.DurationVar(&o.KeepaliveInterval, "keepalive-interval", o.KeepaliveInterval, "Interval between keepalives sent to each agent.")
	fs.DurationVar(&o.KeepaliveTimeout, "keepalive-timeout", o.KeepaliveTimeout, "Close a stream whose agent sent nothing for this long.")
	fs.DurationVar(&o.WriteTimeout, "write-timeout", o.WriteTimeout, "Close a stream whose agent does not take a message within this time.")
	fs.DurationVar(&o.AckTimeout, "ack-timeout", o.AckTimeout, "Close a stream whose agent neither ACKs nor NACKs a table within this time.")
	o.Logging.AddFlags(fs)
	fs.BoolVar(&o.Insecure, "insecure", o.Insecure, "Serve plaintext and let any client read any node's table: for tests only.")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "Serving certificate (PEM), reloaded when it changes; unset, one is issued from the CA in the Secret proxyplane-ca of --namespace.")
	fs.StringVar(&o.TLSKeyFile, "tls-private-key-file", o.TLSKeyFile, "Private key (PEM) of --tls-cert-file.")
	fs.StringSliceVar(&o.TLSSANs, "tls-san", o.TLSSANs, "Extra DNS names or IPs of the issued serving certificate, besides the proxyplane-controlplane Service's names.")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "Namespace of the CA Secret and the CA bundle ConfigMap proxyplane-ca (default: $POD_NAMESPACE, else the ServiceAccount's).")
	fs.StringVar(&o.TokenAudience, "token-audience", o.TokenAudience, "Audience of the agents' projected ServiceAccount tokens.")
	fs.StringVar(&o.AgentServiceAccount, "agent-service-account", o.AgentServiceAccount, "The agents' ServiceAccount (namespace/name): only its tokens may Sync.")
	fs.StringVar(&o.AgentDaemonSet, "agent-daemonset", o.AgentDaemonSet, "The agents' DaemonSet, in --agent-service-account's namespace: an agent token must be bound to a Pod it controls, on the node the agent asks for.")
	fs.DurationVar(&o.IdentityRecheckInterval, "identity-recheck-interval", o.IdentityRecheckInterval, "Re-check each stream's token and rights this often (and at the token's expiry, and when an agent's Pod changes), ending streams whose identity no longer holds.")
	fs.Float64Var(&o.AdmissionRate, "admission-rate", o.AdmissionRate, "Sync streams per second that start being served; more wait their turn (a reconnect storm is spread out, not refused).")
	fs.IntVar(&o.AdmissionBurst, "admission-burst", o.AdmissionBurst, "Sync streams that may start at once.")
	fs.BoolVar(&o.ConvergenceTracking, "convergence-tracking", o.ConvergenceTracking, "Measure how long each change takes to reach the agents (proxyplane_controlplane_convergence_seconds, the changes in ListNodes and controlplane status); false only to measure what that costs.")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "Serve Go's profiles (net/http/pprof) under /debug/pprof/ on --metrics-address, to callers allowed to get the non-resource URL /debug/pprof/ (open, like /metrics, on a loopback address or with --insecure).")
	fs.IntVar(&o.MaxAgents, "max-agents", o.MaxAgents, "Sync streams (agents) served at once; more are refused with ResourceExhausted.")
	fs.IntVar(&o.MaxStreams, "max-streams", o.MaxStreams, "Sync and WatchTable streams served at once; health, reflection and unary calls have a small budget of their own.")
	fs.IntVar(&o.MaxConnections, "max-connections", o.MaxConnections, "Connections open at once; more are closed as they are accepted.")
	fs.Float64Var(&o.PeerRate, "peer-rate", o.PeerRate, "New connections and calls per second allowed from one address after --peer-burst (an IPv6 /64 gets 64 times both); 0 for no limit.")
	fs.IntVar(&o.PeerBurst, "peer-burst", o.PeerBurst, "New connections and calls one peer address may open at once.")
	fs.StringSliceVar(&o.AgentControlPlane, "agent-control-plane", o.AgentControlPlane, "The agents' --control-plane (CONTROL_PLANE_ADDRESSES), host:port each, names resolved at start: an external or load balancer IP equal to one of these, or to a replica address learned from the proxyplane-controlplane Service, is left out of every table (an InvalidValue event), since every agent would refuse the table.")
	fs.StringVar(&o.NodePortRange, "service-node-port-range", o.NodePortRange, "The API server's --service-node-port-range, as the agents': an external or load balancer IP equal to a Node's address with a port outside it is left out of every table (an InvalidValue event), since that node's agent would refuse the table.")
	fs.BoolVar(&o.NodeAddressServicePorts, "allow-node-address-service-ports", o.NodeAddressServicePorts, "Set when the agents run with --allow-node-address-service-ports: external and load balancer IPs equal to a Node's address then keep any port.")
}

// Complete applies --config, if given, under the flags set on the command
// line: the file replaces the defaults, the command line replaces the
// file. fs is the parsed flag set AddFlags registered on.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	if o.ConfigFile == "" {
		return nil
	}
	c, err := config.Load(o.ConfigFile)
	if err != nil {
		return err
	}
	// Note the command line's values, apply the file, then set them again.
	type given struct {
		f     *pflag.Flag
		value string
		slice []string
	}
	var cmdline []given
	fs.Visit(func(f *pflag.Flag) {
		g := given{f: f, value: f.Value.String()}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			g.slice = sv.GetSlice()
		}
		cmdline = append(cmdline, g)
	})
	o.applyFile(c)
	for _, g := range cmdline {
		if sv, ok := g.f.Value.(pflag.SliceValue); ok {
			err = sv.Replace(g.slice)
		} else {
			err = g.f.Value.Set(g.value)
		}
		if err != nil {
			return fmt.Errorf("setting --%s again over %s: %w", g.f.Name, o.ConfigFile, err)
		}
	}
	return nil
}

// applyFile sets every option c sets.
func (o *Options) applyFile(c *config.ControlPlaneConfiguration) {
	set(&o.Kubeconfig, c.Kubeconfig)
	set(&o.GRPCAddress, c.GRPCAddress)
	set(&o.MetricsAddress, c.MetricsAddress)
	for _, d := range []struct {
		to   *time.Duration
		from *metav1.Duration
	}{
		{&o.ResyncPeriod, c.ResyncPeriod},
		{&o.KeepaliveInterval, c.KeepaliveInterval},
		{&o.KeepaliveTimeout, c.KeepaliveTimeout},
		{&o.WriteTimeout, c.WriteTimeout},
		{&o.AckTimeout, c.AckTimeout},
		{&o.IdentityRecheckInterval, c.IdentityRecheckInterval},
	} {
		if d.from != nil {
			*d.to = d.from.Duration
		}
	}
	for _, n := range []struct {
		to   *int
		from *int32
	}{
		{&o.MaxPendingChanges, c.MaxPendingChanges},
		{&o.MaxSendMessageBytes, c.MaxSendMessageBytes},
		{&o.MaxRecvMessageBytes, c.MaxRecvMessageBytes},
		{&o.MaxAgents, c.MaxAgents},
		{&o.MaxStreams, c.MaxStreams},
		{&o.MaxConnections, c.MaxConnections},
		{&o.PeerBurst, c.PeerBurst},
		{&o.AdmissionBurst, c.AdmissionBurst},
		{&o.Logging.V, c.Logging.Verbosity},
	} {
		if n.from != nil {
			*n.to = int(*n.from)
		}
	}
	if c.MaxStreamsPerConnection != nil {
		// A negative count wraps to a huge one, which Validate cannot
		// see; clamp it to 0, which Validate refuses.
		o.MaxStreamsPerConnection = uint32(max(*c.MaxStreamsPerConnection, 0))
	}
	set(&o.Logging.Level, c.Logging.Level)
	set(&o.Logging.Format, c.Logging.Format)
	set(&o.TLSCertFile, c.TLS.CertFile)
	set(&o.TLSKeyFile, c.TLS.PrivateKeyFile)
	if c.TLS.SANs != nil {
		o.TLSSANs = c.TLS.SANs
	}
	set(&o.Namespace, c.Namespace)
	set(&o.TokenAudience, c.TokenAudience)
	set(&o.AgentServiceAccount, c.AgentServiceAccount)
	set(&o.AgentDaemonSet, c.AgentDaemonSet)
	set(&o.PeerRate, c.PeerRate)
	set(&o.AdmissionRate, c.AdmissionRate)
	if c.AgentControlPlane != nil {
		o.AgentControlPlane = c.AgentControlPlane
	}
	set(&o.NodePortRange, c.ServiceNodePortRange)
	set(&o.NodeAddressServicePorts, c.AllowNodeAddressServicePorts)
	set(&o.ConvergenceTracking, c.ConvergenceTracking)
	set(&o.Profiling, c.Profiling)
}

func set[T any](to *T, from *T) {
	if from != nil {
		*to = *from
	}
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, addr string }{
		{"--grpc-address", o.GRPCAddress}, {"--metrics-address", o.MetricsAddress},
	} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", a.flag, a.addr, err))
		}
	}
	for _, d := range []struct {
		flag string
		d    time.Duration
	}{
		{"--keepalive-interval", o.KeepaliveInterval},
		{"--keepalive-timeout", o.KeepaliveTimeout},
		{"--write-timeout", o.WriteTimeout},
		{"--ack-timeout", o.AckTimeout},
	} {
		if d.d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", d.flag, d.d))
		}
	}
	if o.KeepaliveTimeout <= o.KeepaliveInterval {
		errs = append(errs, fmt.Errorf("--keepalive-timeout (%s) must exceed --keepalive-interval (%s)", o.KeepaliveTimeout, o.KeepaliveInterval))
	}
	if o.ResyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("--resync-period must not be negative, got %s", o.ResyncPeriod))
	}
	if o.MaxPendingChanges < 1 {
		errs = append(errs, fmt.Errorf("--max-pending-changes must be at least 1, got %d", o.MaxPendingChanges))
	}
	if o.MaxSendMessageBytes < 1<<20 || o.MaxRecvMessageBytes < 1<<20 {
		errs = append(errs, errors.New("--max-send-message-bytes and --max-recv-message-bytes must be at least 1 MiB"))
	}
	if o.MaxStreamsPerConnection < 1 {
		errs = append(errs, errors.New("--max-streams-per-connection must be at least 1"))
	}
	if err := o.Logging.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, o.validateSecurity()...)...)
}

func (o *Options) validateSecurity() []error {
	var errs []error
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-private-key-file go together"))
	}
	if o.Insecure && (o.TLSCertFile != "" || len(o.TLSSANs) > 0) {
		errs = append(errs, errors.New("--insecure serves no certificate: drop --tls-cert-file, --tls-private-key-file and --tls-san"))
	}
	if o.TLSCertFile != "" && len(o.TLSSANs) > 0 {
		errs = append(errs, errors.New("--tls-san names the issued certificate; --tls-cert-file's names are its issuer's business"))
	}
	for _, san := range o.TLSSANs {
		if net.ParseIP(san) != nil {
			continue
		}
		if e1, e2 := validation.IsDNS1123Subdomain(san), validation.IsWildcardDNS1123Subdomain(san); len(e1) > 0 && len(e2) > 0 {
			errs = append(errs, fmt.Errorf("--tls-san %q is neither an IP address nor a DNS name: %s", san, e1[0]))
		}
	}
	if e := validation.IsDNS1123Label(o.Namespace); len(e) > 0 {
		errs = append(errs, fmt.Errorf("--namespace %q: %s", o.Namespace, e[0]))
	}
	if o.TokenAudience == "" {
		errs = append(errs, errors.New("--token-audience must not be empty"))
	}
	if _, err := auth.ParseServiceAccount(o.AgentServiceAccount); err != nil {
		errs = append(errs, fmt.Errorf("--agent-service-account: %w", err))
	}
	if e := validation.IsDNS1123Subdomain(o.AgentDaemonSet); len(e) > 0 {
		errs = append(errs, fmt.Errorf("--agent-daemonset %q: %s", o.AgentDaemonSet, e[0]))
	}
	if o.IdentityRecheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("--identity-recheck-interval must be positive, got %s", o.IdentityRecheckInterval))
	}
	if o.MaxAgents < 1 || o.MaxConnections < 1 {
		errs = append(errs, errors.New("--max-agents and --max-connections must be at least 1"))
	}
	if o.MaxStreams < o.MaxAgents {
		errs = append(errs, fmt.Errorf("--max-streams (%d) must be at least --max-agents (%d): every agent holds a stream", o.MaxStreams, o.MaxAgents))
	}
	if o.AdmissionRate <= 0 || o.AdmissionBurst < 1 {
		errs = append(errs, errors.New("--admission-rate must be positive and --admission-burst at least 1"))
	}
	if o.PeerRate < 0 || o.PeerBurst < 1 {
		errs = append(errs, errors.New("--peer-rate must not be negative and --peer-burst must be at least 1"))
	}
	for _, cp := range o.AgentControlPlane {
		if _, _, err := net.SplitHostPort(cp); err != nil {
			errs = append(errs, fmt.Errorf("--agent-control-plane %q: %w", cp, err))
		}
	}
	if _, err := capture.ParsePortRange(o.NodePortRange); err != nil {
		errs = append(errs, fmt.Errorf("--service-node-port-range: %w", err))
	}
	return errs
}
