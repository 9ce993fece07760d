package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

// Issue 21, row 3: a rogue replica (or whoever writes the state
// directory) sends a port name that, pasted into iptables-restore input,
// adds a rule of its own. proxytable refuses such names; these tests
// bypass it (the table is built by hand) to prove the renderer holds on
// its own.

// injections are port names that break out of a comment: the issue's, and
// one crafted so that every line it makes is valid restore input (a
// ClusterIP Service without endpoints writes its name only into the
// filter table's "has no endpoints" comment).
var injections = []string{
	"\"\n-I INPUT 1 -j ACCEPT\n",
	"\"\n-I INPUT 1 -j ACCEPT\n-A PP-SERVICES -m comment --comment \"",
}

// injectedTable is a ClusterIP Service without endpoints whose port is
// called portName, not validated.
func injectedTable(portName string) *proxytable.Table {
	s := dptest.Svc("default", "web", "10.96.0.20")
	s.Ports = []*pb.ServicePort{dptest.Port(portName, dptest.TCP, 80, 0, false)}
	e := dptest.Entry(s)
	node := dptest.Node()
	return &proxytable.Table{
		Version: fmt.Sprintf("%016x", node.GetHash()+e.GetHash()), Node: node,
		Entries: map[string]*pb.ServiceEntry{e.GetKey(): e},
	}
}

func TestInjectedPortNameRenders(t *testing.T) {
	cfg := testConfig(dataplane.IPv4)
	want := dptest.NormalizeRestore(string(renderFull(injectedTable("p"), cfg).data))
	for _, name := range injections {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			if _, err := proxytable.FromEntries(injectedTable(name).Version, dptest.Node(), []*pb.ServiceEntry{injectedTable(name).Entries["default/web"]}); err == nil {
				t.Error("proxytable accepted the name; it must refuse it")
			}
			data := string(renderFull(injectedTable(name), cfg).data)
			for _, line := range strings.Split(data, "\n") {
				if args := dptest.RestoreArgs(line); len(args) > 1 && (args[0] == "-A" || args[0] == "-I") && !strings.HasPrefix(args[1], "PP-") {
					t.Errorf("a rule in a chain not ours: %q", line)
				}
			}
			if got := dptest.NormalizeRestore(data); !slices.Equal(got, want) {
				t.Fatalf("the name changed the rules:\n%s", dptest.LineDiff(strings.Join(want, "\n"), strings.Join(got, "\n")))
			}
		})
	}
}

// TestKernelInjectedPortName programs the tables into a real namespace
// with each backend: the sync succeeds, the Service is rejected as one
// without endpoints must be, and INPUT holds no rule but the agent's
// jumps.
func TestKernelInjectedPortName(t *testing.T) {
	nstest.RequireRoot(t)
	for _, backend := range backends(t) {
		t.Run(string(backend), func(t *testing.T) {
			for _, name := range injections {
				t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
					tp := nstest.New(t, nstest.Options{})
					d, err := New(kernelConfig(tp, dataplane.IPv4, backend), nil)
					if err != nil {
						t.Fatal(err)
					}
					if err := d.Sync(context.Background(), injectedTable(name), nil, true); err != nil {
						t.Fatalf("Sync: %v", err)
					}
					out, err := tp.Exec(tp.NodeNS(), xtables.BinariesOf(dataplane.IPv4, backend).Save, "-t", "filter")
					if err != nil {
						t.Fatalf("%s: %v", out, err)
					}
					for _, line := range strings.Split(string(out), "\n") {
						if strings.HasPrefix(line, "-A INPUT ") && !strings.Contains(line, "-j PP-") {
							t.Errorf("a rule in INPUT that is not the agent's jump: %q", line)
						}
					}
					if _, err := tp.DialTCP(tp.ClientNS(), "10.96.0.20:80", dptest.DialTimeout); !nstest.IsRefused(err) {
						t.Errorf("dial to the Service without endpoints: %v, want refused", err)
					}
				})
			}
		})
	}
}
