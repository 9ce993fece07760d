package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(data string) string {
		p := filepath.Join(dir, "controlplane.yaml")
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := Load(write("apiVersion: controlplane.proxyplane.io/v1alpha1\nkind: ControlPlaneConfiguration\n" +
		"grpcAddress: :7000\nresyncPeriod: 0s\npeerRate: 0\nlogging: {level: debug}\ntls: {sans: [a.example]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if *c.GRPCAddress != ":7000" || c.ResyncPeriod.Duration != 0 || *c.PeerRate != 0 || *c.Logging.Level != "debug" ||
		c.TLS.SANs[0] != "a.example" || c.MetricsAddress != nil || c.MaxAgents != nil {
		t.Errorf("decoded %+v", c)
	}
	cp := c.DeepCopyObject().(*ControlPlaneConfiguration)
	*cp.GRPCAddress, cp.TLS.SANs[0] = ":1", "b"
	if *c.GRPCAddress != ":7000" || c.TLS.SANs[0] != "a.example" {
		t.Error("DeepCopyObject shares memory with the original")
	}
	for _, tc := range []struct{ name, data, want string }{
		{"unknown field", "apiVersion: controlplane.proxyplane.io/v1alpha1\nkind: ControlPlaneConfiguration\ngrpcAdress: :1\n", `unknown field "grpcAdress"`},
		{"duplicate field", "apiVersion: controlplane.proxyplane.io/v1alpha1\nkind: ControlPlaneConfiguration\nmaxAgents: 1\nmaxAgents: 2\n", "maxAgents"},
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n", "want apiVersion controlplane.proxyplane.io/v1alpha1 and kind ControlPlaneConfiguration"},
		{"wrong type", "apiVersion: controlplane.proxyplane.io/v1alpha1\nkind: ControlPlaneConfiguration\nackTimeout: soon\n", `invalid duration "soon"`},
	} {
		if _, err := Load(write(tc.data)); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "controlplane.yaml") {
			t.Errorf("%s: err = %v, want one naming the file and containing %q", tc.name, err, tc.want)
		}
	}
}
