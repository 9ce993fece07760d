// Package kubeproxy is what the e2e programs share to run upstream
// kube-proxy (built by `make kube-proxy`) inside a network namespace: its
// command line, and a relay that lets it reach an API server listening on
// another namespace's loopback. kpbench measures it in a fresh namespace;
// the box runs it in a node, beside or instead of proxyplane's agent.
package kubeproxy

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// Config is one kube-proxy command line.
type Config struct {
	// Binary is the kube-proxy executable.
	Binary string
	// Mode is --proxy-mode: iptables, nftables or ipvs.
	Mode string
	// Kubeconfig is --kubeconfig.
	Kubeconfig string
	// NodeName is --hostname-override: the Node whose Services it
	// programs, as the kubelet named it.
	NodeName string
	// ClusterCIDR is --cluster-cidr, comma-separated; empty leaves it unset.
	ClusterCIDR string
	// DetectLocalMode is --detect-local-mode; empty is kube-proxy's default.
	DetectLocalMode string
	// MasqueradeBit is --iptables-masquerade-bit; 0 is kube-proxy's
	// default (14).
	MasqueradeBit int
	// MetricsBindAddress and HealthzBindAddress are kube-proxy's ports;
	// empty are its defaults (127.0.0.1:10249 and 0.0.0.0:10256).
	MetricsBindAddress, HealthzBindAddress string
	// Extra flags come last (pflag keeps a repeated flag's last value).
	Extra []string
}

// Args returns the command line, the binary first. The conntrack flags
// are zero so kube-proxy leaves every conntrack sysctl alone:
// nf_conntrack_max and the hash size are the machine's, not the
// namespace's, and the timeouts are not kube-proxy's to change on a test
// machine.
func (c Config) Args() []string {
	args := []string{
		c.Binary,
		"--proxy-mode=" + c.Mode,
		"--kubeconfig=" + c.Kubeconfig,
		"--hostname-override=" + c.NodeName,
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--conntrack-udp-timeout=0",
		"--conntrack-udp-timeout-stream=0",
	}
	for _, f := range []struct{ name, value string }{
		{"--cluster-cidr", c.ClusterCIDR},
		{"--detect-local-mode", c.DetectLocalMode},
		{"--metrics-bind-address", c.MetricsBindAddress},
		{"--healthz-bind-address", c.HealthzBindAddress},
	} {
		if f.value != "" {
			args = append(args, f.name+"="+f.value)
		}
	}
	if c.MasqueradeBit != 0 {
		args = append(args, "--iptables-masquerade-bit="+strconv.Itoa(c.MasqueradeBit))
	}
	return append(args, c.Extra...)
}

// Dialer opens a connection, possibly from another network namespace.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// Relay accepts connections on ln and copies each, both ways, to a new
// connection that dial opens to addr, until ctx ends; then it closes ln
// and every connection and returns once they are done. With ln listening
// on the API server's address inside a node's namespace and dial reaching
// that address where the API server listens, kube-proxy in the node uses
// the API server's kubeconfig unchanged (its serving certificate names
// 127.0.0.1).
func Relay(ctx context.Context, ln net.Listener, dial Dialer, addr string) {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	// Ends when ctx closes the listener.
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { pipe(ctx, in, dial, addr) })
	}
}

// dialTimeout bounds a relayed connection's dial.
const dialTimeout = 10 * time.Second

// pipe copies between in and a new connection to addr until either side
// closes or ctx ends.
func pipe(ctx context.Context, in net.Conn, dial Dialer, addr string) {
	defer func() { _ = in.Close() }()
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	out, err := dial(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return
	}
	defer func() { _ = out.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = in.Close(); _ = out.Close() })
	defer stop()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
	<-done
}
