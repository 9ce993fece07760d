package ipvs

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/tool"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
)

// The kernel tests run as root (CI does) and skip otherwise. The first
// feeds the real ipset and iptables tools, in a throwaway namespace, with
// everything this package writes: it runs on any kernel with ipset and
// iptables, this machine's included. The second sends real packets through
// real IPVS and needs a kernel with IPVS and the dummy link type; on one
// without, it skips and names the missing feature. internal/flowsuite runs
// the whole packet-flow suite against this dataplane the same way.

const kernelTimeout = time.Minute

// throwawayNS creates an empty network namespace, deleted at cleanup.
func throwawayNS(t *testing.T) string {
	t.Helper()
	nstest.RequireRoot(t)
	name := fmt.Sprintf("pp-ipvs-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	return name
}

// TestKernelToolsAcceptEverything programs every flow-suite case (both
// families, full and partial syncs, an update of each changing case) with
// the real ipset and iptables tools of each installed backend, IPVS and
// links faked, and checks that the sets the kernel then lists hold exactly
// what the fake kernel's do, and that our chains and jumps are in.
func TestKernelToolsAcceptEverything(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("ipset"); err != nil {
		t.Skip("ipset not installed (apt-get install -y ipset)")
	}
	for _, backend := range []xtables.Backend{xtables.BackendNFT, xtables.BackendLegacy} {
		t.Run(string(backend), func(t *testing.T) {
			if _, err := exec.LookPath("iptables-" + string(backend) + "-restore"); err != nil {
				t.Skipf("iptables-%s not installed: %v", backend, err)
			}
			ns := throwawayNS(t)
			ctx, cancel := context.WithTimeout(context.Background(), kernelTimeout)
			defer cancel()

			real := newNode(t, 0, nil) // fake IPVS and links, real tools
			ref := newNode(t, 0, nil)  // all fake, for comparison
			var ipset ipsetRunner
			for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
				c := testConfig(f, 0)
				c.Backend, c.NetNS = backend, filepath.Join("/run/netns", ns)
				c = withDefaults(c) // commands run under nsenter
				ipsetTool, err := tool.New(c.CommandPrefix, "ipset")
				if err != nil {
					t.Fatal(err)
				}
				ipt, err := xtables.NewRunners(c.tools())
				if err != nil {
					t.Fatal(err)
				}
				ipset = execIPSet{ipsetTool}
				s := real.kern.seams(f)
				s.ipset, s.iptables = ipset, ipt
				real.dps[f] = newDataplane(c, s, nil)
			}

			var before, after []*pb.Service
			for _, c := range flowCases {
				before = append(before, c.services(0)...)
				if c.update != nil {
					after = append(after, c.update(0)...)
				} else {
					after = append(after, c.services(0)...)
				}
			}
			for _, step := range []struct {
				full     bool
				services []*pb.Service
			}{{true, before}, {false, after}, {false, before}, {true, after}} {
				real.mustSync(step.full, step.services...)
				ref.mustSync(step.full, step.services...)
				out, err := ipset.Save(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
					got := parseIPSetSave(f, out)
					for id := range numSets {
						g := slices.Sorted(maps.Keys(got[id]))
						w := slices.Sorted(maps.Keys(ref.kern.ipset.sets[setName(f, id)].members))
						if !slices.Equal(g, w) {
							t.Errorf("full=%v: kernel set %s = %v, want %v", step.full, setName(f, id), g, w)
						}
					}
				}
			}

			// Our chains and exactly one of each jump, after two full
			// syncs.
			for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
				bin := map[dataplane.Family]string{dataplane.IPv4: "iptables", dataplane.IPv6: "ip6tables"}[f] + "-" + string(backend) + "-save"
				for _, table := range []string{"nat", "filter"} {
					out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, bin, "-t", table).CombinedOutput()
					if err != nil {
						t.Fatalf("%s: %v: %s", bin, err, out)
					}
					for _, j := range jumps {
						if j.Table != table {
							continue
						}
						if n := strings.Count(string(out), "-A "+j.From+" -m comment --comment \""+j.Comment+"\" -j "+j.To+"\n"); n != 1 {
							t.Errorf("%s %s: %d jumps from %s to %s, want 1:\n%s", bin, table, n, j.From, j.To, out)
						}
					}
				}
			}
		})
	}
}

// TestKernelIPVS sends real packets through real IPVS in an nstest node:
// a ClusterIP spread over two pods, a NodePort from the client, and a
// Service without endpoints refused. It needs root, a kernel with IPVS
// and the dummy link type; it skips, naming what is missing, otherwise.
func TestKernelIPVS(t *testing.T) {
	nstest.RequireRoot(t)
	if err := checkIPVSFamily(); err != nil {
		t.Skipf("needs a kernel with IPVS: %v (run on a kernel with CONFIG_IP_VS, see README.md)", err)
	}
	tp := nstest.New(t, nstest.Options{Pods: 2})
	for i := range tp.Pods() {
		tp.ServeTCP(i, backendPort)
		tp.ServeUDP(i, backendPort)
	}
	web := svcSpec{idx: 0, name: "web", nodePort: true, pods: []int{0, 1}}.build(0)
	empty := svcSpec{idx: 2, name: "empty", noEndpoints: true}.build(0)
	// nstest's pods are 10.244.1.10 and .11 (and IPv6 likewise), the
	// unit tests' pods 0 and 1.
	for i := range tp.Pods() {
		if tp.PodIP(i).String() != podIPs[i][0] || tp.PodIPv6(i).String() != podIPs[i][1] {
			t.Fatalf("nstest's pod %d is %v/%v, the tables say %s", i, tp.PodIP(i), tp.PodIPv6(i), podIPs[i])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), kernelTimeout)
	defer cancel()
	table := dptest.Table(t, testNode(0), web, empty)
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		c := DefaultConfig(f)
		c.LocalMode, c.ClusterCIDRs = dataplane.LocalClusterCIDR, clusterCIDRs
		c.NodeIPs = []string{tp.NodeIP().String(), tp.NodeIPv6().String()}
		c.NetNS = filepath.Join("/run/netns", tp.NodeNS())
		d, err := New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(ctx, table, nil, true); err != nil {
			if IsDummyUnavailable(err) {
				t.Skipf("needs the dummy link type: %v", err)
			}
			t.Fatal(err)
		}
	}
	for _, f := range []dataplane.Family{dataplane.IPv4, dataplane.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			addr := nstest.HostPort(netip.MustParseAddr(clusterIPs(0)[fam(f)]), 80)
			got, err := tp.Spread(tp.PodNS(0), addr, 20, 3*time.Second)
			if err != nil || got["pod-0"] == 0 || got["pod-1"] == 0 {
				t.Errorf("ClusterIP %s from pod-0: %v, %v; want both pods", addr, got, err)
			}
			node := tp.NodeIP()
			if f == dataplane.IPv6 {
				node = tp.NodeIPv6()
			}
			np := nstest.HostPort(node, nodePort(0))
			if r, err := tp.DialTCP(tp.ClientNS(), np, 3*time.Second); err != nil || (r.Backend != "pod-0" && r.Backend != "pod-1") {
				t.Errorf("NodePort %s from the client: %+v, %v", np, r, err)
			}
			e := nstest.HostPort(netip.MustParseAddr(clusterIPs(2)[fam(f)]), 80)
			if _, err := tp.DialTCP(tp.PodNS(0), e, 3*time.Second); !nstest.IsRefused(err) {
				t.Errorf("Service without endpoints %s: %v, want refused", e, err)
			}
		})
	}
}
