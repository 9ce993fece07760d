// Package app wires the control plane binary: flags, the API server
// client, the watcher, the gRPC server and the metrics endpoint.
package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/controlplane/server"
)

// Options configures the control plane. Defaults are set by NewOptions,
// each with its reason.
type Options struct {
	// Kubeconfig is the path of a kubeconfig file; empty means in-cluster.
	Kubeconfig string
	// GRPCAddress is where agents connect.
	GRPCAddress string
	// MetricsAddress serves /metrics, /healthz and /readyz.
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
	// LogLevel is debug, info, warn or error.
	LogLevel string
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
		// A hello lists one hash per Service held: ~40 bytes each.
		MaxRecvMessageBytes: 16 << 20,
		// An agent needs one Sync stream; a few more allow grpcurl and
		// overlapping reconnects.
		MaxStreamsPerConnection: 8,
		KeepaliveInterval:       server.DefaultKeepaliveInterval,
		KeepaliveTimeout:        server.DefaultKeepaliveTimeout,
		WriteTimeout:            server.DefaultWriteTimeout,
		AckTimeout:              server.DefaultAckTimeout,
		LogLevel:                "info",
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Path to a kubeconfig file; empty for in-cluster configuration.")
	fs.StringVar(&o.GRPCAddress, "grpc-address", o.GRPCAddress, "Address (host:port) on which agents connect.")
	fs.StringVar(&o.MetricsAddress, "metrics-address", o.MetricsAddress, "Address (host:port) serving /metrics, /healthz and /readyz.")
	fs.DurationVar(&o.ResyncPeriod, "resync-period", o.ResyncPeriod, "Informer resync period; 0 disables resyncs.")
	fs.IntVar(&o.MaxPendingChanges, "max-pending-changes", o.MaxPendingChanges, "Changed Services an agent may lag behind by before it is reset with a snapshot.")
	fs.IntVar(&o.MaxSendMessageBytes, "max-send-message-bytes", o.MaxSendMessageBytes, "Largest table response sent to an agent.")
	fs.IntVar(&o.MaxRecvMessageBytes, "max-recv-message-bytes", o.MaxRecvMessageBytes, "Largest message accepted from an agent.")
	fs.Uint32Var(&o.MaxStreamsPerConnection, "max-streams-per-connection", o.MaxStreamsPerConnection, "Concurrent streams allowed on one connection.")
	fs.DurationVar(&o.KeepaliveInterval, "keepalive-interval", o.KeepaliveInterval, "Interval between keepalives sent to each agent.")
	fs.DurationVar(&o.KeepaliveTimeout, "keepalive-timeout", o.KeepaliveTimeout, "Close a stream whose agent sent nothing for this long.")
	fs.DurationVar(&o.WriteTimeout, "write-timeout", o.WriteTimeout, "Close a stream whose agent does not take a message within this time.")
	fs.DurationVar(&o.AckTimeout, "ack-timeout", o.AckTimeout, "Close a stream whose agent neither ACKs nor NACKs a table within this time.")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "Log level: debug, info, warn or error.")
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
		{"--keepalive-interval", o.KeepaliveInterval}, {"--keepalive-timeout", o.KeepaliveTimeout},
		{"--write-timeout", o.WriteTimeout}, {"--ack-timeout", o.AckTimeout},
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
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.LogLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level %q: %w", o.LogLevel, err))
	}
	return errors.Join(errs...)
}

// Level returns the parsed log level; call after Validate.
func (o *Options) Level() slog.Level {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(o.LogLevel))
	return lvl
}
