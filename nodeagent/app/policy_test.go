package app

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

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
