package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
)

// File is what the agent takes from a KubeProxyConfiguration.
type File struct {
	// Proxy is the file's settings over upstream's defaults.
	Proxy Proxy
	// HostnameOverride is the node name, if the file sets one; the
	// --node-name (--hostname-override) flag wins over it, as upstream.
	HostnameOverride string
	// LoggingFormat (text or json; "" unset) and Verbosity are the
	// file's logging; the logging flags win over them, as upstream.
	LoggingFormat string
	Verbosity     int
	// Ignored names the fields set to a non-default value that have no
	// meaning for the agent, for one warning.
	Ignored []string
	// Lenient is the strict decoding error when the file was decoded
	// leniently (unknown or duplicate fields dropped), for a warning.
	Lenient error
}

// Upstream's defaults for fields the agent ignores: a file holding them
// (as kube-proxy --write-config-to writes) asks for nothing.
const (
	upstreamMinSyncPeriod    = time.Second
	upstreamConfigSyncPeriod = 15 * time.Minute
	upstreamFlushFrequency   = 5 * time.Second
	healthzPort              = 10256
	metricsPort              = 10249
)

// FromKubeProxy maps c over DefaultProxy as kube-proxy's defaulting and
// conversion would: each mode reads its own section (syncPeriod,
// masqueradeBit, masqueradeAll), and a zero value takes upstream's
// default. It returns every field proxyplane cannot honour, joined.
func FromKubeProxy(c *kubeproxy.KubeProxyConfiguration) (*File, error) {
	f := &File{Proxy: DefaultProxy(), HostnameOverride: strings.ToLower(strings.TrimSpace(c.HostnameOverride))}
	p := &f.Proxy
	var errs []error
	bad := func(field string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	ignore := func(field string, set bool) {
		if set {
			f.Ignored = append(f.Ignored, field)
		}
	}

	switch m := string(c.Mode); {
	case m == "":
	case slices.Contains(Modes, m):
		p.ProxyMode = m
	default:
		bad("mode", "%q: proxyplane has %s", m, strings.Join(Modes, ", "))
	}
	section := struct {
		syncPeriod, minSyncPeriod metav1.Duration
		masqueradeBit             *int32
		masqueradeAll             bool
	}{c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod, c.IPTables.MasqueradeBit, c.IPTables.MasqueradeAll}
	prefix := "iptables"
	switch p.ProxyMode {
	case "nftables":
		section.syncPeriod, section.minSyncPeriod = c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod
		section.masqueradeBit, section.masqueradeAll = c.NFTables.MasqueradeBit, c.NFTables.MasqueradeAll
		prefix = "nftables"
	case "ipvs":
		section.syncPeriod, section.minSyncPeriod = c.IPVS.SyncPeriod, c.IPVS.MinSyncPeriod
		prefix = "ipvs"
	}
	if d := section.syncPeriod.Duration; d != 0 {
		if d < time.Second {
			bad(prefix+".syncPeriod", "%s: want at least 1s", d)
		}
		p.SyncPeriod = d
	}
	// The control plane coalesces changes; the agent applies each table
	// it is sent at once.
	ignore(prefix+".minSyncPeriod", section.minSyncPeriod.Duration != 0 && section.minSyncPeriod.Duration != upstreamMinSyncPeriod)
	if b := section.masqueradeBit; b != nil {
		if *b < 0 || *b > 31 {
			bad(prefix+".masqueradeBit", "%d: want 0 to 31", *b)
		}
		p.MasqueradeBit = int(*b)
	}
	p.MasqueradeAll = section.masqueradeAll
	if c.IPTables.LocalhostNodePorts != nil {
		p.LocalhostNodePorts = *c.IPTables.LocalhostNodePorts
	}

	if s := c.IPVS.Scheduler; s != "" {
		if !slices.Contains(ipvs.Schedulers, s) {
			bad("ipvs.scheduler", "%q: want one of %s", s, strings.Join(ipvs.Schedulers, ", "))
		}
		p.IPVSScheduler = s
	}
	p.IPVSTCPTimeout, p.IPVSTCPFinTimeout, p.IPVSUDPTimeout = c.IPVS.TCPTimeout.Duration, c.IPVS.TCPFinTimeout.Duration, c.IPVS.UDPTimeout.Duration
	if c.IPVS.StrictARP && p.ProxyMode == "ipvs" {
		bad("ipvs.strictARP", "proxyplane does not set arp_ignore and arp_announce; set them on the node")
	}
	// The agent only ever deletes the virtual servers it programmed.
	ignore("ipvs.excludeCIDRs", len(c.IPVS.ExcludeCIDRs) > 0)

	if a := c.BindAddress; a != "" {
		if _, err := netip.ParseAddr(a); err != nil {
			bad("bindAddress", "%q: not an IP address", a)
		} else {
			p.BindAddress = a
		}
	}
	healthzHost, metricsHost := "0.0.0.0", "127.0.0.1"
	if a, err := netip.ParseAddr(p.BindAddress); err == nil && a.Is6() && !a.Is4In6() {
		healthzHost, metricsHost = "::", "::1"
	}
	p.HealthzBindAddress = bindAddress(c.HealthzBindAddress, healthzHost, healthzPort)
	p.MetricsBindAddress = bindAddress(c.MetricsBindAddress, metricsHost, metricsPort)
	// The agent waits for a port in use, as upstream's default (false)
	// does: true would have it exit instead (docs/migration.md needs the
	// wait).
	ignore("bindAddressHardFail", c.BindAddressHardFail)

	switch m := string(c.DetectLocalMode); m {
	case "":
	case "ClusterCIDR", "NodeCIDR", "None":
		p.DetectLocalMode = m
	default:
		bad("detectLocalMode", "%q: proxyplane has ClusterCIDR, NodeCIDR and None", m)
	}
	ignore("detectLocal.bridgeInterface", c.DetectLocal.BridgeInterface != "")
	ignore("detectLocal.interfaceNamePrefix", c.DetectLocal.InterfaceNamePrefix != "")
	if c.ClusterCIDR != "" {
		for s := range strings.SplitSeq(c.ClusterCIDR, ",") {
			s = strings.TrimSpace(s)
			if _, err := netip.ParsePrefix(s); err != nil {
				bad("clusterCIDR", "%v", err)
			}
			p.ClusterCIDRs = append(p.ClusterCIDRs, s)
		}
	}
	if err := ValidateNodePortAddresses(c.NodePortAddresses); err != nil {
		bad("nodePortAddresses", "%v", err)
	}
	p.NodePortAddresses = slices.Clone(c.NodePortAddresses)

	ct := &p.Conntrack
	if c.Conntrack.MaxPerCore != nil {
		ct.MaxPerCore = int(*c.Conntrack.MaxPerCore)
	}
	if c.Conntrack.Min != nil {
		ct.Min = int(*c.Conntrack.Min)
	}
	if d := c.Conntrack.TCPEstablishedTimeout; d != nil {
		ct.TCPEstablishedTimeout = d.Duration
	}
	if d := c.Conntrack.TCPCloseWaitTimeout; d != nil {
		ct.TCPCloseWaitTimeout = d.Duration
	}
	ct.TCPBeLiberal = c.Conntrack.TCPBeLiberal
	ct.UDPTimeout, ct.UDPStreamTimeout = c.Conntrack.UDPTimeout.Duration, c.Conntrack.UDPStreamTimeout.Duration
	if err := ct.Validate(); err != nil {
		errs = append(errs, err)
	}

	switch c.Logging.Format {
	case "", "text", "json":
		f.LoggingFormat = c.Logging.Format
	default:
		bad("logging.format", "%q: want text or json", c.Logging.Format)
	}
	f.Verbosity = int(c.Logging.Verbosity)
	fq := c.Logging.FlushFrequency.Duration.Duration
	ignore("logging.flushFrequency", fq != 0 && fq != upstreamFlushFrequency) // slog writes unbuffered
	ignore("logging.vmodule", len(c.Logging.VModule) > 0)
	o := c.Logging.Options
	ignore("logging.options", o.Text.SplitStream || o.JSON.SplitStream || !o.Text.InfoBufferSize.IsZero() || !o.JSON.InfoBufferSize.IsZero())

	// The agent reaches no API server: the control plane watches it.
	cc := c.ClientConnection
	ignore("clientConnection.kubeconfig", cc.Kubeconfig != "")
	ignore("clientConnection.acceptContentTypes", cc.AcceptContentTypes != "")
	ignore("clientConnection.contentType", cc.ContentType != "")
	ignore("clientConnection.qps", cc.QPS != 0)
	ignore("clientConnection.burst", cc.Burst != 0)
	ignore("configSyncPeriod", c.ConfigSyncPeriod.Duration != 0 && c.ConfigSyncPeriod.Duration != upstreamConfigSyncPeriod)
	// proxyplane has no feature gates: what it does, it always does.
	ignore("featureGates", len(c.FeatureGates) > 0)
	ignore("enableProfiling", c.EnableProfiling)
	ignore("showHiddenMetricsForVersion", c.ShowHiddenMetricsForVersion != "")
	ignore("oomScoreAdj", c.OOMScoreAdj != nil)
	ignore("portRange", c.PortRange != "")
	w := c.Winkernel
	ignore("winkernel", w.NetworkName != "" || w.SourceVip != "" || w.EnableDSR || w.RootHnsEndpointName != "" || w.ForwardHealthCheckVip)
	ignore("windowsRunAsService", c.WindowsRunAsService)
	return f, errors.Join(errs...)
}

// bindAddress is upstream's defaulting of a bind address: empty means
// host:port, and an address without a port gets port.
func bindAddress(addr, host string, port int) string {
	if addr == "" {
		return net.JoinHostPort(host, strconv.Itoa(port))
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return net.JoinHostPort(strings.Trim(addr, "[]"), strconv.Itoa(port))
	}
	return addr
}
