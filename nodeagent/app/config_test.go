package app

import (
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/config"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
)

// TestModeListsAreBuilt keeps the modes a --config file may name, and
// those metrics.Register knows, equal to the dataplanes this build has.
func TestModeListsAreBuilt(t *testing.T) {
	want := slices.Sorted(maps.Keys(modes))
	for name, l := range map[string][]string{"config.Modes": config.Modes, "metrics.Modes": metrics.Modes} {
		if got := slices.Sorted(slices.Values(l)); !slices.Equal(got, want) {
			t.Errorf("%s %q, built modes %q", name, got, want)
		}
	}
}

func parse(t *testing.T, args ...string) (*Options, *pflag.FlagSet) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o, fs
}

// TestCompleteConfigOverridesFlags checks kube-proxy's precedence: with
// --config, the file (with upstream's defaults for what it leaves out)
// replaces every flag it covers, while the logging flags, the node name
// and the agent's own flags still apply.
func TestCompleteConfigOverridesFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 10.244.0.0/16
hostnameOverride: from-file
logging: {format: json, verbosity: 5}
nftables: {masqueradeAll: true}
clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, fs := parse(t, "--config="+path, "--proxy-mode=ipvs", "--sync-period=5s", "--masquerade-all=false", "--conntrack-min=7",
		"--node-name=from-flag", "--v=2", "--control-plane=10.0.0.5:9640", "--iptables-backend=legacy")
	l, err := o.Complete(fs)
	if err != nil {
		t.Fatal(err)
	}
	if o.ProxyMode != "nftables" || !o.MasqueradeAll || o.SyncPeriod != 30*time.Second || o.Conntrack.Min != 128*1024 {
		t.Errorf("file did not win: mode %s, masqueradeAll %v, sync period %s, conntrack min %d", o.ProxyMode, o.MasqueradeAll, o.SyncPeriod, o.Conntrack.Min)
	}
	if o.NodeName != "from-flag" || o.Logging.V != 2 || o.Logging.Format != "json" {
		t.Errorf("node %q, v %d, format %q: want the flags' node and verbosity, the file's format", o.NodeName, o.Logging.V, o.Logging.Format)
	}
	if o.IPTablesBackend != "legacy" || !slices.Equal(o.ControlPlanes, []string{"10.0.0.5:9640"}) {
		t.Errorf("the agent's own flags were lost: backend %q, control planes %q", o.IPTablesBackend, o.ControlPlanes)
	}
	want := []string{"--conntrack-min", "--masquerade-all", "--proxy-mode", "--sync-period"}
	if got := slices.Sorted(slices.Values(l.IgnoredFlags)); !slices.Equal(got, want) {
		t.Errorf("ignored flags %q, want %q", got, want)
	}
	if !slices.Equal(l.Ignored, []string{"clientConnection.kubeconfig"}) {
		t.Errorf("ignored fields %q", l.Ignored)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	o, fs = parse(t, "--config="+path)
	if _, err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	if o.NodeName != "from-file" || o.Logging.V != 5 {
		t.Errorf("node %q, v %d: want the file's without flags", o.NodeName, o.Logging.V)
	}

	o, fs = parse(t, "--config="+filepath.Join(t.TempDir(), "absent"))
	if _, err := o.Complete(fs); err == nil {
		t.Error("no error for a missing --config file")
	}
	o, fs = parse(t, "--proxy-mode=ipvs")
	if l, err := o.Complete(fs); err != nil || l != nil || o.ProxyMode != "ipvs" {
		t.Errorf("without --config: %v, %v, mode %s", l, err, o.ProxyMode)
	}
}

// TestSettingsFor checks that the options reach every dataplane's
// settings, and the IPVS timeouts the IPVS configuration.
func TestSettingsFor(t *testing.T) {
	o, _ := parse(t, "--masquerade-all", "--random-fully=false", "--iptables-localhost-nodeports", "--bind-address=192.168.1.7", "--iptables-masquerade-bit=9",
		"--cluster-cidr=10.244.0.0/16,fd00::/56", "--nodeport-addresses=10.0.0.0/8")
	o.conntrackTCPBeLiberal = true
	s := settingsFor(o, dataplane.IPv4)
	if !s.MasqueradeAll || !s.NoRandomFully || !s.ConntrackTCPBeLiberal || s.MasqueradeBit != 9 || !s.LocalhostNodePorts ||
		!slices.Equal(s.NodeIPs, []string{"192.168.1.7"}) || !slices.Equal(s.ClusterCIDRs, []string{"10.244.0.0/16"}) ||
		!slices.Equal(s.NodePortAddresses, []string{"10.0.0.0/8"}) {
		t.Errorf("IPv4 settings %+v", s)
	}
	if s6 := settingsFor(o, dataplane.IPv6); s6.LocalhostNodePorts || len(s6.NodeIPs) != 0 || !slices.Equal(s6.ClusterCIDRs, []string{"fd00::/56"}) {
		t.Errorf("IPv6 settings %+v: no localhost NodePorts, no IPv4 node IP", s6)
	}
	o, _ = parse(t, "--proxy-mode=nftables")
	if s := settingsFor(o, dataplane.IPv4); s.LocalhostNodePorts || s.NoRandomFully || len(s.NodeIPs) != 0 {
		t.Errorf("nftables settings %+v: upstream has no localhost NodePorts there; 0.0.0.0 names no node IP", s)
	}
	o, _ = parse(t)
	if settingsFor(o, dataplane.IPv4).LocalhostNodePorts {
		t.Error("localhost NodePorts on by default")
	}
}

// TestSettingsForNodePortAddresses checks kube-proxy's two forms of
// nodePortAddresses "primary", the flag and the file, and each mode's
// default: primary in nftables mode, every address in the others.
func TestSettingsForNodePortAddresses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nnodePortAddresses: [primary]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		args        []string
		wantPrimary bool
		wantCIDRs   []string // IPv4's
	}{
		{name: "flag", args: []string{"--nodeport-addresses=primary"}, wantPrimary: true},
		{name: "file", args: []string{"--config=" + path}, wantPrimary: true},
		{name: "nftables default", args: []string{"--proxy-mode=nftables"}, wantPrimary: true},
		{name: "iptables default", args: []string{"--proxy-mode=iptables"}},
		{name: "ipvs default", args: []string{"--proxy-mode=ipvs"}},
		{name: "nftables with CIDRs", args: []string{"--proxy-mode=nftables", "--nodeport-addresses=10.0.0.0/8,fd00::/64"}, wantCIDRs: []string{"10.0.0.0/8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, fs := parse(t, append(tt.args, "--control-plane=10.0.0.5:9640")...)
			if _, err := o.Complete(fs); err != nil {
				t.Fatal(err)
			}
			if err := o.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			s := settingsFor(o, dataplane.IPv4)
			if s.NodePortPrimary != tt.wantPrimary || !slices.Equal(s.NodePortAddresses, tt.wantCIDRs) {
				t.Errorf("settings: primary %v, addresses %q; want %v, %q", s.NodePortPrimary, s.NodePortAddresses, tt.wantPrimary, tt.wantCIDRs)
			}
			if err := s.Validate(); err != nil {
				t.Errorf("settings Validate: %v", err)
			}
			// Health check ports follow the NodePorts.
			hc := healthCheckAddresses(o, []dataplane.Family{dataplane.IPv4, dataplane.IPv6})
			if (hc != nil) != tt.wantPrimary {
				t.Fatalf("health check addresses per table: %v, want %v", hc != nil, tt.wantPrimary)
			}
			if hc != nil {
				got := hc(&pb.NodeInfo{NodeIps: []string{"192.168.0.2"}})
				if len(got) != 1 || got[0] != netip.MustParsePrefix("192.168.0.2/32") {
					t.Errorf("health check addresses %v, want the IPv4 primary IP's /32 and every IPv6 address", got)
				}
			}
		})
	}
	o, fs := parse(t, "--nodeport-addresses=primary,10.0.0.0/8", "--control-plane=10.0.0.5:9640")
	if _, err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "can't use both") {
		t.Errorf("Validate with primary and a CIDR = %v, want upstream's error", err)
	}
}
