package nstest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Link names. Each namespace has its own link namespace, so fixed names
// cannot collide between topologies and all stay within the 15-character
// limit for interface names.
const (
	// NodeExternalLink is a node's link to the LAN bridge: the node's
	// "external NIC", holding its node IP.
	NodeExternalLink = "eth0"
	// BridgeLink is the bridge in each node namespace that its pods hang
	// off, and the LAN bridge in the LAN namespace.
	BridgeLink = "br0"
	// PodLink is the link inside each pod namespace (and inside the client
	// namespace).
	PodLink = "eth0"
)

// PodHostLink returns the name of the node's end of the veth pair of the
// node's i-th pod (counted within the node), a port of BridgeLink.
func PodHostLink(i int) string { return "veth" + strconv.Itoa(i) }

// lanPortLink names the LAN bridge's port for node k; "client" for the
// client.
func lanPortLink(k int) string { return "node" + strconv.Itoa(k) }

// Defaults and bounds for Options, each with its reason.
const (
	// DefaultPods is two so a test can tell backends apart and observe load
	// balancing.
	DefaultPods = 2
	// MaxPods keeps pod addresses (10.244.N.10 upwards) inside each node's
	// /24 and setup time bounded.
	MaxPods = 100
	// MaxNodes keeps each node's external range (a /27 of 198.51.100.0/24)
	// distinct.
	MaxNodes = 8
	// MaxHosts keeps host addresses (192.168.100.200 upwards) below the
	// LAN router's .254.
	MaxHosts = 50
	// ExecTimeout bounds every command run by Exec, so a hung tool cannot
	// hang the test binary until the global test timeout.
	ExecTimeout = 30 * time.Second
	// setupTimeout bounds waiting for links to come up.
	setupTimeout = 10 * time.Second
)

// defaultServiceCIDRs are the ClusterIP ranges routed by the nodes when
// Options.ServiceCIDRs is empty: the kubeadm default and an IPv6 /112 (the
// largest range Kubernetes accepts for IPv6 services).
var defaultServiceCIDRs = []netip.Prefix{
	netip.MustParsePrefix("10.96.0.0/16"),
	netip.MustParsePrefix("fd00:96::/112"),
}

// Options configure New. The zero value is valid: one node with two pods.
type Options struct {
	// Nodes is the number of node namespaces; 0 means 1.
	Nodes int
	// Pods is the number of pod namespaces on each node; 0 means
	// DefaultPods.
	Pods int
	// Hosts is the number of extra namespaces on the LAN, outside the
	// cluster (for a control plane and its API server, say): host i has
	// 192.168.100.(200+i) and fd00:100::(200+i), hex.
	Hosts int
	// ServiceCIDRs are the ClusterIP ranges each node routes via
	// NodeExternalLink so its own connections reach OUTPUT DNAT; empty means
	// 10.96.0.0/16 and fd00:96::/112.
	ServiceCIDRs []netip.Prefix
}

// Validate reports whether the options are usable, after defaults apply.
func (o Options) Validate() error {
	o = o.withDefaults()
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		return fmt.Errorf("nodes must be between 1 and %d, got %d", MaxNodes, o.Nodes)
	}
	if o.Pods < 1 || o.Pods > MaxPods {
		return fmt.Errorf("pods must be between 1 and %d, got %d", MaxPods, o.Pods)
	}
	if o.Hosts < 0 || o.Hosts > MaxHosts {
		return fmt.Errorf("hosts must be between 0 and %d, got %d", MaxHosts, o.Hosts)
	}
	for _, p := range o.ServiceCIDRs {
		if !p.IsValid() || p != p.Masked() {
			return fmt.Errorf("service CIDR %v is not a valid, masked prefix", p)
		}
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Pods == 0 {
		o.Pods = DefaultPods
	}
	if len(o.ServiceCIDRs) == 0 {
		o.ServiceCIDRs = slices.Clone(defaultServiceCIDRs)
	}
	return o
}

// Addresses of the topology; see the package documentation for the picture.
var (
	routerIP    = netip.MustParseAddr("192.168.100.254")
	routerIPv6  = netip.MustParseAddr("fd00:100::fe")
	clientIP    = netip.MustParseAddr("192.168.100.100")
	clientIPv6  = netip.MustParseAddr("fd00:100::100")
	extPrefix   = 24
	extPrefix6  = 64
	podPrefix   = 24
	podPrefix6  = 64
	firstPodOff = 10
)

// TB is the part of testing.TB a Topology uses. Tests pass their
// *testing.T; a program that builds a topology outside a test (the demo)
// passes its own, running the cleanups when it exits.
type TB interface {
	Helper()
	Name() string
	Cleanup(func())
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
}

// RequireRoot skips the test unless it can create network namespaces: it
// needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ip command.
func RequireRoot(t TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces; run as root (CI does)")
	}
	if !hasCaps(unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN) {
		t.Skip("needs CAP_SYS_ADMIN and CAP_NET_ADMIN to create network namespaces; run as root outside a restricted container (CI does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2) to create network namespaces: apt-get install -y iproute2")
	}
}

// hasCaps reports whether the process holds all the given effective
// capabilities; it answers true when it cannot tell, so New fails loudly
// instead of skipping silently.
func hasCaps(caps ...int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		hex, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		eff, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return true
		}
		for _, c := range caps {
			if eff&(1<<uint(c)) == 0 {
				return false
			}
		}
		return true
	}
	return true
}

// Topology is a set of network namespaces built by New and deleted by the
// test's cleanup. Its methods are safe for concurrent use.
type Topology struct {
	tb       TB
	opts     Options
	lanNS    string
	clientNS string
	hostNS   []string
	nodes    []*Node
	podNS    []string
	// labels maps each namespace name to its role ("node-0", "client",
	// "pod-0"), the backend name its servers report. Not modified after New.
	labels map[string]string
	// nextPort numbers dials; see sourcePort.
	nextPort atomic.Uint32

	// mu guards created.
	mu sync.Mutex
	// created lists the namespaces made so far, in creation order, for
	// cleanup.
	created []string
}

// Node is one node namespace of a Topology and the pods behind it.
type Node struct {
	index int
	name  string // "node-<index>", also its label
	ns    string
	pods  []int // global pod indices
}

// nameSeq numbers topologies within this process.
var nameSeq atomic.Uint32

// New builds a topology for the test and registers its deletion with
// t.Cleanup. It skips the test when RequireRoot would, and fails it (via
// t.Fatal, so call it from the test goroutine) when the kernel refuses the
// setup.
func New(t TB, opts Options) *Topology {
	t.Helper()
	RequireRoot(t)
	if err := opts.Validate(); err != nil {
		t.Fatalf("nstest: invalid options: %v", err)
	}
	opts = opts.withDefaults()
	sweepLeftovers(t)
	tp := &Topology{tb: t, opts: opts, labels: map[string]string{}}
	t.Cleanup(tp.cleanup)

	prefix, err := tp.pickPrefix(t.Name())
	if err != nil {
		t.Fatalf("nstest: %v", err)
	}
	tp.lanNS = prefix + "-lan"
	tp.clientNS = prefix + "-client"
	tp.labels[tp.lanNS] = "lan"
	tp.labels[tp.clientNS] = "client"
	for i := range opts.Hosts {
		name := fmt.Sprintf("%s-host-%d", prefix, i)
		tp.hostNS = append(tp.hostNS, name)
		tp.labels[name] = fmt.Sprintf("host-%d", i)
	}
	for k := range opts.Nodes {
		n := &Node{index: k, name: fmt.Sprintf("node-%d", k), ns: fmt.Sprintf("%s-node-%d", prefix, k)}
		tp.labels[n.ns] = n.name
		for range opts.Pods {
			i := len(tp.podNS)
			name := fmt.Sprintf("%s-pod-%d", prefix, i)
			tp.podNS = append(tp.podNS, name)
			tp.labels[name] = fmt.Sprintf("pod-%d", i)
			n.pods = append(n.pods, i)
		}
		tp.nodes = append(tp.nodes, n)
	}
	if err := tp.build(); err != nil {
		t.Fatalf("nstest: building topology %s: %v", prefix, err)
	}
	return tp
}

// pickPrefix returns a namespace-name prefix that no existing namespace
// uses: "nst", a hash of the test name (to tell tests apart in "ip netns
// list"), the process id (parallel packages run in separate processes) and
// a per-process counter, for example "nst3f2a-81234-7".
func (tp *Topology) pickPrefix(testName string) (string, error) {
	h := fnv.New32a()
	h.Write([]byte(testName))
	sum := h.Sum32() & 0xffff
	for range 16 {
		prefix := fmt.Sprintf("nst%04x-%d-%d", sum, os.Getpid(), nameSeq.Add(1))
		if !nsNameUsed(prefix) {
			return prefix, nil
		}
	}
	return "", errors.New("no unused namespace name prefix after 16 tries")
}

func nsNameUsed(prefix string) bool {
	matches, _ := filepath.Glob(filepath.Join("/run/netns", prefix+"-*"))
	return len(matches) > 0
}

// leftoverName matches the namespaces New names, capturing the creating
// process id.
var leftoverName = regexp.MustCompile(`^nst[0-9a-f]{4}-([0-9]+)-[0-9]+-(node|node-[0-9]+|lan|client|host-[0-9]+|pod-[0-9]+)$`)

var sweepOnce sync.Once

// sweepLeftovers deletes namespaces that New made in processes that no
// longer exist: a test binary killed by -timeout or a signal runs no
// cleanups. Namespaces of live processes are never touched.
func sweepLeftovers(t TB) {
	t.Helper()
	sweepOnce.Do(func() {
		entries, err := os.ReadDir("/run/netns")
		if err != nil {
			return
		}
		for _, e := range entries {
			m := leftoverName.FindStringSubmatch(e.Name())
			if m == nil {
				continue
			}
			if _, err := os.Stat("/proc/" + m[1]); err == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), ExecTimeout)
			if _, err := runCmd(ctx, "ip", "netns", "delete", e.Name()); err == nil {
				t.Logf("nstest: deleted namespace %s left by dead process %s", e.Name(), m[1])
			}
			cancel()
		}
	})
}

// Nodes returns the number of node namespaces.
func (tp *Topology) Nodes() int { return len(tp.nodes) }

// Node returns node k. It panics if k is out of range.
func (tp *Topology) Node(k int) *Node {
	if k < 0 || k >= len(tp.nodes) {
		panic(fmt.Sprintf("nstest: node index %d out of range [0,%d)", k, len(tp.nodes)))
	}
	return tp.nodes[k]
}

// PodNode returns the node that pod i runs on. It panics if i is out of
// range.
func (tp *Topology) PodNode(i int) *Node {
	tp.checkPod(i)
	return tp.nodes[i/tp.opts.Pods]
}

// NodeNS returns the name of node 0's namespace.
func (tp *Topology) NodeNS() string { return tp.nodes[0].ns }

// HostNS returns the name of extra host i's namespace (Options.Hosts). It
// panics if i is out of range.
func (tp *Topology) HostNS(i int) string { return tp.hostNS[i] }

// HostIP returns host i's IPv4 address on the LAN, 192.168.100.(200+i).
func (tp *Topology) HostIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{192, 168, 100, byte(200 + i)})
}

// HostIPv6 returns host i's IPv6 address on the LAN, fd00:100::(200+i)
// with 200+i in hex (host 0 is fd00:100::c8).
func (tp *Topology) HostIPv6(i int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:100::%x", 200+i))
}

// ClientNS returns the name of the client namespace outside the cluster.
func (tp *Topology) ClientNS() string { return tp.clientNS }

// PodNS returns the name of pod i's namespace. Pods are numbered across
// the topology: node k has pods k*Pods to (k+1)*Pods-1. It panics if i is
// out of range.
func (tp *Topology) PodNS(i int) string { return tp.podNS[i] }

// Pods returns the number of pod namespaces, on all nodes.
func (tp *Topology) Pods() int { return len(tp.podNS) }

// ServiceCIDRs returns the ClusterIP ranges routed by the nodes.
func (tp *Topology) ServiceCIDRs() []netip.Prefix {
	return slices.Clone(tp.opts.ServiceCIDRs)
}

// NodeIP returns node 0's IPv4 address, 192.168.100.1.
func (tp *Topology) NodeIP() netip.Addr { return tp.nodes[0].IP() }

// NodeIPv6 returns node 0's IPv6 address, fd00:100::1.
func (tp *Topology) NodeIPv6() netip.Addr { return tp.nodes[0].IPv6() }

// ClientIP returns the client's IPv4 address, 192.168.100.100.
func (tp *Topology) ClientIP() netip.Addr { return clientIP }

// ClientIPv6 returns the client's IPv6 address, fd00:100::100.
func (tp *Topology) ClientIPv6() netip.Addr { return clientIPv6 }

// BridgeIP returns node 0's IPv4 address on its pod bridge, 10.244.1.1.
func (tp *Topology) BridgeIP() netip.Addr { return tp.nodes[0].BridgeIP() }

// BridgeIPv6 returns node 0's IPv6 address on its pod bridge,
// fd00:244:1::1.
func (tp *Topology) BridgeIPv6() netip.Addr { return tp.nodes[0].BridgeIPv6() }

// PodIP returns pod i's IPv4 address, 10.244.(k+1).(10+j) for the j-th
// pod of node k. It panics if i is out of range.
func (tp *Topology) PodIP(i int) netip.Addr {
	n := tp.PodNode(i)
	a := n.BridgeIP().As4()
	a[3] = byte(firstPodOff + i - n.pods[0])
	return netip.AddrFrom4(a)
}

// PodIPv6 returns pod i's IPv6 address, fd00:244:(k+1)::(10+j) for the
// j-th pod of node k, its last group spelled like the last octet of PodIP
// (node 0's pod 5 is fd00:244:1::15). It panics if i is out of range.
func (tp *Topology) PodIPv6(i int) netip.Addr {
	n := tp.PodNode(i)
	return netip.MustParseAddr(fmt.Sprintf("fd00:244:%d::%d", n.index+1, firstPodOff+i-n.pods[0]))
}

func (tp *Topology) checkPod(i int) {
	if i < 0 || i >= len(tp.podNS) {
		panic(fmt.Sprintf("nstest: pod index %d out of range [0,%d)", i, len(tp.podNS)))
	}
}

// Name returns the node's name, "node-<k>": the label its servers report,
// and a natural Kubernetes Node name for it.
func (n *Node) Name() string { return n.name }

// NS returns the name of the node's namespace, where its dataplane runs.
func (n *Node) NS() string { return n.ns }

// Pods returns the (topology-wide) indices of the node's pods.
func (n *Node) Pods() []int { return slices.Clone(n.pods) }

// IP returns the node's IPv4 address on the LAN, 192.168.100.(k+1).
func (n *Node) IP() netip.Addr { return netip.AddrFrom4([4]byte{192, 168, 100, byte(n.index + 1)}) }

// IPv6 returns the node's IPv6 address on the LAN, fd00:100::(k+1).
func (n *Node) IPv6() netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:100::%x", n.index+1))
}

// BridgeIP returns the node's IPv4 address on its pod bridge,
// 10.244.(k+1).1, its pods' default gateway.
func (n *Node) BridgeIP() netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(n.index + 1), 1}) }

// BridgeIPv6 returns the node's IPv6 address on its pod bridge,
// fd00:244:(k+1)::1, its pods' default gateway.
func (n *Node) BridgeIPv6() netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:244:%d::1", n.index+1))
}

// PodCIDRs returns the node's pod ranges, 10.244.(k+1).0/24 and
// fd00:244:(k+1)::/64, as its Node object would list them.
func (n *Node) PodCIDRs() []netip.Prefix {
	return []netip.Prefix{
		netip.PrefixFrom(n.BridgeIP(), podPrefix).Masked(),
		netip.PrefixFrom(n.BridgeIPv6(), podPrefix6).Masked(),
	}
}

// ExternalIP returns the j-th address (0 <= j < 30) of the IPv4 range the
// client routes via this node, 198.51.100.(32k+1+j): use it as a
// LoadBalancer ingress IP or an externalIP that a load balancer or router
// outside the cluster would send to this node. Nothing owns it.
func (n *Node) ExternalIP(j int) netip.Addr {
	if j < 0 || j >= 30 {
		panic(fmt.Sprintf("nstest: external address index %d out of range [0,30)", j))
	}
	return netip.AddrFrom4([4]byte{198, 51, 100, byte(32*n.index + 1 + j)})
}

// ExternalIPv6 returns the j-th address of the IPv6 range the client
// routes via this node, 2001:db8:100:k::(1+j) (0 <= j < 30).
func (n *Node) ExternalIPv6(j int) netip.Addr {
	if j < 0 || j >= 30 {
		panic(fmt.Sprintf("nstest: external address index %d out of range [0,30)", j))
	}
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:100:%x::%x", n.index, 1+j))
}

// externalRanges are the ranges the client routes via node n.
func (n *Node) externalRanges() []netip.Prefix {
	return []netip.Prefix{
		netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(32 * n.index)}), 27),
		netip.MustParsePrefix(fmt.Sprintf("2001:db8:100:%x::/64", n.index)),
	}
}

// HostPort formats ip and port as an address for DialTCP and DialUDP,
// bracketing IPv6 addresses.
func HostPort(ip netip.Addr, port int) string {
	return net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// Exec runs a command inside namespace ns (through "ip netns exec") and
// returns its combined output. It gives up after ExecTimeout. The error
// includes the output, which is where tools such as iptables explain
// themselves.
func (tp *Topology) Exec(ns string, name string, args ...string) ([]byte, error) {
	return tp.ExecContext(context.Background(), ns, name, args...)
}

// ExecContext is Exec, given up also when ctx ends.
func (tp *Topology) ExecContext(ctx context.Context, ns string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, ExecTimeout)
	defer cancel()
	return execIn(ctx, ns, name, args...)
}

func execIn(ctx context.Context, ns, name string, args ...string) ([]byte, error) {
	argv := append([]string{"netns", "exec", ns, name}, args...)
	return runCmd(ctx, "ip", argv...)
}

func runCmd(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	// A command that leaves a child holding its output open would otherwise
	// keep CombinedOutput waiting after the command itself exits.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("running %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Do runs f on an OS thread switched into namespace ns and returns f's
// error. Sockets f creates stay in ns after Do returns; goroutines f starts
// do not inherit ns.
//
// f runs on a goroutine of its own, locked to its thread, so the caller's
// thread never changes namespace; f must therefore not call t.FailNow (or
// t.Fatal). The thread's original namespace is restored afterwards; if that
// fails, the thread is left locked, so the Go runtime discards it rather than
// reusing a thread in the wrong namespace.
func (tp *Topology) Do(ns string, f func() error) error {
	return doIn(ns, f)
}

func doIn(ns string, f func() error) error {
	target, err := netns.GetFromName(ns)
	if err != nil {
		return fmt.Errorf("opening namespace %s: %w", ns, err)
	}
	defer func() { _ = target.Close() }()

	type result struct {
		err   error
		panic any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no deferred UnlockOSThread: see below.
		orig, err := netns.Get()
		if err != nil {
			done <- result{err: fmt.Errorf("getting current namespace: %w", err)}
			return
		}
		defer func() { _ = orig.Close() }()
		if err := netns.Set(target); err != nil {
			done <- result{err: fmt.Errorf("entering namespace %s: %w", ns, err)}
			return
		}
		var r result
		func() {
			defer func() { r.panic = recover() }()
			r.err = f()
		}()
		if err := netns.Set(orig); err != nil {
			// The thread stays locked and dies with this goroutine.
			r.err = errors.Join(r.err, fmt.Errorf("restoring namespace after %s: %w", ns, err))
			done <- r
			return
		}
		runtime.UnlockOSThread()
		done <- r
	}()
	r := <-done
	if r.panic != nil {
		panic(r.panic)
	}
	return r.err
}

// cleanup deletes every namespace created, newest first. Deleting a
// namespace destroys its links, and a veth pair dies with either end, so
// this removes everything New made.
func (tp *Topology) cleanup() {
	tp.mu.Lock()
	created := append([]string(nil), tp.created...)
	tp.created = nil
	tp.mu.Unlock()
	for i := len(created) - 1; i >= 0; i-- {
		ctx, cancel := context.WithTimeout(context.Background(), ExecTimeout)
		_, err := runCmd(ctx, "ip", "netns", "delete", created[i])
		cancel()
		if err != nil {
			tp.tb.Errorf("nstest: deleting namespace %s: %v", created[i], err)
		}
	}
}

func (tp *Topology) addNS(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), ExecTimeout)
	defer cancel()
	if _, err := runCmd(ctx, "ip", "netns", "add", name); err != nil {
		return err
	}
	tp.mu.Lock()
	tp.created = append(tp.created, name)
	tp.mu.Unlock()
	return nil
}

// sysctl is one /proc/sys setting, path relative to /proc/sys.
type sysctl struct{ path, value string }

func writeSysctls(ns string, settings []sysctl) error {
	return doIn(ns, func() error {
		for _, s := range settings {
			p := filepath.Join("/proc/sys", s.path)
			if err := os.WriteFile(p, []byte(s.value+"\n"), 0o644); err != nil {
				return fmt.Errorf("setting %s=%q: %w", s.path, s.value, err)
			}
		}
		return nil
	})
}

// commonSysctls apply in every namespace, before links exist so that the
// "default" values reach every link created later. Reasons are in the
// package documentation.
var commonSysctls = []sysctl{
	{"net/ipv4/conf/all/accept_redirects", "0"},
	{"net/ipv4/conf/default/accept_redirects", "0"},
	{"net/ipv6/conf/all/accept_redirects", "0"},
	{"net/ipv6/conf/default/accept_redirects", "0"},
	{"net/ipv6/conf/all/accept_dad", "0"},
	{"net/ipv6/conf/default/accept_dad", "0"},
	{"net/ipv4/conf/all/rp_filter", "0"},
	{"net/ipv4/conf/default/rp_filter", "0"},
	{"net/ipv4/icmp_ratelimit", "0"},
	{"net/ipv4/icmp_ratemask", "0"},
	{"net/ipv6/icmp/ratelimit", "0"},
	{"net/ipv6/icmp/ratemask", ""},
}

// nodeSysctls apply in the node namespace on top of commonSysctls.
var nodeSysctls = []sysctl{
	{"net/ipv4/ip_forward", "1"},
	{"net/ipv6/conf/all/forwarding", "1"},
	{"net/ipv6/conf/default/forwarding", "1"},
	{"net/ipv4/conf/all/send_redirects", "0"},
	{"net/ipv4/conf/default/send_redirects", "0"},
	{"net/ipv4/conf/all/route_localnet", "1"},
	{"net/ipv4/conf/default/route_localnet", "1"},
}

// routerSysctls make the LAN namespace the nodes' default router, one that
// knows no route beyond the LAN: it answers whatever a node sends it with
// "unreachable" (an IPv6 router with forwarding off would drop silently).
var routerSysctls = []sysctl{
	{"net/ipv4/ip_forward", "1"},
	{"net/ipv6/conf/all/forwarding", "1"},
	{"net/ipv6/conf/default/forwarding", "1"},
	{"net/ipv4/conf/all/send_redirects", "0"},
	{"net/ipv4/conf/default/send_redirects", "0"},
}

// bridgeSysctls exist only with bridge netfilter built in; see the package
// documentation for why they matter. writeBridgeSysctls sets their value.
var bridgeSysctls = []sysctl{
	{"net/bridge/bridge-nf-call-iptables", ""},
	{"net/bridge/bridge-nf-call-ip6tables", ""},
}

// linkSysctls returns the per-link settings for link in a namespace;
// "default" only reaches links created after it was set, and the kernel
// combines "all" and the link's own value for these keys.
func linkSysctls(link string, node bool) []sysctl {
	s := []sysctl{{"net/ipv4/conf/" + link + "/rp_filter", "0"}}
	if node {
		s = append(s,
			sysctl{"net/ipv4/conf/" + link + "/send_redirects", "0"},
			sysctl{"net/ipv4/conf/" + link + "/route_localnet", "1"},
		)
	}
	return s
}

// handle is a netlink handle for one namespace.
type handle struct {
	ns string
	fd netns.NsHandle
	*netlink.Handle
}

func openHandle(ns string) (*handle, error) {
	fd, err := netns.GetFromName(ns)
	if err != nil {
		return nil, fmt.Errorf("opening namespace %s: %w", ns, err)
	}
	h, err := netlink.NewHandleAt(fd, unix.NETLINK_ROUTE)
	if err != nil {
		_ = fd.Close()
		return nil, fmt.Errorf("netlink handle in %s: %w", ns, err)
	}
	return &handle{ns: ns, fd: fd, Handle: h}, nil
}

func (h *handle) close() {
	h.Close()
	_ = h.fd.Close()
}

func (h *handle) link(name string) (netlink.Link, error) {
	l, err := h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("finding %s in %s: %w", name, h.ns, err)
	}
	return l, nil
}

func (h *handle) up(name string) error {
	l, err := h.link(name)
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("setting %s up in %s: %w", name, h.ns, err)
	}
	return nil
}

// addAddrs adds addresses to link; IPv6 ones get IFA_F_NODAD so they are
// usable at once.
func (h *handle) addAddrs(name string, prefixes ...netip.Prefix) error {
	l, err := h.link(name)
	if err != nil {
		return err
	}
	for _, p := range prefixes {
		a := &netlink.Addr{IPNet: &net.IPNet{
			IP:   p.Addr().AsSlice(),
			Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
		}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			return fmt.Errorf("adding %v to %s in %s: %w", p, name, h.ns, err)
		}
	}
	return nil
}

// addDefaultRoutes routes everything via gateways on link.
func (h *handle) addDefaultRoutes(name string, gws ...netip.Addr) error {
	l, err := h.link(name)
	if err != nil {
		return err
	}
	for _, gw := range gws {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("adding default route via %v in %s: %w", gw, h.ns, err)
		}
	}
	return nil
}

// addBridge creates bridge name and brings it up. Multicast snooping is off:
// see the package documentation.
func (h *handle) addBridge(name string) error {
	snooping := false
	if err := h.LinkAdd(&netlink.Bridge{
		LinkAttrs:         netlink.LinkAttrs{Name: name},
		MulticastSnooping: &snooping,
	}); err != nil {
		return fmt.Errorf("creating bridge %s in %s: %w", name, h.ns, err)
	}
	return h.up(name)
}

// addPort creates a veth pair, port here attached to bridge and brought
// up, peerName in peer's namespace (left down, for its owner to address
// first). hairpin lets the port send frames back where they came from.
func (h *handle) addPort(bridge, port string, peer *handle, peerName string, hairpin bool) error {
	if err := h.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: port},
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(peer.fd),
	}); err != nil {
		return fmt.Errorf("creating veth %s in %s to %s: %w", port, h.ns, peer.ns, err)
	}
	br, err := h.link(bridge)
	if err != nil {
		return err
	}
	l, err := h.link(port)
	if err != nil {
		return err
	}
	if err := h.LinkSetMaster(l, br); err != nil {
		return fmt.Errorf("attaching %s to %s in %s: %w", port, bridge, h.ns, err)
	}
	if hairpin {
		if err := h.LinkSetHairpin(l, true); err != nil {
			return fmt.Errorf("setting hairpin on %s in %s: %w", port, h.ns, err)
		}
	}
	return h.up(port)
}

// addRoute routes dst out of link, via the gateway of dst's family among
// gws, or directly (link scope) when gws has none.
func (h *handle) addRoute(link string, dst netip.Prefix, gws ...netip.Addr) error {
	l, err := h.link(link)
	if err != nil {
		return err
	}
	r := &netlink.Route{
		LinkIndex: l.Attrs().Index,
		Dst:       &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
	}
	for _, gw := range gws {
		if gw.Is4() == dst.Addr().Is4() {
			r.Gw = gw.AsSlice()
		}
	}
	if r.Gw == nil && dst.Addr().Is4() {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("adding route to %v in %s: %w", dst, h.ns, err)
	}
	return nil
}

// waitUp waits until each link's operational state is up: only then has the
// kernel's link watcher replaced the "noop" queue discipline that drops
// packets.
func (h *handle) waitUp(deadline time.Time, names ...string) error {
	for _, name := range names {
		for {
			l, err := h.link(name)
			if err != nil {
				return err
			}
			if l.Attrs().OperState == netlink.OperUp {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s in %s still %v after %v", name, h.ns, l.Attrs().OperState, setupTimeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// build creates and wires the namespaces. Each namespace is recorded for
// cleanup as soon as it exists, so a failure part-way leaves nothing behind.
func (tp *Topology) build() error {
	all := append([]string{tp.lanNS, tp.clientNS}, tp.hostNS...)
	for _, n := range tp.nodes {
		all = append(all, n.ns)
	}
	all = append(all, tp.podNS...)
	for _, ns := range all {
		if err := tp.addNS(ns); err != nil {
			return err
		}
		if err := writeSysctls(ns, commonSysctls); err != nil {
			return err
		}
	}
	for _, n := range tp.nodes {
		if err := writeSysctls(n.ns, nodeSysctls); err != nil {
			return err
		}
		if err := writeBridgeSysctls(n.ns, "1"); err != nil {
			return err
		}
	}
	// The LAN bridge only switches: frames between nodes must not meet
	// netfilter (and conntrack) in the LAN namespace too.
	if err := writeBridgeSysctls(tp.lanNS, "0"); err != nil {
		return err
	}
	if err := writeSysctls(tp.lanNS, routerSysctls); err != nil {
		return err
	}

	handles := map[string]*handle{}
	defer func() {
		for _, h := range handles {
			h.close()
		}
	}()
	for _, ns := range all {
		h, err := openHandle(ns)
		if err != nil {
			return err
		}
		handles[ns] = h
		if err := h.up("lo"); err != nil {
			return err
		}
	}
	lan, client := handles[tp.lanNS], handles[tp.clientNS]
	deadline := time.Now().Add(setupTimeout)

	// The LAN: a bridge with a port for the client and one per node.
	if err := lan.addBridge(BridgeLink); err != nil {
		return err
	}
	if err := lan.addAddrs(BridgeLink,
		netip.PrefixFrom(routerIP, extPrefix), netip.PrefixFrom(routerIPv6, extPrefix6)); err != nil {
		return err
	}
	lanPorts := []string{"client"}
	if err := lan.addPort(BridgeLink, "client", client, PodLink, false); err != nil {
		return err
	}
	if err := client.addAddrs(PodLink,
		netip.PrefixFrom(clientIP, extPrefix), netip.PrefixFrom(clientIPv6, extPrefix6)); err != nil {
		return err
	}
	if err := client.up(PodLink); err != nil {
		return err
	}

	for i, ns := range tp.hostNS {
		h := handles[ns]
		port := "host" + strconv.Itoa(i)
		lanPorts = append(lanPorts, port)
		if err := lan.addPort(BridgeLink, port, h, PodLink, false); err != nil {
			return err
		}
		if err := h.addAddrs(PodLink, netip.PrefixFrom(tp.HostIP(i), extPrefix), netip.PrefixFrom(tp.HostIPv6(i), extPrefix6)); err != nil {
			return err
		}
		if err := h.up(PodLink); err != nil {
			return err
		}
	}
	for _, n := range tp.nodes {
		node := handles[n.ns]
		lanPorts = append(lanPorts, lanPortLink(n.index))
		if err := lan.addPort(BridgeLink, lanPortLink(n.index), node, NodeExternalLink, false); err != nil {
			return err
		}
		if err := node.addAddrs(NodeExternalLink,
			netip.PrefixFrom(n.IP(), extPrefix), netip.PrefixFrom(n.IPv6(), extPrefix6)); err != nil {
			return err
		}
		if err := node.up(NodeExternalLink); err != nil {
			return err
		}
		if err := tp.buildPods(n, node, handles); err != nil {
			return err
		}
		if err := tp.buildNodeRoutes(n, node); err != nil {
			return err
		}
		if err := node.addDefaultRoutes(NodeExternalLink, routerIP, routerIPv6); err != nil {
			return err
		}
		// The client reaches node k's external range through node k, as a
		// load balancer or router would send it.
		for _, p := range n.externalRanges() {
			if err := client.addRoute(PodLink, p, n.IP(), n.IPv6()); err != nil {
				return err
			}
		}
	}
	// Everything else (pods, ClusterIPs) through node 0: the client is
	// outside the cluster, and node 0 forwards its traffic like a gateway.
	if err := client.addDefaultRoutes(PodLink, tp.NodeIP(), tp.NodeIPv6()); err != nil {
		return err
	}
	if err := lan.waitUp(deadline, lanPorts...); err != nil {
		return err
	}

	// Per-link settings, now that the links exist.
	for _, n := range tp.nodes {
		nodeLinks := []string{"lo", BridgeLink, NodeExternalLink}
		for j := range n.pods {
			nodeLinks = append(nodeLinks, PodHostLink(j))
		}
		var s []sysctl
		for _, l := range nodeLinks {
			s = append(s, linkSysctls(l, true)...)
		}
		if err := writeSysctls(n.ns, s); err != nil {
			return err
		}
		if err := handles[n.ns].waitUp(deadline, nodeLinks[1:]...); err != nil {
			return err
		}
	}
	for _, ns := range append(append([]string{tp.clientNS}, tp.hostNS...), tp.podNS...) {
		if err := writeSysctls(ns, append(linkSysctls("lo", false), linkSysctls(PodLink, false)...)); err != nil {
			return err
		}
		if err := handles[ns].waitUp(deadline, PodLink); err != nil {
			return err
		}
	}
	return nil
}

// buildPods creates node n's pod bridge and its pods.
func (tp *Topology) buildPods(n *Node, node *handle, handles map[string]*handle) error {
	if err := node.addBridge(BridgeLink); err != nil {
		return err
	}
	if err := node.addAddrs(BridgeLink,
		netip.PrefixFrom(n.BridgeIP(), podPrefix), netip.PrefixFrom(n.BridgeIPv6(), podPrefix6)); err != nil {
		return err
	}
	for j, i := range n.pods {
		pod := handles[tp.podNS[i]]
		if err := node.addPort(BridgeLink, PodHostLink(j), pod, PodLink, true); err != nil {
			return err
		}
		if err := pod.addAddrs(PodLink,
			netip.PrefixFrom(tp.PodIP(i), podPrefix), netip.PrefixFrom(tp.PodIPv6(i), podPrefix6)); err != nil {
			return err
		}
		if err := pod.up(PodLink); err != nil {
			return err
		}
		if err := pod.addDefaultRoutes(PodLink, n.BridgeIP(), n.BridgeIPv6()); err != nil {
			return err
		}
	}
	return nil
}

// buildNodeRoutes routes the ClusterIP ranges out of node n's external
// link (its own connections need a route before OUTPUT DNAT rewrites the
// destination) and the other nodes' pod ranges via those nodes, as a
// routed pod network does.
func (tp *Topology) buildNodeRoutes(n *Node, node *handle) error {
	for _, p := range tp.opts.ServiceCIDRs {
		if err := node.addRoute(NodeExternalLink, p); err != nil {
			return err
		}
	}
	for _, other := range tp.nodes {
		if other == n {
			continue
		}
		for _, p := range other.PodCIDRs() {
			if err := node.addRoute(NodeExternalLink, p, other.IP(), other.IPv6()); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeBridgeSysctls sets bridgeSysctls, failing clearly when the kernel
// lacks bridge netfilter rather than letting service tests through the
// bridge fail later in confusing ways.
func writeBridgeSysctls(ns, value string) error {
	var present []sysctl
	var missing []string
	err := doIn(ns, func() error {
		for _, s := range bridgeSysctls {
			if _, err := os.Stat(filepath.Join("/proc/sys", s.path)); err != nil {
				missing = append(missing, s.path)
				continue
			}
			present = append(present, sysctl{s.path, value})
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("kernel lacks bridge netfilter (%s): bridged replies would bypass conntrack", strings.Join(missing, ", "))
	}
	return writeSysctls(ns, present)
}
