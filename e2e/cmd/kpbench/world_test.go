package main

import (
	"slices"
	"testing"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// TestSameWorld checks that kube-proxy's objects and proxyplane's table
// describe the same Services.
func TestSameWorld(t *testing.T) {
	for _, tc := range []struct {
		name      string
		i, change int
	}{
		{"first", 0, -1},
		{"last of 10k", 9999, -1},
		{"changed once", 5000, 0},
		{"changed back", 5000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, slice, p := apiService(tc.i), apiSlice(tc.i, tc.change), pbService(tc.i, tc.change)
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
			if !slices.Equal(ppEPs, kpEPs) || len(ppEPs) != endpointsPer {
				t.Errorf("endpoints: proxyplane %v, kube-proxy %v", ppEPs, kpEPs)
			}
		})
	}
	if a, b := endpoints(7, 0)[0], endpoints(7, 1)[0]; a == b {
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
	tbl, err := ppTable(node, 10)
	if err != nil {
		t.Fatal(err)
	}
	next, changed, err := ppChange(tbl, changedService(10), 0)
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
