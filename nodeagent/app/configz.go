package app

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/configz"
	logsapi "k8s.io/component-base/logs/api/v1"
	kubeproxy "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/nodeagent/config"
)

// configzName is the name kube-proxy registers its configuration under,
// the top-level key of /configz's JSON.
const configzName = "kubeproxy.config.k8s.io"

// newConfigz returns kube-proxy's /configz, served on the metrics port as
// kube-proxy serves it, with component-base's handler: the configuration
// in force as a kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration,
// apiVersion and kind included, under "kubeproxy.config.k8s.io" (what
// kube-proxy 1.36 serves; before 1.36 it served its internal type,
// without apiVersion and kind).
//
// configz keeps one process-wide registry: a second call replaces what
// the first registered.
func newConfigz(o *Options) (http.Handler, error) {
	configz.Delete(configzName)
	cz, err := configz.New(configzName)
	if err != nil {
		return nil, fmt.Errorf("registering /configz: %w", err)
	}
	if err := cz.Set(kubeProxyConfiguration(o)); err != nil {
		return nil, fmt.Errorf("setting /configz: %w", err)
	}
	mux := http.NewServeMux()
	configz.InstallHandler(mux)
	return mux, nil
}

// kubeProxyConfiguration is the configuration in force as kube-proxy
// would show it: what the agent does with each field it honours, whether
// it came from --config or from the flags. Fields the agent ignores
// (config.FromKubeProxy lists them) are left empty, so that /configz
// never claims a setting the agent does not apply. Every mode's section
// carries the sync period and masquerade settings in force, as only the
// selected mode's are read.
func kubeProxyConfiguration(o *Options) *kubeproxy.KubeProxyConfiguration {
	p, ct := &o.Proxy, &o.Conntrack
	sync := metav1.Duration{Duration: p.SyncPeriod}
	bit := ptr.To(int32(p.MasqueradeBit))
	c := &kubeproxy.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: kubeproxy.SchemeGroupVersion.String(), Kind: "KubeProxyConfiguration"},
		HostnameOverride:   o.NodeName,
		BindAddress:        p.BindAddress,
		HealthzBindAddress: p.HealthzBindAddress,
		MetricsBindAddress: p.MetricsBindAddress,
		Mode:               kubeproxy.ProxyMode(p.ProxyMode),
		IPTables: kubeproxy.KubeProxyIPTablesConfiguration{
			MasqueradeBit: bit, MasqueradeAll: p.MasqueradeAll,
			LocalhostNodePorts: ptr.To(p.LocalhostNodePorts), SyncPeriod: sync,
		},
		NFTables: kubeproxy.KubeProxyNFTablesConfiguration{MasqueradeBit: bit, MasqueradeAll: p.MasqueradeAll, SyncPeriod: sync},
		IPVS: kubeproxy.KubeProxyIPVSConfiguration{
			Scheduler: p.IPVSScheduler, SyncPeriod: sync,
			TCPTimeout:    metav1.Duration{Duration: p.IPVSTCPTimeout},
			TCPFinTimeout: metav1.Duration{Duration: p.IPVSTCPFinTimeout},
			UDPTimeout:    metav1.Duration{Duration: p.IPVSUDPTimeout},
		},
		DetectLocalMode:   kubeproxy.LocalMode(p.DetectLocalMode),
		ClusterCIDR:       strings.Join(p.ClusterCIDRs, ","),
		NodePortAddresses: p.NodePortAddresses,
		Conntrack: kubeproxy.KubeProxyConntrackConfiguration{
			MaxPerCore:            ptr.To(int32(ct.MaxPerCore)),
			Min:                   ptr.To(int32(ct.Min)),
			TCPEstablishedTimeout: durationPtr(ct.TCPEstablishedTimeout),
			TCPCloseWaitTimeout:   durationPtr(ct.TCPCloseWaitTimeout),
			TCPBeLiberal:          ct.TCPBeLiberal,
			UDPTimeout:            metav1.Duration{Duration: ct.UDPTimeout},
			UDPStreamTimeout:      metav1.Duration{Duration: ct.UDPStreamTimeout},
		},
	}
	if p.NodePortsPrimary() {
		// As kube-proxy's platformApplyDefaults: nftables mode without
		// nodePortAddresses shows "primary".
		c.NodePortAddresses = []string{config.NodePortAddressesPrimary}
	}
	c.Logging.Format = o.Logging.Format
	c.Logging.Verbosity = logVerbosity(o.Logging.V)
	return c
}

func durationPtr(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// logVerbosity is --v as klog's verbosity: unset (-1) is 0, klog's
// default.
func logVerbosity(v int) logsapi.VerbosityLevel { return logsapi.VerbosityLevel(max(v, 0)) }
