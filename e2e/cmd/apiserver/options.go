package main

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"
)

// Options configures one e2e-apiserver process. Defaults live in
// newOptions, each with the reason for its value.
type Options struct {
	// Dir holds everything that must survive a restart: etcd's data, the
	// serving certificate, the service-account key, the token file and the
	// kubeconfig files. Required.
	Dir string
	// SecurePort is kube-apiserver's HTTPS port on 127.0.0.1; 0 picks a
	// free one.
	SecurePort int
	// EtcdClientPort and EtcdPeerPort are etcd's ports on 127.0.0.1; 0
	// picks free ones.
	EtcdClientPort int
	EtcdPeerPort   int
	// ServiceClusterIPRange is passed to kube-apiserver as
	// --service-cluster-ip-range.
	ServiceClusterIPRange string
	// ReadyTimeout bounds the wait for etcd and then /readyz.
	ReadyTimeout time.Duration
	// ShutdownTimeout bounds the graceful stop after SIGTERM or SIGINT.
	ShutdownTimeout time.Duration
	// APIServerArgs are extra kube-apiserver flags, given after "--" on the
	// command line; they are parsed after ours and so override them.
	APIServerArgs []string
}

func newOptions() *Options {
	return &Options{
		// kubeadm's default, far from loopback and from the documentation
		// ranges tests use for endpoint addresses.
		ServiceClusterIPRange: "10.96.0.0/16",
		// Start to /readyz takes about 3 s on an idle 2-core machine; a
		// loaded CI machine shared with builds can be several times slower.
		ReadyTimeout: 2 * time.Minute,
		// kube-apiserver stops in well under a second with no shutdown
		// delay; the bound only turns a hang into a clear error.
		ShutdownTimeout: 30 * time.Second,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Dir, "dir", o.Dir, "Directory for etcd data, certificates, keys, tokens and kubeconfig files (created if missing; reused on restart).")
	fs.IntVar(&o.SecurePort, "secure-port", o.SecurePort, "kube-apiserver HTTPS port on 127.0.0.1 (0 picks a free port).")
	fs.IntVar(&o.EtcdClientPort, "etcd-client-port", o.EtcdClientPort, "etcd client port on 127.0.0.1 (0 picks a free port).")
	fs.IntVar(&o.EtcdPeerPort, "etcd-peer-port", o.EtcdPeerPort, "etcd peer port on 127.0.0.1 (0 picks a free port).")
	fs.StringVar(&o.ServiceClusterIPRange, "service-cluster-ip-range", o.ServiceClusterIPRange, "CIDR from which Service cluster IPs are allocated.")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", o.ReadyTimeout, "How long to wait for etcd and kube-apiserver to become ready.")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "How long a graceful shutdown may take before the process gives up.")
}

// Validate reports every invalid option at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("--dir is required"))
	}
	for name, port := range map[string]int{
		"--secure-port":      o.SecurePort,
		"--etcd-client-port": o.EtcdClientPort,
		"--etcd-peer-port":   o.EtcdPeerPort,
	} {
		if port < 0 || port > 65535 {
			errs = append(errs, fmt.Errorf("%s=%d: must be 0 (pick a free port) or 1-65535", name, port))
		}
	}
	if _, _, err := net.ParseCIDR(o.ServiceClusterIPRange); err != nil {
		errs = append(errs, fmt.Errorf("--service-cluster-ip-range: %w", err))
	}
	if o.ReadyTimeout <= 0 {
		errs = append(errs, errors.New("--ready-timeout must be positive"))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout must be positive"))
	}
	return errors.Join(errs...)
}
