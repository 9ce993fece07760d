package sysctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Paths of the files Apply reads and writes.
const (
	netfilterDir = "/proc/sys/net/netfilter/"
	// ConntrackMax is the table size: the host's, read-only in other
	// network namespaces.
	ConntrackMax = netfilterDir + "nf_conntrack_max"
	// ConntrackTCPEstablished is the idle timeout of established TCP flows.
	ConntrackTCPEstablished = netfilterDir + "nf_conntrack_tcp_timeout_established"
	// ConntrackTCPCloseWait is the timeout of TCP flows in CLOSE_WAIT.
	ConntrackTCPCloseWait = netfilterDir + "nf_conntrack_tcp_timeout_close_wait"
	// ConntrackTCPBeLiberal, when 1, keeps out-of-window TCP packets from
	// being marked INVALID.
	ConntrackTCPBeLiberal = netfilterDir + "nf_conntrack_tcp_be_liberal"
	// ConntrackUDP is the timeout of UDP flows not yet answered.
	ConntrackUDP = netfilterDir + "nf_conntrack_udp_timeout"
	// ConntrackUDPStream is the timeout of answered (ASSURED) UDP flows.
	ConntrackUDPStream = netfilterDir + "nf_conntrack_udp_timeout_stream"
	// ConntrackHashsize is the hash table's bucket count: a module
	// parameter, global to the host.
	ConntrackHashsize = "/sys/module/nf_conntrack/parameters/hashsize"
)

// maxConntrackMax caps the scaled table size, as upstream does, so that a
// many-core machine does not spend gigabytes on it.
const maxConntrackMax = 1 << 20

// Conntrack is kube-proxy's conntrack configuration (the conntrack section
// of a KubeProxyConfiguration, the --conntrack-* flags). A zero field
// leaves the kernel's value.
type Conntrack struct {
	// MaxPerCore sizes nf_conntrack_max per CPU; 0 leaves it and Min.
	MaxPerCore int
	// Min is the least nf_conntrack_max set when MaxPerCore is set.
	Min int
	// TCPEstablishedTimeout and TCPCloseWaitTimeout are the TCP timeouts.
	TCPEstablishedTimeout, TCPCloseWaitTimeout time.Duration
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1; false leaves it.
	TCPBeLiberal bool
	// UDPTimeout and UDPStreamTimeout are the UDP timeouts.
	UDPTimeout, UDPStreamTimeout time.Duration
}

// DefaultConntrack returns upstream's defaults (kube-proxy's
// KubeProxyConntrackConfiguration defaulting), so that replacing
// kube-proxy keeps the node's conntrack as it was.
func DefaultConntrack() Conntrack {
	return Conntrack{
		MaxPerCore: 32 * 1024,
		Min:        128 * 1024,
		// A day, a fifth of the kernel's five days: idle flows of pods
		// that are long gone would otherwise fill the table.
		TCPEstablishedTimeout: 24 * time.Hour,
		// An hour, above the kernel's minute: a server that is slow to
		// close must not lose its flow's NAT mapping meanwhile.
		TCPCloseWaitTimeout: time.Hour,
	}
}

// Validate reports every negative field, named as in a
// KubeProxyConfiguration.
func (c Conntrack) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"conntrack.maxPerCore", c.MaxPerCore < 0},
		{"conntrack.min", c.Min < 0},
		{"conntrack.tcpEstablishedTimeout", c.TCPEstablishedTimeout < 0},
		{"conntrack.tcpCloseWaitTimeout", c.TCPCloseWaitTimeout < 0},
		{"conntrack.udpTimeout", c.UDPTimeout < 0},
		{"conntrack.udpStreamTimeout", c.UDPStreamTimeout < 0},
	} {
		if f.neg {
			errs = append(errs, fmt.Errorf("%s must not be negative", f.name))
		}
	}
	return errors.Join(errs...)
}

// Max returns the nf_conntrack_max c asks for on a machine of numCPU CPUs:
// MaxPerCore times the CPUs, at least Min, at most 1Mi; 0 to leave it.
func (c Conntrack) Max(numCPU int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	scaled := c.MaxPerCore * numCPU
	switch {
	case scaled > maxConntrackMax:
		return maxConntrackMax
	case scaled > c.Min:
		return scaled
	}
	return c.Min
}

// Setter applies a Conntrack to the kernel.
type Setter struct {
	k   Kernel
	log *slog.Logger
}

// New returns a Setter of this machine's sysctls, as seen from the calling
// thread's network namespace.
func New(log *slog.Logger) *Setter { return newSetter(procFS{}, log) }

func newSetter(k Kernel, log *slog.Logger) *Setter { return &Setter{k: k, log: log} }

// Apply sets what c asks for, as kube-proxy does at start: each sysctl
// only when it differs, so that a value already right needs no write. A
// failure to write a sysctl of this network namespace is returned, as
// upstream fails. nf_conntrack_max and the hashsize are the host's:
// where they are read-only (another network namespace, a read-only /sys)
// Apply logs a warning and goes on, since nothing here could change them.
func (s *Setter) Apply(ctx context.Context, c Conntrack) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if err := s.setMax(ctx, c.Max(s.k.NumCPU())); err != nil {
		return err
	}
	seconds := func(d time.Duration) int { return int(d / time.Second) }
	for _, w := range []struct {
		path string
		set  bool
		v    int
	}{
		{ConntrackTCPEstablished, c.TCPEstablishedTimeout > 0, seconds(c.TCPEstablishedTimeout)},
		{ConntrackTCPCloseWait, c.TCPCloseWaitTimeout > 0, seconds(c.TCPCloseWaitTimeout)},
		{ConntrackTCPBeLiberal, c.TCPBeLiberal, 1},
		{ConntrackUDP, c.UDPTimeout > 0, seconds(c.UDPTimeout)},
		{ConntrackUDPStream, c.UDPStreamTimeout > 0, seconds(c.UDPStreamTimeout)},
	} {
		if !w.set {
			continue
		}
		if err := s.ensure(ctx, w.path, w.v); err != nil {
			return fmt.Errorf("%s: %w", conntrackWhy, err)
		}
	}
	return nil
}

// conntrackWhy prefixes Apply's errors.
const conntrackWhy = "setting conntrack parameters from the kube-proxy configuration"

// setMax sets nf_conntrack_max to limit (0 leaves it), and grows the
// hashsize to a quarter of it, the kernel's own ratio, when smaller:
// also when nf_conntrack_max was right already, as upstream's SetMax.
func (s *Setter) setMax(ctx context.Context, limit int) error {
	if limit == 0 {
		return nil
	}
	err := s.ensure(ctx, ConntrackMax, limit)
	if IsReadOnly(err) {
		s.log.WarnContext(ctx, "cannot set nf_conntrack_max here: it belongs to the host's network namespace; set it there (nodeagent --init-only in the host's namespace, privileged)",
			"want", limit, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", conntrackWhy, err)
	}
	hashsize, err := s.k.ReadInt(ConntrackHashsize)
	if err != nil {
		return fmt.Errorf("checking the conntrack hashsize: %w", err)
	}
	if hashsize >= limit/4 {
		return nil
	}
	s.log.InfoContext(ctx, "setting the conntrack hashsize", "hashsize", limit/4)
	if err := s.k.WriteInt(ConntrackHashsize, limit/4); err != nil {
		if IsReadOnly(err) {
			s.log.WarnContext(ctx, "/sys is read-only: the conntrack hashsize stays smaller than a quarter of nf_conntrack_max, so lookups in a full table are slower",
				"hashsize", hashsize, "want", limit/4, "err", err)
			return nil
		}
		return fmt.Errorf("setting the conntrack hashsize: %w", err)
	}
	return nil
}

// ensure writes v to path unless it holds v already; its error is
// WriteInt's, for the caller to say why it wrote.
func (s *Setter) ensure(ctx context.Context, path string, v int) error {
	if cur, err := s.k.ReadInt(path); err == nil && cur == v {
		return nil
	}
	s.log.InfoContext(ctx, "setting sysctl", "path", path, "value", v)
	return s.k.WriteInt(path, v)
}

// Setting is a sysctl and the value a proxy mode needs it to hold.
type Setting struct {
	// Path is the file, absolute: /proc/sys/net/ipv4/vs/conntrack.
	Path string
	// Value is what it must hold.
	Value int
}

// Set writes each of settings whose file holds another value, in order,
// and stops at the first failure: the sysctls a proxy mode needs (IPVS's),
// which the privileged init container (--init-only) sets because the
// agent's /proc/sys is read-only.
func (s *Setter) Set(ctx context.Context, settings []Setting) error {
	for _, st := range settings {
		if err := s.ensure(ctx, st.Path, st.Value); err != nil {
			return fmt.Errorf("setting a sysctl the proxy mode needs: %w", err)
		}
	}
	return nil
}

// TCPBeLiberal reports whether nf_conntrack_tcp_be_liberal is set: then,
// as in kube-proxy's proxiers, out-of-window packets are not INVALID and
// the dataplanes need not drop INVALID packets. An unreadable sysctl
// counts as unset, as upstream.
func (s *Setter) TCPBeLiberal() bool {
	v, err := s.k.ReadInt(ConntrackTCPBeLiberal)
	return err == nil && v != 0
}
