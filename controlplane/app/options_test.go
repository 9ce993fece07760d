package app

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string // substring of the error; "" for valid
	}{
		{"defaults", nil, ""},
		{"bad grpc address", []string{"--grpc-address=9640"}, "--grpc-address"},
		{"keepalive timeout below interval", []string{"--keepalive-interval=1m", "--keepalive-timeout=30s"}, "must exceed"},
		{"zero write timeout", []string{"--write-timeout=0"}, "--write-timeout must be positive"},
		{"negative resync", []string{"--resync-period=-1s"}, "--resync-period"},
		{"no pending changes", []string{"--max-pending-changes=0"}, "--max-pending-changes"},
		{"tiny messages", []string{"--max-send-message-bytes=10"}, "at least 1 MiB"},
		{"bad log level", []string{"--log-level=loud"}, "--log-level"},
		{"bad logging format", []string{"--logging-format=yaml"}, "--logging-format"},
		{"certificate files", []string{"--tls-cert-file=a", "--tls-private-key-file=b"}, ""},
		{"certificate without key", []string{"--tls-cert-file=a"}, "go together"},
		{"insecure with a certificate", []string{"--insecure", "--tls-cert-file=a", "--tls-private-key-file=b"}, "--insecure serves no certificate"},
		{"extra names", []string{"--tls-san=cp.example.com,10.0.0.1,fd00::1,*.cp.example.com"}, ""},
		{"bad extra name", []string{"--tls-san=not a name"}, "--tls-san"},
		{"extra names with files", []string{"--tls-cert-file=a", "--tls-private-key-file=b", "--tls-san=x.example.com"}, "--tls-san"},
		{"bad namespace", []string{"--namespace=Proxy_Plane"}, "--namespace"},
		{"empty audience", []string{"--token-audience="}, "--token-audience"},
		{"bad service account", []string{"--agent-service-account=proxyplane-nodeagent"}, "--agent-service-account"},
		{"no agents", []string{"--max-agents=0"}, "--max-agents"},
		{"fewer streams than agents", []string{"--max-agents=100", "--max-streams=50"}, "--max-streams"},
		{"no peer limit", []string{"--peer-rate=0"}, ""},
		{"negative peer rate", []string{"--peer-rate=-1"}, "--peer-rate"},
		{"no admission", []string{"--admission-rate=0"}, "--admission-rate"},
		{"no admission burst", []string{"--admission-burst=0"}, "--admission-burst"},
		{"agents' control plane addresses", []string{"--agent-control-plane=10.0.0.1:9640,cp.example.com:9640"}, ""},
		{"none, as an empty CONTROL_PLANE_ADDRESSES gives", []string{"--agent-control-plane="}, ""},
		{"agents' control plane address without port", []string{"--agent-control-plane=10.0.0.1"}, "--agent-control-plane"},
		{"bad node port range", []string{"--service-node-port-range=30000-"}, "--service-node-port-range"},
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

func TestDefaultNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "kube-proxyplane")
	if got := NewOptions().Namespace; got != "kube-proxyplane" {
		t.Errorf("namespace %q, want $POD_NAMESPACE", got)
	}
	t.Setenv("POD_NAMESPACE", "")
	if got := NewOptions().Namespace; got != "proxyplane-system" {
		// Unless this test runs in a Pod, where the mounted one wins.
		if _, err := os.Stat(serviceAccountNamespaceFile); err != nil {
			t.Errorf("namespace %q, want proxyplane-system", got)
		}
	}
}

func TestOptionsDefaultsAreConsistent(t *testing.T) {
	o := NewOptions()
	if o.Insecure || o.TLSCertFile != "" {
		t.Error("TLS must be on by default, bootstrapped")
	}
	if o.MaxAgents < 5000 {
		t.Errorf("--max-agents %d cannot carry a 5,000-node cluster", o.MaxAgents)
	}
	if o.KeepaliveTimeout < 2*o.KeepaliveInterval {
		t.Errorf("keepalive timeout %s allows fewer than two lost keepalives at interval %s", o.KeepaliveTimeout, o.KeepaliveInterval)
	}
	if o.AckTimeout < time.Minute {
		t.Errorf("ack timeout %s is shorter than a full kernel sync may take", o.AckTimeout)
	}
}

// TestCompleteConfig checks that the file replaces the defaults and the
// command line replaces the file, slices included.
func TestCompleteConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controlplane.yaml")
	if err := os.WriteFile(path, []byte(`apiVersion: controlplane.proxyplane.io/v1alpha1
kind: ControlPlaneConfiguration
grpcAddress: ":7000"
resyncPeriod: 0s
maxAgents: 100
peerRate: 0
tls: {sans: [file.example]}
logging: {level: debug, format: json}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--config=" + path, "--max-agents=200", "--tls-san=flag.example", "--log-level=warn"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err != nil {
		t.Fatal(err)
	}
	if o.GRPCAddress != ":7000" || o.ResyncPeriod != 0 || o.PeerRate != 0 || o.Logging.Format != "json" {
		t.Errorf("file values lost: %q %s %g %q", o.GRPCAddress, o.ResyncPeriod, o.PeerRate, o.Logging.Format)
	}
	if o.MaxAgents != 200 || !slices.Equal(o.TLSSANs, []string{"flag.example"}) || o.Logging.Level != "warn" {
		t.Errorf("the command line did not win: %d %q %q", o.MaxAgents, o.TLSSANs, o.Logging.Level)
	}
	if o.MetricsAddress != ":9641" {
		t.Errorf("metrics address %q, want the default the file leaves", o.MetricsAddress)
	}
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
	o = NewOptions()
	fs = pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--config=" + filepath.Join(t.TempDir(), "absent")}); err != nil {
		t.Fatal(err)
	}
	if err := o.Complete(fs); err == nil {
		t.Error("no error for a missing --config file")
	}
}

// TestConfigFileCoversEveryFlag sets each flag's field, alone, in a file:
// the strict decoder must know the field and the flag must take its
// value. A flag added without its field, or a field applyFile forgets,
// fails here.
func TestConfigFileCoversEveryFlag(t *testing.T) {
	notInFile := map[string]bool{"config": true, "insecure": true, "version": true}
	nested := map[string]string{
		"log-level": "logging: {level: %s}", "v": "logging: {verbosity: %s}", "logging-format": "logging: {format: %s}",
		"tls-cert-file": "tls: {certFile: %s}", "tls-private-key-file": "tls: {privateKeyFile: %s}", "tls-san": "tls: {sans: %s}",
	}
	samples := map[string]string{
		"string": `"from-file"`, "duration": "7s", "int": "7", "int32": "7", "uint32": "7", "float64": "7.5", "stringSlice": `["from.file"]`, "bool": "true",
	}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if notInFile[f.Name] {
			return
		}
		sample, ok := samples[f.Value.Type()]
		if !ok {
			t.Errorf("--%s: no sample for flags of type %s", f.Name, f.Value.Type())
			return
		}
		if f.Value.Type() == "bool" && f.DefValue == "true" {
			sample = "false" // a value other than the default, to see it taken
		}
		field := nested[f.Name]
		if field == "" {
			words := strings.Split(f.Name, "-")
			for i := 1; i < len(words); i++ {
				words[i] = strings.ToUpper(words[i][:1]) + words[i][1:]
			}
			field = strings.Join(words, "") + ": %s"
		}
		path := filepath.Join(t.TempDir(), "controlplane.yaml")
		file := "apiVersion: controlplane.proxyplane.io/v1alpha1\nkind: ControlPlaneConfiguration\n" + fmt.Sprintf(field, sample) + "\n"
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		o := NewOptions()
		ofs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.AddFlags(ofs)
		if err := ofs.Parse([]string{"--config=" + path}); err != nil {
			t.Fatal(err)
		}
		if err := o.Complete(ofs); err != nil {
			t.Errorf("--%s: %v", f.Name, err)
			return
		}
		if got := ofs.Lookup(f.Name).Value.String(); got == f.DefValue {
			t.Errorf("--%s: the file's %q left it at its default %s", f.Name, strings.TrimSpace(fmt.Sprintf(field, sample)), got)
		}
	})
}
