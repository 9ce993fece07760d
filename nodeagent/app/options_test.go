package app

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestOptionsValidate(t *testing.T) {
	base := []string{"--control-plane=10.0.0.5:9640", "--node-name=node-1", "--cluster-cidr=10.244.0.0/16"}
	cases := []struct {
		name string
		args []string
		want string // substring of the error; "" for valid
	}{
		{"valid", base, ""},
		{"no control plane", []string{"--node-name=n", "--cluster-cidr=10.244.0.0/16"}, "--control-plane is required"},
		{"control plane without port", append(base, "--control-plane=cp"), "--control-plane \"cp\""},
		{"bad node name", append(base, "--node-name=Node_1"), "--node-name"},
		{"relative state dir", append(base, "--state-dir=var/lib"), "absolute"},
		{"unknown mode", append(base, "--proxy-mode=ebpf"), "--proxy-mode"},
		{"bad cluster cidr", append(base, "--cluster-cidr=10.244.0.0/33"), "--cluster-cidr"},
		{"ClusterCIDR mode without cidr, as kubeadm without --pod-network-cidr", []string{"--control-plane=a:1", "--node-name=n"}, ""},
		{"cleanup needs neither control plane nor cidr", []string{"--cleanup", "--node-name=n"}, ""},
		{"NodeCIDR mode needs no cidr", []string{"--control-plane=a:1", "--node-name=n", "--detect-local-mode=NodeCIDR"}, ""},
		{"bad local mode", append(base, "--detect-local-mode=Bridge"), "--detect-local-mode"},
		{"localhost NodePorts off", append(base, "--nodeport-addresses=127.0.0.0/8"), "need --iptables-localhost-nodeports"},
		{"localhost NodePorts on", append(base, "--nodeport-addresses=127.0.0.0/8", "--iptables-localhost-nodeports"), ""},
		{"localhost NodePorts in nftables mode", append(base, "--nodeport-addresses=127.0.0.1/32", "--iptables-localhost-nodeports", "--proxy-mode=nftables"), "iptables mode only"},
		{"every address in nftables mode", append(base, "--nodeport-addresses=0.0.0.0/0", "--proxy-mode=nftables"), ""},
		{"masquerade bit", append(base, "--masquerade-bit=32"), "--masquerade-bit"},
		{"short sync period", append(base, "--sync-period=10ms"), "--sync-period"},
		{"negative failback interval", append(base, "--failback-interval=-1s"), "--failback-interval"},
		{"bad logging format", append(base, "--logging-format=yaml"), "--logging-format"},
		{"bad backend", append(base, "--iptables-backend=xt"), "--iptables-backend"},
		{"bad healthz address", append(base, "--healthz-bind-address=10256"), "--healthz-bind-address"},
		{"relative ca file", append(base, "--ca-file=ca.crt"), "--ca-file"},
		{"relative token file", append(base, "--token-file=token"), "--token-file"},
		{"bad server name", append(base, "--tls-server-name=Not A Name"), "--tls-server-name"},
		{"insecure needs no files", append(base, "--insecure", "--ca-file=", "--token-file="), ""},
		{"init-only needs no control plane", []string{"--init-only", "--node-name=n", "--cluster-cidr=10.244.0.0/16"}, ""},
		{"negative conntrack", append(base, "--conntrack-min=-1"), "conntrack.min"},
		{"negative ipvs timeout", append(base, "--ipvs-udp-timeout=-1s"), "--ipvs-udp-timeout"},
		{"bad bind address", append(base, "--bind-address=node-1"), "--bind-address"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestSecureByDefault checks that an agent given only the required flags
// dials with TLS and a token, at the paths deploy/nodeagent.yaml mounts.
func TestSecureByDefault(t *testing.T) {
	c := NewOptions().Credentials()
	if c.Insecure || c.CAFile != "/var/run/proxyplane/ca/ca.crt" || c.TokenFile != "/var/run/secrets/proxyplane/token" ||
		c.ServerName != "proxyplane-controlplane.proxyplane-system.svc" {
		t.Errorf("default credentials %+v, want TLS and a token at deploy/'s paths", c)
	}
}

func TestNodeNameFromEnvironment(t *testing.T) {
	t.Setenv("NODE_NAME", "Worker-7")
	if got := NewOptions().NodeName; got != "worker-7" {
		t.Errorf("node name %q, want worker-7 from $NODE_NAME, lowercased", got)
	}
}
