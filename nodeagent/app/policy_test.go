package app

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/proxyplane/proxyplane/internal/capture"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

func TestPolicyFromOptions(t *testing.T) {
	o := NewOptions()
	o.ControlPlanes = []string{"192.0.2.10:9640", "[fd00::10]:9640", "localhost:9641"}
	o.NodePortRange = "30000-40000"
	o.ProxyMode = "ipvs"
	p := o.policy(context.Background(), slog.New(slog.DiscardHandler))
	if p.NodePorts != (proxytable.PortRange{Base: 30000, Size: 10001}) || !p.BindsServiceAddresses || p.NodeAddressesAnyPort {
		t.Errorf("policy %+v", p)
	}
	for _, want := range []string{"192.0.2.10:9640", "[fd00::10]:9640", "127.0.0.1:9641"} {
		if !slices.Contains(p.ControlPlanes, netip.MustParseAddrPort(want)) {
			t.Errorf("control planes %v lack %s", p.ControlPlanes, want)
		}
	}
	if addrs, err := p.NodeAddresses(); err != nil || !slices.Contains(addrs, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("node addresses %v, %v: want the interfaces', loopback among them", addrs, err)
	}
}

func TestNodePortRangeFlag(t *testing.T) {
	o := NewOptions()
	o.ControlPlanes = []string{"192.0.2.10:9640"}
	if o.NodePortRange != "30000-32767" {
		t.Errorf("default --service-node-port-range %q, want the API server's 30000-32767", o.NodePortRange)
	}
	o.NodePortRange = "22-30000x"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--service-node-port-range") {
		t.Errorf("Validate = %v, want an error naming --service-node-port-range", err)
	}
}

// TestGlobalAddrs checks what a hello reports of the node's links: their
// global unicast addresses (a bridge's included), without loopback,
// link-local and the IPVS links' service addresses, sorted, unique and
// bounded as the control plane requires.
func TestGlobalAddrs(t *testing.T) {
	addr := func(s string, link int) netlink.Addr {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			t.Fatal(err)
		}
		a.LinkIndex = link
		return *a
	}
	const lo, eth0, cni0, docker0, ppIPVS, kubeIPVS = 1, 2, 3, 4, 5, 6
	addrs := []netlink.Addr{
		addr("127.0.0.1/8", lo), addr("::1/128", lo),
		addr("192.168.0.21/24", eth0), addr("fe80::1/64", eth0), addr("2001:db8::21/64", eth0),
		addr("10.88.0.1/16", cni0),
		addr("172.17.0.1/16", docker0), addr("10.88.0.1/16", docker0),
		addr("10.96.0.10/32", ppIPVS), addr("203.0.113.7/32", ppIPVS),
		addr("10.96.0.1/32", kubeIPVS),
	}
	got := globalAddrs(nodeAddrs(addrs, []int{ppIPVS, kubeIPVS}), slog.New(slog.DiscardHandler))
	want := []string{"10.88.0.1", "172.17.0.1", "192.168.0.21", "2001:db8::21"}
	if !slices.Equal(got, want) {
		t.Errorf("globalAddrs = %q, want %q", got, want)
	}

	var many []netip.Addr
	for i := range 300 {
		many = append(many, netip.AddrFrom4([4]byte{10, 1, byte(i / 256), byte(i % 256)}))
	}
	if got := globalAddrs(many, slog.New(slog.DiscardHandler)); len(got) != maxReportedAddrs {
		t.Errorf("globalAddrs of 300 addresses reported %d, want %d", len(got), maxReportedAddrs)
	}
}

// TestNodeAddrsLeaveOutIPVSLinks checks that the addresses IPVS binds to its
// links are not the node's: counting them made every cluster IP of the next
// table "an address of the node", and the agent refused it.
func TestNodeAddrsLeaveOutIPVSLinks(t *testing.T) {
	addr := func(s string, link int) netlink.Addr {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			t.Fatal(err)
		}
		a.LinkIndex = link
		return *a
	}
	const eth0, ppIPVS, kubeIPVS = 2, 7, 9
	addrs := []netlink.Addr{
		addr("192.168.0.21/24", eth0), addr("2001:db8::21/64", eth0),
		addr("10.96.0.10/32", ppIPVS), addr("10.96.0.1/32", kubeIPVS),
	}
	got := nodeAddrs(addrs, []int{ppIPVS, kubeIPVS})
	want := []netip.Addr{netip.MustParseAddr("192.168.0.21"), netip.MustParseAddr("2001:db8::21")}
	if !slices.Equal(got, want) {
		t.Fatalf("nodeAddrs = %v, want %v", got, want)
	}
	rules := capture.Rules{BindsServiceAddresses: true}
	if err := rules.Address(capture.ClusterIP, netip.MustParseAddr("10.96.0.10"), []int32{53}, nil, got); err != nil {
		t.Errorf("a cluster IP IPVS has bound is refused: %v", err)
	}
}
