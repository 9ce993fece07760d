package main

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestSameWorld checks that kube-proxy's objects and proxyplane's table
// describe the same Services.
func TestSameWorld(t *testing.T) {
	for _, tc := range []struct {
		name           string
		i, per, change int
	}{
		{"first", 0, 3, -1},
		{"last of 10k", 9999, 3, -1},
		{"changed once", 5000, 3, 0},
		{"changed back", 5000, 3, 1},
		{"last of 5k x 50", 4999, 50, -1},
		{"changed, 10k x 25", 5000, 25, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, slice, p := apiService(tc.i), apiSlice(tc.i, tc.per, tc.change), pbService(tc.i, tc.per, tc.change)
			if got, want := p.GetClusterIps(), svc.Spec.ClusterIPs; !slices.Equal(got, want) {
				t.Errorf("cluster IPs: proxyplane %v, kube-proxy %v", got, want)
			}
			if got, want := p.GetPorts()[0].GetNodePort(), svc.Spec.Ports[0].NodePort; got != want {
				t.Errorf("NodePort: proxyplane %d, kube-proxy %d", got, want)
			}
			if p.GetType() != pb.ServiceType_SERVICE_TYPE_NODE_PORT || svc.Spec.Type != "NodePort" {
				t.Errorf("types: proxyplane %v, kube-proxy %v", p.GetType(), svc.Spec.Type)
			}
			var ppEPs, kpEPs []string
			for _, e := range p.GetClusterEndpoints()[0].GetEndpoints() {
				ppEPs = append(ppEPs, e.GetIp())
				if e.GetPort() != *slice.Ports[0].Port {
					t.Errorf("endpoint port: proxyplane %d, kube-proxy %d", e.GetPort(), *slice.Ports[0].Port)
				}
			}
			for _, e := range slice.Endpoints {
				kpEPs = append(kpEPs, e.Addresses...)
			}
			if !slices.Equal(ppEPs, kpEPs) || len(ppEPs) != tc.per {
				t.Errorf("endpoints: proxyplane %v, kube-proxy %v", ppEPs, kpEPs)
			}
		})
	}
	if a, b := endpoints(7, 3, 0)[0], endpoints(7, 3, 1)[0]; a == b {
		t.Errorf("a change back and forth must alternate: %v, %v", a, b)
	}
	if last := clusterIP(49999); !last.IsValid() || last.As4()[1] != 96 {
		t.Errorf("cluster IP %v left 10.96.0.0/16", last)
	}
}

// TestPPChange checks that a changed table still adds up to its version
// and names the changed Service.
func TestPPChange(t *testing.T) {
	node := &pb.NodeInfo{Name: nodeName, Hash: 1}
	tbl, err := ppTable(node, world{Services: 10, Endpoints: 3})
	if err != nil {
		t.Fatal(err)
	}
	next, changed, err := ppChange(tbl, changedService(10), 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{namespace + "/" + serviceName(5)}; !slices.Equal(changed, want) {
		t.Errorf("changed %v, want %v", changed, want)
	}
	if next.Version == tbl.Version {
		t.Error("version did not change")
	}
}

// TestPPAdd checks that a Service added to the table adds up to its
// version, and that adding one already there is refused.
func TestPPAdd(t *testing.T) {
	node := &pb.NodeInfo{Name: nodeName, Hash: 1}
	w := world{Services: 10, Endpoints: 25}
	tbl, err := ppTable(node, w)
	if err != nil {
		t.Fatal(err)
	}
	next, changed, err := ppAdd(tbl, addedService(10), 25)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{namespace + "/" + serviceName(10)}; !slices.Equal(changed, want) || len(next.Entries) != 11 {
		t.Errorf("changed %v, %d entries; want %v, 11", changed, len(next.Entries), want)
	}
	if _, _, err := ppAdd(next, addedService(10), 25); err == nil {
		t.Error("adding a Service already in the table: no error")
	}
}

// TestEndpointHeavyWorld checks that the 250,000 endpoints of the largest
// worlds are distinct, in 10.128.0.0/9 (inside --cluster-cidr), and
// apart from the changed endpoint's addresses.
func TestEndpointHeavyWorld(t *testing.T) {
	for _, w := range []world{{5000, 50}, {10000, 25}} {
		seen := make(map[netip.Addr]bool, w.Services*w.Endpoints)
		in := netip.MustParsePrefix("10.128.0.0/9")
		for i := range w.Services {
			for _, a := range endpoints(i, w.Endpoints, -1) {
				if seen[a] || !in.Contains(a) {
					t.Fatalf("%s: endpoint %v repeated or outside %v", w, a, in)
				}
				seen[a] = true
			}
		}
		if seen[addrAdd(changedEndpoint, 0)] || seen[addrAdd(changedEndpoint, 1)] {
			t.Errorf("%s: the changed endpoint's addresses are in the world", w)
		}
	}
}

func TestWorlds(t *testing.T) {
	o := newOptions()
	o.Sizes, o.Worlds = []int{5000, 1000, 5000}, []string{"5000x50", "10000x25"}
	got, err := o.worlds()
	if err != nil {
		t.Fatal(err)
	}
	want := []world{{1000, 3}, {5000, 3}, {5000, 50}, {10000, 25}}
	if !slices.Equal(got, want) {
		t.Errorf("worlds = %v, want %v", got, want)
	}
	o.Sizes = []int{0}
	if got, _ := o.worlds(); len(got) != 2 {
		t.Errorf("--sizes=0: worlds %v, want only --worlds", got)
	}
	for _, bad := range []string{"5000", "5000x", "x50", "5000*50"} {
		if _, err := parseWorld(bad); err == nil {
			t.Errorf("parseWorld(%q): no error", bad)
		}
	}
	o.Worlds, o.Modes = []string{"5000x2000"}, []string{"ipvs"}
	if err := o.Validate(); err == nil {
		t.Error("2,000 endpoints per Service and mode ipvs: no error")
	}
}

func TestCountRules(t *testing.T) {
	dump := "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.16/32 -j KUBE-SVC-X\n-A KUBE-SVC-X -j KUBE-SEP-Y\nCOMMIT\n"
	if got := countRules(dump); got != 2 {
		t.Errorf("countRules = %d, want 2", got)
	}
}

func TestCountServiceIPs(t *testing.T) {
	listing := `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.16 . tcp . 80 : goto service-AAA-kpbench/svc-0/tcp/http,
			     10.96.0.17 . tcp . 80 : goto service-BBB-kpbench/svc-1/tcp/http }
	}

	map service-nodeports {
		elements = { tcp . 30000 : goto external-AAA-kpbench/svc-0/tcp/http }
	}
}
`
	if got := countServiceIPs(listing); got != 2 {
		t.Errorf("countServiceIPs = %d, want 2", got)
	}
}

func TestMetrics(t *testing.T) {
	page := `# TYPE kubeproxy_sync_full_proxy_rules_duration_seconds histogram
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 61.5
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.08
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_pending 2
`
	m, err := parseMetrics([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	if c, s := m.histogram(mFull, family, ipv4); c != 1 || seconds(s) != 61500*time.Millisecond {
		t.Errorf("IPv4 full: count %d sum %v", c, s)
	}
	if c, _ := m.histogram(mPartial, family, ipv4); c != 0 {
		t.Errorf("absent histogram: count %d", c)
	}
	if v := m.value(mEPPending, "", ""); v != 2 {
		t.Errorf("pending = %v", v)
	}
}

func TestFormat(t *testing.T) {
	for in, want := range map[time.Duration]string{
		61234 * time.Millisecond: "61,234 ms",
		87 * time.Millisecond:    "87 ms",
		0:                        "n/a",
	} {
		if got := ms(in); got != want {
			t.Errorf("ms(%v) = %q, want %q", in, got, want)
		}
	}
}
