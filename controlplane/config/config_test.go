package config

import (
	"os"
	"path/filepath"
	"reflect"
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

// fill sets every pointer and slice reachable in v (a struct) to a new,
// non-empty value.
func fill(v reflect.Value) {
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 1, 1))
		case reflect.Struct:
			fill(f)
		}
	}
}

// shared returns the path of a pointer or slice a and b share.
func shared(a, b reflect.Value, path string) string {
	for i := range a.NumField() {
		name := path + a.Type().Field(i).Name
		fa, fb := a.Field(i), b.Field(i)
		switch fa.Kind() {
		case reflect.Pointer, reflect.Slice:
			if fa.Pointer() == fb.Pointer() {
				return name
			}
		case reflect.Struct:
			if s := shared(fa, fb, name+"."); s != "" {
				return s
			}
		}
	}
	return ""
}

// TestDeepCopyObject fails when a field added to the type is copied
// shallowly.
func TestDeepCopyObject(t *testing.T) {
	c := &ControlPlaneConfiguration{}
	fill(reflect.ValueOf(c).Elem())
	cp := c.DeepCopyObject().(*ControlPlaneConfiguration)
	if s := shared(reflect.ValueOf(c).Elem(), reflect.ValueOf(cp).Elem(), ""); s != "" {
		t.Errorf("DeepCopyObject shares %s with the original", s)
	}
}
