package box

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRenderDeploy renders deploy/ through the box's overlay and checks
// the command lines the box will run: the DaemonSet's and Deployment's
// arguments with every $(VAR) expanded from the generated ConfigMap, the
// overlay's values merged in. It needs no root and no API server.
func TestRenderDeploy(t *testing.T) {
	deployDir, err := FindDeployDir()
	if err != nil {
		t.Skipf("no deploy/ above the working directory: %v", err)
	}
	d, err := renderDeploy(deployDir, t.TempDir(), map[string]string{
		"CONTROL_PLANE_ADDRESSES": "192.168.100.200:9640,192.168.100.200:9650",
		"IPTABLES_BACKEND":        "nft",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Objects[0].GetKind(); got != "Namespace" {
		t.Errorf("first object is a %s, want the Namespace", got)
	}
	for _, want := range []string{
		"--control-plane=192.168.100.200:9640,192.168.100.200:9650",
		"--node-name=$(NODE_NAME)",
		"--iptables-backend=nft",
		"--proxy-mode=iptables",
		"--metrics-bind-address=127.0.0.1:10249",
		"--tls-server-name=proxyplane-controlplane.proxyplane-system.svc",
		"--ca-file=/var/run/proxyplane/ca/ca.crt",
		"--token-file=/var/run/secrets/proxyplane/token",
	} {
		if !slices.Contains(d.NodeagentArgs, want) {
			t.Errorf("agent args lack %q: %q", want, d.NodeagentArgs)
		}
	}
	if !slices.Contains(d.ControlplaneArgs, "--log-level=info") {
		t.Errorf("control plane args lack --log-level=info: %q", d.ControlplaneArgs)
	}
	for _, a := range append(slices.Clone(d.ControlplaneArgs), d.NodeagentArgs...) {
		if strings.Contains(a, "$(") && a != "--node-name=$(NODE_NAME)" {
			t.Errorf("unexpanded reference in %q", a)
		}
	}
	if d.ServiceAccount.Namespace != "proxyplane-system" || d.ServiceAccount.Name != "proxyplane-controlplane" {
		t.Errorf("control plane ServiceAccount = %s, want proxyplane-system/proxyplane-controlplane", d.ServiceAccount)
	}
	if !slices.Contains(d.NodeagentEnv, "POD_NAMESPACE=proxyplane-system") || !slices.Contains(d.NodeagentEnv, "NODE_NAME=$(NODE_NAME)") {
		t.Errorf("agent env %q lacks POD_NAMESPACE from metadata.namespace or NODE_NAME", d.NodeagentEnv)
	}
	want := AgentMounts{
		TokenPath: "/var/run/secrets/proxyplane/token", TokenAudience: "proxyplane", TokenExpirationSeconds: 3600,
		CAPath: "/var/run/proxyplane/ca/ca.crt", CAConfigMap: "proxyplane-ca", CAKey: "ca.crt",
	}
	if d.AgentMounts != want {
		t.Errorf("agent mounts %+v, want %+v", d.AgentMounts, want)
	}
}

// TestExpandArgs checks the kubelet's expansion as the box does it, and
// that a reference the kubelet would leave unexpanded is an error here.
func TestExpandArgs(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg-abc"}, Data: map[string]string{"MODE": "iptables", "EMPTY": ""}}
	fromCM := func(name, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cfg-abc"}, Key: key,
		}}}
	}
	fromField := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	cases := []struct {
		name    string
		env     []corev1.EnvVar
		args    []string
		want    []string
		wantErr string
	}{
		{
			name: "configmap, field and literal",
			env:  []corev1.EnvVar{fromCM("MODE", "MODE"), fromCM("EMPTY", "EMPTY"), fromField("NODE", "spec.nodeName"), {Name: "X", Value: "x-$(MODE)"}},
			args: []string{"--mode=$(MODE)", "--cidr=$(EMPTY)", "--node=$(NODE)", "--x=$(X)", "--plain"},
			want: []string{"--mode=iptables", "--cidr=", "--node=node-0", "--x=x-iptables", "--plain"},
		},
		{name: "not in env", args: []string{"--a=$(NOPE)"}, wantErr: "NOPE (not in env)"},
		{name: "unresolvable field", env: []corev1.EnvVar{fromField("IP", "status.podIP")}, args: []string{"--ip=$(IP)"}, wantErr: "fieldRef status.podIP"},
		{name: "missing key", env: []corev1.EnvVar{fromCM("K", "ABSENT")}, args: []string{"--k=$(K)"}, wantErr: `key "ABSENT"`},
		{
			name: "another configmap",
			env: []corev1.EnvVar{{Name: "K", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "MODE",
			}}}},
			args: []string{"--k=$(K)"}, wantErr: `not the generated "cfg-abc"`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := expandArgs(corev1.Container{Env: tc.env, Args: tc.args}, cm, map[string]string{"spec.nodeName": "node-0"})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
