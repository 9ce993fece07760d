package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxyplane/proxyplane/nodeagent/config"
)

// TestConfigz reads /configz from the metrics port as kube-proxy 1.36
// serves it: JSON under "kubeproxy.config.k8s.io", a v1alpha1
// KubeProxyConfiguration with apiVersion and kind, which kube-proxy's
// own decoding (config.Decode) takes back to the settings in force.
func TestConfigz(t *testing.T) {
	o := optionsFrom(t, "--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
		"--nodeport-addresses=10.0.0.0/8", "--sync-period=45s", "--masquerade-bit=13", "--masquerade-all",
		"--conntrack-udp-timeout=40s", "--node-name=node-7", "--bind-address=10.0.0.7")
	cz, err := newConfigz(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(metricsHandler(prometheus.NewRegistry(), o.ProxyMode, cz))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/configz")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/configz: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	if len(top) != 1 || top[configzName] == nil {
		t.Fatalf("/configz keys %v, want only %q as kube-proxy's", raw, configzName)
	}
	var meta struct{ APIVersion, Kind string }
	if err := json.Unmarshal(top[configzName], &meta); err != nil {
		t.Fatal(err)
	}
	if meta.APIVersion != "kubeproxy.config.k8s.io/v1alpha1" || meta.Kind != "KubeProxyConfiguration" {
		t.Errorf("/configz apiVersion %q kind %q, want kubeproxy.config.k8s.io/v1alpha1 KubeProxyConfiguration (kube-proxy 1.36)", meta.APIVersion, meta.Kind)
	}
	c, lenient, err := config.Decode(top[configzName])
	if err != nil || lenient != nil {
		t.Fatalf("kube-proxy's decoding of /configz: %v (strict: %v)\n%s", err, lenient, top[configzName])
	}
	f, err := config.FromKubeProxy(c)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(o.Proxy, f.Proxy); diff != "" {
		t.Errorf("/configz read back differs from the settings in force (-in force +served):\n%s", diff)
	}
	if f.HostnameOverride != "node-7" {
		t.Errorf("hostnameOverride %q, want the node name", f.HostnameOverride)
	}
	if len(f.Ignored) > 0 {
		t.Errorf("/configz sets fields the agent ignores: %v", f.Ignored)
	}
}

// TestConfigzNodePortAddressesPrimary: in nftables mode without
// nodePortAddresses, /configz shows "primary", as kube-proxy's defaulting
// does, which reads back as the same setting.
func TestConfigzNodePortAddressesPrimary(t *testing.T) {
	o := optionsFrom(t, "--proxy-mode=nftables")
	c := kubeProxyConfiguration(o)
	if len(c.NodePortAddresses) != 1 || c.NodePortAddresses[0] != "primary" {
		t.Fatalf("nodePortAddresses %q, want [primary]", c.NodePortAddresses)
	}
	f, err := config.FromKubeProxy(c)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Proxy.NodePortsPrimary() || !o.NodePortsPrimary() {
		t.Errorf("read back: primary %v, in force %v; want both", f.Proxy.NodePortsPrimary(), o.NodePortsPrimary())
	}
}
