package nftables

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Issue 21, row 3 in nftables mode: names reach object names (over
// netlink) and the nft script the dataplane renders for goldens, errors
// and operators. A hostile name, which proxytable refuses, must change
// neither; the tables here bypass proxytable.

// injections are port names aimed at the nft script: a line break and a
// chain of the attacker's, and a NUL that the kernel would cut a name at.
var injections = []string{
	"\"\n-I INPUT 1 -j ACCEPT\n",
	"p }\n\tchain evil {\n\t\ttype filter hook input priority -500; policy accept;\n\t}\n\tchain x {",
	"p\x00q",
}

func injectedTable(portName string) *proxytable.Table {
	s := dptest.Svc("default", "web", "10.96.0.20")
	s.Ports = []*pb.ServicePort{dptest.Port(portName, dptest.TCP, 80, 0, true)}
	s.ClusterEndpoints = []*pb.PortEndpoints{dptest.Eps(portName, "10.244.1.5:8080")}
	e := dptest.Entry(s)
	node := dptest.Node()
	return &proxytable.Table{
		Version: fmt.Sprintf("%016x", node.GetHash()+e.GetHash()), Node: node,
		Entries: map[string]*pb.ServiceEntry{e.GetKey(): e},
	}
}

func TestInjectedPortNameRenders(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	want := normalizeNFT(rulesetText(fullState(injectedTable("p"), cfg), dataplane.IPv4))
	for _, name := range injections {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			got := rulesetText(fullState(injectedTable(name), cfg), dataplane.IPv4)
			if n := normalizeNFT(got); !slices.Equal(n, want) {
				t.Fatalf("the name changed the ruleset:\n%s", dptest.LineDiff(strings.Join(want, "\n"), strings.Join(n, "\n")))
			}
			if strings.Contains(got, "chain evil") || strings.Contains(got, "\x00") {
				t.Errorf("the name reached the script as it is:\n%s", got)
			}
			// nft itself reads the script as one table of ours (-c checks
			// without loading; it needs CAP_NET_ADMIN).
			if _, err := exec.LookPath("nft"); err == nil && os.Geteuid() == 0 {
				cmd := exec.Command("nft", "-c", "-f", "-")
				cmd.Stdin = strings.NewReader(got)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("nft -c refuses the script: %v\n%s", err, out)
				}
			}
		})
	}
}

// TestKernelInjectedPortName programs the tables over netlink into a
// real namespace: the sync succeeds and the
// namespace holds our table only, with no chain of the attacker's.
func TestKernelInjectedPortName(t *testing.T) {
	nstest.RequireRoot(t)
	for _, name := range injections {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			tp := nstest.New(t, nstest.Options{Pods: 1})
			d, err := New(kernelConfig(tp, dataplane.IPv4), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Sync(context.Background(), injectedTable(name), nil, true); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			out, err := tp.Exec(tp.NodeNS(), "nft", "list", "ruleset")
			if err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			var tables []string
			for _, line := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(line, "table ") {
					tables = append(tables, line)
				}
			}
			if strings.Contains(string(out), "chain evil") || !slices.Equal(tables, []string{"table ip " + TableName + " {"}) {
				t.Errorf("the namespace holds more than our table:\n%s", out)
			}
		})
	}
}
