package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxyplane/proxyplane/nodeagent/sysctl"
)

// kubeadmConfig returns config.conf of the kube-proxy ConfigMap kubeadm
// v1.36.4 writes (testdata names its origin).
func kubeadmConfig(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/kubeadm-v1.36.4-kube-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatal(err)
	}
	conf, ok := cm.Data["config.conf"]
	if !ok {
		t.Fatal("the kubeadm ConfigMap has no config.conf")
	}
	return []byte(conf)
}

func writeFile(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubeadmConfigMap loads kubeadm's file unchanged: strictly, with
// upstream's defaults for every field kubeadm leaves zero, and only the
// API client's kubeconfig ignored.
func TestKubeadmConfigMap(t *testing.T) {
	f, err := Load(writeFile(t, kubeadmConfig(t)))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if f.Lenient != nil {
		t.Errorf("kubeadm's file needed lenient decoding: %v", f.Lenient)
	}
	want := DefaultProxy()
	want.ClusterCIDRs = []string{"10.244.0.0/16"}
	if !reflect.DeepEqual(f.Proxy, want) {
		t.Errorf("settings\n%+v\nwant\n%+v", f.Proxy, want)
	}
	if !slices.Equal(f.Ignored, []string{"clientConnection.kubeconfig"}) {
		t.Errorf("ignored %q, want only clientConnection.kubeconfig", f.Ignored)
	}
	if f.HostnameOverride != "" || f.LoggingFormat != "" || f.Verbosity != 0 {
		t.Errorf("hostname %q, logging %q/%d: want none", f.HostnameOverride, f.LoggingFormat, f.Verbosity)
	}
}

func TestFromKubeProxy(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	cases := []struct {
		name    string
		yaml    string
		check   func(t *testing.T, f *File)
		wantErr string
	}{
		{
			name: "iptables section",
			yaml: "iptables: {masqueradeAll: true, masqueradeBit: 3, syncPeriod: 10s, localhostNodePorts: false}\nnftables: {masqueradeBit: 5, syncPeriod: 20s}",
			check: func(t *testing.T, f *File) {
				t.Helper()
				p := f.Proxy
				if p.ProxyMode != "iptables" || !p.MasqueradeAll || p.MasqueradeBit != 3 || p.SyncPeriod != 10*time.Second || p.LocalhostNodePorts {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			name: "nftables reads its own section",
			yaml: "mode: nftables\niptables: {masqueradeAll: true, masqueradeBit: 3, syncPeriod: 10s}\nnftables: {masqueradeBit: 5, syncPeriod: 20s}",
			check: func(t *testing.T, f *File) {
				t.Helper()
				p := f.Proxy
				if p.ProxyMode != "nftables" || p.MasqueradeAll || p.MasqueradeBit != 5 || p.SyncPeriod != 20*time.Second {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			name: "ipvs",
			yaml: "mode: ipvs\niptables: {masqueradeBit: 3}\nipvs: {scheduler: lc, syncPeriod: 5s, tcpTimeout: 900s, tcpFinTimeout: 30s, udpTimeout: 10s}",
			check: func(t *testing.T, f *File) {
				t.Helper()
				p := f.Proxy
				if p.IPVSScheduler != "lc" || p.SyncPeriod != 5*time.Second || p.MasqueradeBit != 3 ||
					p.IPVSTCPTimeout != 900*time.Second || p.IPVSTCPFinTimeout != 30*time.Second || p.IPVSUDPTimeout != 10*time.Second {
					t.Errorf("got %+v", p)
				}
			},
		},
		{
			name: "conntrack",
			yaml: "conntrack: {maxPerCore: 0, min: 5, tcpEstablishedTimeout: 2h, tcpCloseWaitTimeout: 0s, tcpBeLiberal: true, udpTimeout: 15s, udpStreamTimeout: 2m}",
			check: func(t *testing.T, f *File) {
				t.Helper()
				want := sysctl.Conntrack{Min: 5, TCPEstablishedTimeout: 2 * time.Hour, TCPBeLiberal: true, UDPTimeout: 15 * time.Second, UDPStreamTimeout: 2 * time.Minute}
				if f.Proxy.Conntrack != want {
					t.Errorf("got %+v, want %+v", f.Proxy.Conntrack, want)
				}
			},
		},
		{
			name: "addresses, cidrs, node and logging",
			yaml: "bindAddress: 10.0.0.7\nhealthzBindAddress: 10.0.0.7\nmetricsBindAddress: 0.0.0.0:9999\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\n" +
				"nodePortAddresses: [10.0.0.0/8]\ndetectLocalMode: NodeCIDR\nhostnameOverride: Node-7\nlogging: {format: json, verbosity: 4}",
			check: func(t *testing.T, f *File) {
				t.Helper()
				p := f.Proxy
				if p.BindAddress != "10.0.0.7" || p.HealthzBindAddress != "10.0.0.7:10256" || p.MetricsBindAddress != "0.0.0.0:9999" ||
					!slices.Equal(p.ClusterCIDRs, []string{"10.244.0.0/16", "fd00:10:244::/56"}) || !slices.Equal(p.NodePortAddresses, []string{"10.0.0.0/8"}) ||
					p.DetectLocalMode != "NodeCIDR" || f.HostnameOverride != "node-7" || f.LoggingFormat != "json" || f.Verbosity != 4 {
					t.Errorf("got %+v %+v", p, f)
				}
			},
		},
		{
			name: "IPv6 bind address moves the defaults",
			yaml: "bindAddress: fd00::7",
			check: func(t *testing.T, f *File) {
				t.Helper()
				if f.Proxy.HealthzBindAddress != "[::]:10256" || f.Proxy.MetricsBindAddress != "[::1]:10249" {
					t.Errorf("got %q %q", f.Proxy.HealthzBindAddress, f.Proxy.MetricsBindAddress)
				}
			},
		},
		{
			name: "fields that do not apply",
			yaml: "featureGates: {Foo: true}\nenableProfiling: true\noomScoreAdj: -999\nportRange: 30000-32767\nconfigSyncPeriod: 1m\n" +
				"winkernel: {networkName: l2}\niptables: {minSyncPeriod: 10s}\nlogging: {vmodule: [{filePattern: a, verbosity: 2}]}\nbindAddressHardFail: true",
			check: func(t *testing.T, f *File) {
				t.Helper()
				want := []string{
					"iptables.minSyncPeriod", "bindAddressHardFail", "logging.vmodule", "configSyncPeriod", "featureGates",
					"enableProfiling", "oomScoreAdj", "portRange", "winkernel",
				}
				if !slices.Equal(f.Ignored, want) {
					t.Errorf("ignored %q, want %q", f.Ignored, want)
				}
			},
		},
		{
			name: "upstream's defaults written out are not reported",
			yaml: "iptables: {minSyncPeriod: 1s}\nconfigSyncPeriod: 15m\nlogging: {flushFrequency: 5s}",
			check: func(t *testing.T, f *File) {
				t.Helper()
				if len(f.Ignored) > 0 {
					t.Errorf("ignored %q", f.Ignored)
				}
			},
		},
		{name: "windows mode", yaml: "mode: kernelspace", wantErr: `mode: "kernelspace"`},
		{name: "bridge detection", yaml: "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}", wantErr: "detectLocalMode"},
		{
			name: "primary node port addresses, any mode",
			yaml: "mode: iptables\nnodePortAddresses: [primary]",
			check: func(t *testing.T, f *File) {
				t.Helper()
				if !f.Proxy.NodePortsPrimary() || f.Proxy.NodePortCIDRs() != nil {
					t.Errorf("got %q: want primary, no CIDRs", f.Proxy.NodePortAddresses)
				}
			},
		},
		{
			name: "nftables mode defaults to primary, as upstream",
			yaml: "mode: nftables",
			check: func(t *testing.T, f *File) {
				t.Helper()
				if !f.Proxy.NodePortsPrimary() {
					t.Errorf("nftables without nodePortAddresses: not primary")
				}
			},
		},
		{
			name: "iptables and ipvs modes default to every address, as upstream",
			yaml: "mode: ipvs",
			check: func(t *testing.T, f *File) {
				t.Helper()
				if f.Proxy.NodePortsPrimary() || len(f.Proxy.NodePortCIDRs()) != 0 {
					t.Errorf("ipvs without nodePortAddresses: primary %v, CIDRs %v", f.Proxy.NodePortsPrimary(), f.Proxy.NodePortCIDRs())
				}
			},
		},
		{
			name: "nftables mode on every address by asking",
			yaml: "mode: nftables\nnodePortAddresses: [0.0.0.0/0, '::/0']",
			check: func(t *testing.T, f *File) {
				t.Helper()
				if f.Proxy.NodePortsPrimary() || len(f.Proxy.NodePortCIDRs()) != 2 {
					t.Errorf("got primary %v, CIDRs %v", f.Proxy.NodePortsPrimary(), f.Proxy.NodePortCIDRs())
				}
			},
		},
		{name: "primary beside CIDRs", yaml: "nodePortAddresses: [primary, 10.0.0.0/8]", wantErr: `can't use both "primary" and CIDRs`},
		{name: "bad node port address", yaml: "nodePortAddresses: [10.0.0.0/33]", wantErr: "nodePortAddresses: [0]"},
		{name: "strict ARP in ipvs mode", yaml: "mode: ipvs\nipvs: {strictARP: true}", wantErr: "ipvs.strictARP"},
		{name: "masquerade bit", yaml: "iptables: {masqueradeBit: 32}", wantErr: "iptables.masqueradeBit: 32"},
		{name: "bad cluster cidr", yaml: "clusterCIDR: 10.244.0.0/33", wantErr: "clusterCIDR"},
		{name: "bad scheduler", yaml: "ipvs: {scheduler: fastest}", wantErr: "ipvs.scheduler"},
		{name: "negative conntrack", yaml: "conntrack: {maxPerCore: -1}", wantErr: "conntrack.maxPerCore"},
		{name: "short sync period", yaml: "nftables: {syncPeriod: 10ms}\nmode: nftables", wantErr: "nftables.syncPeriod"},
		{name: "every error at once", yaml: "mode: userspace\ndetectLocalMode: InterfaceNamePrefix", wantErr: "mode: \"userspace\": proxyplane has iptables, ipvs, nftables\ndetectLocalMode"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Load(writeFile(t, []byte(head+tc.yaml)))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.Lenient != nil {
				t.Errorf("lenient: %v", f.Lenient)
			}
			tc.check(t, f)
		})
	}
}

func TestDecode(t *testing.T) {
	t.Run("unknown field: lenient, as upstream", func(t *testing.T) {
		f, err := Load(writeFile(t, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nmasqueradeEverything: true\n")))
		if err != nil {
			t.Fatal(err)
		}
		if f.Lenient == nil || !strings.Contains(f.Lenient.Error(), "masqueradeEverything") {
			t.Errorf("lenient = %v, want the strict error naming the field", f.Lenient)
		}
		if f.Proxy.ProxyMode != "nftables" {
			t.Errorf("mode %q, want nftables from the rest of the file", f.Proxy.ProxyMode)
		}
	})
	t.Run("JSON", func(t *testing.T) {
		f, err := Load(writeFile(t, []byte(`{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"ipvs"}`)))
		if err != nil || f.Proxy.ProxyMode != "ipvs" {
			t.Fatalf("got %+v, %v", f, err)
		}
	})
	for _, tc := range []struct{ name, data, want string }{
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", "want apiVersion kubeproxy.config.k8s.io/v1alpha1 and kind KubeProxyConfiguration"},
		{"wrong version", "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n", "want apiVersion kubeproxy.config.k8s.io/v1alpha1"},
		{"no kind", "mode: ipvs\n", "want apiVersion"},
		{"not yaml", "apiVersion: [\n", "config.conf"},
		{"wrong type", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: [1]\n", "config.conf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, []byte(tc.data)))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "config.conf") {
				t.Errorf("err = %v, want one naming the file and containing %q", err, tc.want)
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Error("no error for a missing file")
	}
}
