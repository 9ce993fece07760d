package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/sysctl"
)

// Modes are the proxy modes the agent has, as KubeProxyConfiguration's
// mode and --proxy-mode name them.
var Modes = []string{"iptables", "ipvs", "nftables"}

// Proxy is the agent's settings that kube-proxy's configuration names:
// from the file when --config is given, else from the flags of the same
// meaning.
type Proxy struct {
	// ProxyMode selects the dataplane: iptables, nftables or ipvs.
	ProxyMode string
	// IPVSScheduler is the IPVS scheduler in ipvs mode.
	IPVSScheduler string
	// IPVSTCPTimeout, IPVSTCPFinTimeout and IPVSUDPTimeout are IPVS's
	// connection timeouts in ipvs mode; 0 leaves the kernel's.
	IPVSTCPTimeout, IPVSTCPFinTimeout, IPVSUDPTimeout time.Duration
	// HealthzBindAddress serves /healthz and /livez.
	HealthzBindAddress string
	// MetricsBindAddress serves /metrics.
	MetricsBindAddress string
	// BindAddress is the node's primary IP, as kube-proxy's bindAddress
	// (which binds nothing); unspecified (0.0.0.0 or ::) when unknown.
	BindAddress string
	// ClusterCIDRs are the pod CIDRs, for local-traffic detection in
	// ClusterCIDR mode.
	ClusterCIDRs []string
	// DetectLocalMode is ClusterCIDR, NodeCIDR or None.
	DetectLocalMode string
	// MasqueradeBit is the fwmark bit marking packets to masquerade.
	MasqueradeBit int
	// MasqueradeAll masquerades all traffic to Service ClusterIPs.
	MasqueradeAll bool
	// LocalhostNodePorts accepts NodePorts on 127.0.0.1 in iptables mode.
	LocalhostNodePorts bool
	// NodePortAddresses limits NodePorts to these CIDRs, or, as the
	// single value "primary" (NodePortAddressesPrimary), to the node's
	// primary IPs; empty means all local addresses, except in nftables
	// mode, where it means "primary" (see NodePortsPrimary).
	NodePortAddresses []string
	// SyncPeriod is the interval between full syncs.
	SyncPeriod time.Duration
	// Conntrack is the conntrack sysctls set at start.
	Conntrack sysctl.Conntrack
}

// DefaultProxy returns upstream kube-proxy's defaults, so that an agent
// replacing kube-proxy behaves as it did unless told otherwise.
func DefaultProxy() Proxy {
	return Proxy{
		// kube-proxy's default mode; nftables is the faster choice
		// (docs/benchmarks.md).
		ProxyMode: "iptables",
		// Round robin, kube-proxy's default scheduler.
		IPVSScheduler: "rr",
		// kube-proxy's ports, so existing probes and scrapes keep working.
		HealthzBindAddress: "0.0.0.0:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		BindAddress:        "0.0.0.0",
		DetectLocalMode:    "ClusterCIDR",
		MasqueradeBit:      14,
		// Off, where upstream defaults to on: route_localnet opens every
		// interface to martians (CVE-2020-8558), and upstream's own
		// nftables mode dropped the feature (docs/semantics.md).
		LocalhostNodePorts: false,
		SyncPeriod:         30 * time.Second,
		Conntrack:          sysctl.DefaultConntrack(),
	}
}

// NodePortAddressesPrimary is the nodePortAddresses value (alone) that
// limits NodePorts to the node's primary IPs, as kube-proxy's: those the
// control plane reads from the Node's status.addresses and sends in the
// table, or --bind-address for its family.
const NodePortAddressesPrimary = "primary"

// NodePortsPrimary reports whether NodePorts answer on the node's primary
// IPs only: nodePortAddresses is "primary", or it is empty in nftables
// mode, upstream's default for that mode (cmd/kube-proxy's
// platformApplyDefaults). The other modes' default, every local address,
// is upstream's too.
func (p *Proxy) NodePortsPrimary() bool {
	if len(p.NodePortAddresses) == 0 {
		return p.ProxyMode == "nftables"
	}
	return len(p.NodePortAddresses) == 1 && p.NodePortAddresses[0] == NodePortAddressesPrimary
}

// NodePortCIDRs returns the CIDRs of NodePortAddresses, trimmed and
// masked; none when NodePortsPrimary. ValidateNodePortAddresses must
// have accepted them.
func (p *Proxy) NodePortCIDRs() []netip.Prefix {
	if p.NodePortsPrimary() {
		return nil
	}
	out := make([]netip.Prefix, 0, len(p.NodePortAddresses))
	for _, s := range p.NodePortAddresses {
		if c, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			out = append(out, c.Masked())
		}
	}
	return out
}

// ValidateNodePortAddresses checks a nodePortAddresses value as upstream's
// validation does: CIDRs, or "primary" alone.
func ValidateNodePortAddresses(addrs []string) error {
	var errs []error
	for i, s := range addrs {
		if s == NodePortAddressesPrimary {
			if len(addrs) != 1 {
				errs = append(errs, fmt.Errorf("[%d] %q: can't use both %q and CIDRs", i, s, NodePortAddressesPrimary))
			}
			continue
		}
		if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
			errs = append(errs, fmt.Errorf("[%d]: %w", i, err))
		}
	}
	return errors.Join(errs...)
}
