package box

import (
	"bytes"
	"os"
	"path/filepath"
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
		"--config=/etc/proxyplane/config.conf",
		"--control-plane=192.168.100.200:9640,192.168.100.200:9650",
		"--node-name=$(NODE_NAME)",
		"--iptables-backend=nft",
		"--tls-server-name=proxyplane-controlplane.proxyplane-system.svc",
		"--ca-file=/var/run/proxyplane/ca/ca.crt",
		"--token-file=/var/run/secrets/proxyplane/token",
	} {
		if !slices.Contains(d.NodeagentArgs, want) {
			t.Errorf("agent args lack %q: %q", want, d.NodeagentArgs)
		}
	}
	if !slices.Contains(d.ControlplaneArgs, "--config=/etc/proxyplane/config.conf") {
		t.Errorf("control plane args lack --config: %q", d.ControlplaneArgs)
	}
	// Each --config names the file its ConfigMap volume mounts, whose
	// content is deploy/'s file; the box points the flag at its copy.
	for _, w := range []struct {
		what, file string
		args       []string
		files      []File
	}{
		{"agent", "kube-proxy.conf", d.NodeagentArgs, d.NodeagentFiles},
		{"control plane", "controlplane.conf", d.ControlplaneArgs, d.ControlplaneFiles},
	} {
		want, err := os.ReadFile(filepath.Join(deployDir, w.file))
		if err != nil {
			t.Fatal(err)
		}
		if len(w.files) != 1 || w.files[0].Path != "/etc/proxyplane/config.conf" || !bytes.Equal(w.files[0].Data, want) {
			t.Errorf("%s files %+v, want /etc/proxyplane/config.conf holding %s", w.what, w.files, w.file)
		}
		if got := hostArgs(w.args, w.files, "/box"); !slices.Equal(got, []string{"--config=/box/etc/proxyplane/config.conf"}) {
			t.Errorf("%s host args %q, want --config at the box's copy", w.what, got)
		}
	}
	// The init container sets the sysctls from the same file.
	if len(d.NodeagentInit) != 1 || !slices.Contains(d.NodeagentInit[0].Args, "--init-only") ||
		len(hostArgs(d.NodeagentInit[0].Args, d.NodeagentFiles, "/box")) != 1 {
		t.Errorf("agent init containers %+v, want one running --init-only with the mounted --config", d.NodeagentInit)
	}
	for _, a := range slices.Concat(d.ControlplaneArgs, d.NodeagentArgs) {
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
	cms := map[string]*corev1.ConfigMap{"cfg-abc": {ObjectMeta: metav1.ObjectMeta{Name: "cfg-abc"}, Data: map[string]string{"MODE": "iptables", "EMPTY": ""}}}
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
			args: []string{"--k=$(K)"}, wantErr: `ConfigMap "cfg", which deploy/ does not render`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := expandArgs(corev1.Container{Env: tc.env, Args: tc.args}, cms, map[string]string{"spec.nodeName": "node-0"})
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

// TestConfigMapFiles checks which files the box writes for a pod's
// ConfigMap volumes: those of rendered ConfigMaps only, every key or the
// items listed, under each container's mount path.
func TestConfigMapFiles(t *testing.T) {
	rendered := map[string]*corev1.ConfigMap{
		"conf-h4sh": {ObjectMeta: metav1.ObjectMeta{Name: "conf-h4sh"}, Data: map[string]string{"b.conf": "b", "a.conf": "a"}},
		"other":     {ObjectMeta: metav1.ObjectMeta{Name: "other"}, Data: map[string]string{"x": "y"}},
	}
	volume := func(name, cm string, items ...corev1.KeyToPath) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: cm}, Items: items,
		}}}
	}
	mount := func(volume, path string) corev1.VolumeMount { return corev1.VolumeMount{Name: volume, MountPath: path} }
	cases := []struct {
		name    string
		spec    corev1.PodSpec
		want    []File
		wantErr string
	}{
		{
			name: "every key, in the init container and the container once",
			spec: corev1.PodSpec{
				Volumes:        []corev1.Volume{volume("conf", "conf-h4sh"), volume("ca", "published-at-run-time")},
				InitContainers: []corev1.Container{{Name: "init", VolumeMounts: []corev1.VolumeMount{mount("conf", "/etc/p")}}},
				Containers:     []corev1.Container{{Name: "main", VolumeMounts: []corev1.VolumeMount{mount("conf", "/etc/p"), mount("ca", "/ca")}}},
			},
			want: []File{{Path: "/etc/p/a.conf", Data: []byte("a")}, {Path: "/etc/p/b.conf", Data: []byte("b")}},
		},
		{
			name: "items",
			spec: corev1.PodSpec{
				Volumes:    []corev1.Volume{volume("conf", "conf-h4sh", corev1.KeyToPath{Key: "b.conf", Path: "sub/config.conf"})},
				Containers: []corev1.Container{{Name: "main", VolumeMounts: []corev1.VolumeMount{mount("conf", "/etc/p")}}},
			},
			want: []File{{Path: "/etc/p/sub/config.conf", Data: []byte("b")}},
		},
		{
			name: "volume not mounted",
			spec: corev1.PodSpec{Volumes: []corev1.Volume{volume("conf", "conf-h4sh")}, Containers: []corev1.Container{{Name: "main"}}},
		},
		{
			name: "missing key",
			spec: corev1.PodSpec{
				Volumes:    []corev1.Volume{volume("conf", "conf-h4sh", corev1.KeyToPath{Key: "c.conf", Path: "c"})},
				Containers: []corev1.Container{{Name: "main", VolumeMounts: []corev1.VolumeMount{mount("conf", "/etc/p")}}},
			},
			wantErr: `key "c.conf"`,
		},
		{
			name: "two contents at one path",
			spec: corev1.PodSpec{
				Volumes:        []corev1.Volume{volume("conf", "conf-h4sh", corev1.KeyToPath{Key: "a.conf", Path: "x"}), volume("o", "other")},
				InitContainers: []corev1.Container{{Name: "init", VolumeMounts: []corev1.VolumeMount{mount("o", "/etc/p")}}},
				Containers:     []corev1.Container{{Name: "main", VolumeMounts: []corev1.VolumeMount{mount("conf", "/etc/p")}}},
			},
			wantErr: "different files at /etc/p/x",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := configMapFiles(tc.spec, rendered)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b File) bool { return a.Path == b.Path && bytes.Equal(a.Data, b.Data) }) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestAgentMountsCA checks that the CA bundle is told from the
// configuration files by the ConfigMap being published at run time, not
// rendered, whatever the order of the volumes.
func TestAgentMountsCA(t *testing.T) {
	rendered := map[string]*corev1.ConfigMap{"conf-h4sh": {ObjectMeta: metav1.ObjectMeta{Name: "conf-h4sh"}}}
	cmVolume := func(name, cm string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: cm}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
		}}}
	}
	token := corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "a", Path: "token"}}},
	}}}
	mounts := []corev1.VolumeMount{{Name: "token", MountPath: "/t"}, {Name: "ca", MountPath: "/ca"}, {Name: "conf", MountPath: "/etc/p"}}
	for _, volumes := range [][]corev1.Volume{
		{token, cmVolume("ca", "bundle"), cmVolume("conf", "conf-h4sh")},
		{token, cmVolume("conf", "conf-h4sh"), cmVolume("ca", "bundle")},
	} {
		m, err := agentMounts(corev1.PodSpec{Volumes: volumes, Containers: []corev1.Container{{VolumeMounts: mounts}}}, rendered)
		if err != nil {
			t.Fatal(err)
		}
		if m.CAConfigMap != "bundle" || m.CAPath != "/ca/ca.crt" {
			t.Errorf("CA %s at %s, want bundle at /ca/ca.crt", m.CAConfigMap, m.CAPath)
		}
	}
	_, err := agentMounts(corev1.PodSpec{
		Volumes:    []corev1.Volume{token, cmVolume("ca", "bundle"), cmVolume("conf", "another")},
		Containers: []corev1.Container{{VolumeMounts: mounts}},
	}, rendered)
	if err == nil || !strings.Contains(err.Error(), "which is the CA bundle") {
		t.Errorf("err = %v, want two candidate bundles refused", err)
	}
}

func TestHostArgs(t *testing.T) {
	files := []File{{Path: "/etc/p/config.conf"}}
	got := hostArgs([]string{"--config=/etc/p/config.conf", "--other=/etc/p/other", "-x=/etc/p/config.conf", "/etc/p/config.conf", "--v=2"}, files, "/box/node-0")
	if want := []string{"--config=/box/node-0/etc/p/config.conf"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
