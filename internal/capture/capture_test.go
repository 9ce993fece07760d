package capture

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestAddress checks each rule of Address, which the agent's policy and
// the control plane's guard share.
func TestAddress(t *testing.T) {
	cps := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:9640")}
	node := []netip.Addr{netip.MustParseAddr("10.0.1.1")}
	cp, own, other := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.2.1")
	for _, tc := range []struct {
		name  string
		rules Rules
		kind  Kind
		a     netip.Addr
		ports []int32
		want  string // "" for allowed
	}{
		{"cluster IP on a control plane address", Rules{}, ClusterIP, cp, []int32{80}, "cluster IP 10.0.0.1 is control plane address 10.0.0.1:9640"},
		{"external IP on the control plane port", Rules{}, ExternalIP, cp, []int32{80, 9640}, "external IP 10.0.0.1 port 9640 captures control plane address 10.0.0.1:9640"},
		{"external IP on another port", Rules{}, ExternalIP, cp, []int32{30080}, ""},
		{"external IP on another port, bound", Rules{BindsServiceAddresses: true}, LoadBalancerIP, cp, []int32{30080}, "load balancer IP 10.0.0.1 is control plane address"},
		{"cluster IP on the node", Rules{NodeAddressesAnyPort: true}, ClusterIP, own, []int32{30080}, "cluster IP 10.0.1.1 is an address of the node"},
		{"external IP on the node, host port", Rules{}, ExternalIP, own, []int32{30080, 22}, "port 22 is outside the node port range 30000-32767"},
		{"external IP on the node, node port", Rules{}, ExternalIP, own, []int32{30080}, ""},
		{"external IP on the node, other range", Rules{NodePorts: PortRange{Base: 20, Size: 3}}, ExternalIP, own, []int32{22}, ""},
		{"external IP on the node, any port", Rules{NodeAddressesAnyPort: true}, ExternalIP, own, []int32{22}, ""},
		{"another address", Rules{BindsServiceAddresses: true}, ClusterIP, other, []int32{9640}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rules.Address(tc.kind, tc.a, tc.ports, cps, node)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestResolve checks that literal addresses are taken as given and that
// entries that cannot be read are skipped, not fatal.
func TestResolve(t *testing.T) {
	got := Resolve(context.Background(), []string{"10.0.0.1:9640", "[fd00::1]:9650", "no-port", "10.0.0.2:http"}, slog.New(slog.DiscardHandler))
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:9640"), netip.MustParseAddrPort("[fd00::1]:9650")}
	if !slices.Equal(got, want) {
		t.Errorf("Resolve = %v, want %v", got, want)
	}
}

func TestParsePortRange(t *testing.T) {
	if r, err := ParsePortRange(" 30000 - 32767 "); err != nil || r != DefaultNodePortRange || r.String() != "30000-32767" {
		t.Errorf("ParsePortRange = %v, %v", r, err)
	}
	for _, bad := range []string{"", "0-10", "10-5", "1-70000", "a-b"} {
		if _, err := ParsePortRange(bad); err == nil {
			t.Errorf("ParsePortRange(%q): no error", bad)
		}
	}
}
