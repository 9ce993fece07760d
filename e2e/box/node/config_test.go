package node

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

func validConfig() Config {
	return Config{
		Name: "node-0", NetNS: "ns", Dir: "/tmp/x/node", NodeIP: netip.MustParseAddr("192.168.100.1"),
		PodCIDR: netip.MustParsePrefix("10.246.1.0/24"), APIServerURL: "https://192.168.100.200:6443",
		Token: "t", Kubelet: "/bin/kubelet", PauseImage: "pause:dev", Client: fake.NewClientset(),
	}
}

// TestValidate: a Dir the node's processes see replaced (its bind mounts
// cover /var/lib, /var/log and /run) is refused, as is a pod range the
// bridge cannot use.
func TestValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"dir under /var/lib": func(c *Config) { c.Dir = "/var/lib/box/node" },
		"dir is /run":        func(c *Config) { c.Dir = "/run" },
		"dir under /var/log": func(c *Config) { c.Dir = "/var/log/n" },
		"relative dir":       func(c *Config) { c.Dir = "node" },
		"unmasked CIDR":      func(c *Config) { c.PodCIDR = netip.MustParsePrefix("10.246.1.1/24") },
		"IPv6 CIDR":          func(c *Config) { c.PodCIDR = netip.MustParsePrefix("fd00::/64") },
		"no client":          func(c *Config) { c.Client = nil },
		"no token":           func(c *Config) { c.Token = "" },
	} {
		c := validConfig()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := validConfig()
	c.Dir = "/var/library" // a prefix of the string, not of the path
	if err := c.Validate(); err != nil {
		t.Errorf("/var/library refused: %v", err)
	}
}

// TestCNIConfig: the bridge is cni0 (nstest's own is br0), addresses come
// from the pod range with the first as gateway, and host-local keeps its
// state under /var/lib/cni, inside the node's bind mount.
func TestCNIConfig(t *testing.T) {
	s, err := cniConfig("10.246.1.0/24", "10.246.1.1")
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPMasq bool   `json:"ipMasq"`
			IPAM   struct {
				Ranges  [][]map[string]string `json:"ranges"`
				DataDir string                `json:"dataDir"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(s), &conf); err != nil {
		t.Fatalf("%v:\n%s", err, s)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0].Type != "bridge" || conf.Plugins[1].Type != "portmap" {
		t.Fatalf("plugins: %+v", conf.Plugins)
	}
	b := conf.Plugins[0]
	if b.Bridge != cniBridge || b.IPMasq || b.IPAM.Ranges[0][0]["subnet"] != "10.246.1.0/24" ||
		b.IPAM.Ranges[0][0]["gateway"] != "10.246.1.1" || !strings.HasPrefix(b.IPAM.DataDir, "/var/lib/cni/") {
		t.Fatalf("bridge: %+v", b)
	}
}

// TestTokenRecord: the token file line makes the kubelet
// system:node:NAME in system:nodes, the identity system:node is for.
func TestTokenRecord(t *testing.T) {
	if got, want := TokenRecord("abc", "node-1"), "abc,system:node:node-1,e2e-node-node-1,system:nodes"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
