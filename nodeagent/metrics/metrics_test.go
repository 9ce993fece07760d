package metrics

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/xtables"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

func count(t *testing.T, o prometheus.Observer) uint64 {
	t.Helper()
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func TestObserveSync(t *testing.T) {
	restoreErr := &xtables.RestoreError{Line: 3, Err: errors.New("exit status 1")}
	for _, tc := range []struct {
		name string
		res  dataplane.SyncResult
		// what must rise by one, read for the result's family
		want []prometheus.Collector
		// what must not move
		not []prometheus.Collector
	}{
		{
			"iptables partial ok",
			dataplane.SyncResult{Mode: "iptables", Family: dataplane.IPv6},
			nil,
			[]prometheus.Collector{IPTablesRestoreFailuresTotal, IPTablesPartialRestoreFailuresTotal},
		},
		{
			"iptables partial restore failure",
			dataplane.SyncResult{Mode: "iptables", Family: dataplane.IPv4, Err: restoreErr},
			[]prometheus.Collector{IPTablesRestoreFailuresTotal, IPTablesPartialRestoreFailuresTotal},
			nil,
		},
		{
			"iptables full restore failure",
			dataplane.SyncResult{Mode: "iptables", Family: dataplane.IPv4, Full: true, Err: restoreErr},
			[]prometheus.Collector{IPTablesRestoreFailuresTotal},
			[]prometheus.Collector{IPTablesPartialRestoreFailuresTotal},
		},
		{
			"ipvs restore failure",
			dataplane.SyncResult{Mode: "ipvs", Family: dataplane.IPv6, Full: true, Err: restoreErr},
			[]prometheus.Collector{IPTablesRestoreFailuresTotal},
			[]prometheus.Collector{IPTablesPartialRestoreFailuresTotal},
		},
		{
			"nftables failure",
			dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv6, Err: errors.New("EBUSY")},
			[]prometheus.Collector{NFTablesSyncFailuresTotal},
			[]prometheus.Collector{IPTablesRestoreFailuresTotal},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fam := tc.res.Family.String()
			read := func(c prometheus.Collector) float64 {
				return testutil.ToFloat64(c.(*prometheus.CounterVec).WithLabelValues(fam))
			}
			before := map[prometheus.Collector]float64{}
			for _, c := range slices.Concat(tc.want, tc.not) {
				before[c] = read(c)
			}
			durations := count(t, SyncProxyRulesDuration.WithLabelValues(fam))
			SyncProxyRulesLastTimestamp.WithLabelValues(fam).Set(0)
			tc.res.Took = 5 * time.Millisecond
			ObserveSync(tc.res)
			for _, c := range tc.want {
				if got := read(c) - before[c]; got != 1 {
					t.Errorf("%v{ip_family=%s} rose by %v, want 1", c, fam, got)
				}
			}
			for _, c := range tc.not {
				if got := read(c) - before[c]; got != 0 {
					t.Errorf("%v{ip_family=%s} rose by %v, want 0", c, fam, got)
				}
			}
			if got := count(t, SyncProxyRulesDuration.WithLabelValues(fam)) - durations; got != 1 {
				t.Errorf("sync_proxy_rules_duration_seconds{ip_family=%s}: %d observations, want 1", fam, got)
			}
			ts := testutil.ToFloat64(SyncProxyRulesLastTimestamp.WithLabelValues(fam))
			if (tc.res.Err == nil) != (ts != 0) {
				t.Errorf("last_timestamp_seconds = %v after a sync with error %v", ts, tc.res.Err)
			}
		})
	}
}

func TestObserveSyncFullOrPartial(t *testing.T) {
	full, partial := count(t, SyncFullProxyRulesDuration.WithLabelValues("IPv4")), count(t, SyncPartialProxyRulesDuration.WithLabelValues("IPv4"))
	ObserveSync(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv4, Full: true})
	ObserveSync(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv4})
	ObserveSync(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv4})
	if got := count(t, SyncFullProxyRulesDuration.WithLabelValues("IPv4")) - full; got != 1 {
		t.Errorf("full syncs observed %d, want 1", got)
	}
	if got := count(t, SyncPartialProxyRulesDuration.WithLabelValues("IPv4")) - partial; got != 2 {
		t.Errorf("partial syncs observed %d, want 2", got)
	}
}

func TestObserveSyncIPTablesRules(t *testing.T) {
	partial := []dataplane.TableRules{{Table: "nat", Total: 120, Written: 7}, {Table: "filter", Total: 5, Written: 0}}
	ObserveSync(dataplane.SyncResult{Mode: "iptables", Family: dataplane.IPv6, Rules: partial})
	// A failed sync still reports what it rendered, as kube-proxy.
	failed := []dataplane.TableRules{{Table: "nat", Total: 90, Written: 90}}
	ObserveSync(dataplane.SyncResult{Mode: "iptables", Family: dataplane.IPv4, Full: true, Err: errors.New("x"), Rules: failed})
	// Other modes do not count rules.
	ipvs := []dataplane.TableRules{{Table: "filter", Total: 1, Written: 1}}
	ObserveSync(dataplane.SyncResult{Mode: "ipvs", Family: dataplane.IPv4, Rules: ipvs})
	for _, c := range []struct {
		vec        *prometheus.GaugeVec
		table, fam string
		want       float64
	}{
		{IPTablesRulesTotal, "nat", "IPv6", 120},
		{IPTablesRulesLastSync, "nat", "IPv6", 7},
		{IPTablesRulesTotal, "filter", "IPv6", 5},
		{IPTablesRulesLastSync, "filter", "IPv6", 0},
		{IPTablesRulesTotal, "nat", "IPv4", 90},
		{IPTablesRulesLastSync, "nat", "IPv4", 90},
	} {
		if got := testutil.ToFloat64(c.vec.WithLabelValues(c.table, c.fam)); got != c.want {
			t.Errorf("%v{table=%s,ip_family=%s} = %v, want %v", c.vec, c.table, c.fam, got, c.want)
		}
	}
	if IPTablesRulesTotal.DeleteLabelValues("filter", "IPv4") || IPTablesRulesLastSync.DeleteLabelValues("filter", "IPv4") {
		t.Error("an ipvs sync set the iptables rule counts")
	}
}

func svc(name string, itp, etp pb.TrafficPolicy, nodePort int32, clusterIPs []string, hasEndpoints bool, local ...string) *pb.ServiceEntry {
	s := &pb.Service{
		Namespace: "ns", Name: name, ClusterIps: clusterIPs,
		InternalTrafficPolicy: itp, ExternalTrafficPolicy: etp,
		Ports: []*pb.ServicePort{{Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80, NodePort: nodePort, HasEndpoints: hasEndpoints}},
	}
	var cluster []*pb.Endpoint
	for _, ip := range []string{"10.1.0.9", "fd00::9"} {
		cluster = append(cluster, &pb.Endpoint{Ip: ip, Port: 80, Ready: true})
	}
	if hasEndpoints {
		s.ClusterEndpoints = []*pb.PortEndpoints{{Endpoints: cluster}}
	}
	if len(local) > 0 {
		pe := &pb.PortEndpoints{}
		for _, ip := range local {
			pe.Endpoints = append(pe.Endpoints, &pb.Endpoint{Ip: ip, Port: 80, Ready: true})
		}
		s.LocalEndpoints = []*pb.PortEndpoints{pe}
	}
	return &pb.ServiceEntry{Key: "ns/" + name, Hash: uint64(len(name)), Service: s}
}

func TestNoLocalEndpoints(t *testing.T) {
	const (
		cluster = pb.TrafficPolicy_TRAFFIC_POLICY_CLUSTER
		local   = pb.TrafficPolicy_TRAFFIC_POLICY_LOCAL
	)
	dual := []string{"10.96.0.1", "fd00:96::1"}
	v4 := []string{"10.96.0.2"}
	entries := []*pb.ServiceEntry{
		svc("itp-none-dual", local, cluster, 0, dual, true),                 // internal: both families
		svc("itp-has-local", local, cluster, 0, v4, true, "10.1.0.1"),       // has a local endpoint
		svc("etp-none", cluster, local, 30080, v4, true),                    // external IPv4
		svc("etp-no-endpoints-at-all", cluster, local, 30081, v4, false),    // REJECT, not counted
		svc("etp-clusterip-only", cluster, local, 0, v4, true),              // not external: not counted
		svc("both-none", local, local, 30082, []string{"fd00:96::3"}, true), // internal and external IPv6
	}
	tb, err := proxytable.FromSnapshot(&pb.Snapshot{Version: "0000000000000054", Node: &pb.NodeInfo{Name: "n"}, Entries: entries})
	if err != nil {
		t.Fatal(err)
	}
	n := NewNoLocalEndpoints([]dataplane.Family{dataplane.IPv4, dataplane.IPv6})
	n.Observe(tb)
	want := map[[2]string]float64{
		{"internal", "IPv4"}: 1, {"external", "IPv4"}: 1,
		{"internal", "IPv6"}: 2, {"external", "IPv6"}: 1,
	}
	check := func() {
		t.Helper()
		for k, w := range want {
			if got := testutil.ToFloat64(SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues(k[0], k[1])); got != w {
				t.Errorf("no_local_endpoints_total{traffic_policy=%s,ip_family=%s} = %v, want %v", k[0], k[1], got, w)
			}
		}
	}
	check()
	// A later table without the dual-stack Service: its counts go, the
	// unchanged entries are not planned again but still count.
	delete(tb.Entries, "ns/itp-none-dual")
	n.Observe(tb)
	want[[2]string{"internal", "IPv4"}], want[[2]string{"internal", "IPv6"}] = 0, 1
	check()
}

func names(t *testing.T, mode string) []string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	Register(reg, mode)
	// Vectors without a child are not gathered: give each one.
	ObserveSync(dataplane.SyncResult{Mode: mode, Family: dataplane.IPv4, Err: &xtables.RestoreError{Err: errors.New("x")}})
	ObserveSync(dataplane.SyncResult{Mode: mode, Family: dataplane.IPv4, Full: true, Rules: []dataplane.TableRules{{Table: "nat"}}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		out = append(out, mf.GetName())
	}
	return out
}

func TestRegisterByMode(t *testing.T) {
	for mode, want := range map[string][2][]string{
		"iptables": {{"kubeproxy_sync_full_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last"}, {"kubeproxy_sync_proxy_rules_nftables_sync_failures_total"}},
		"ipvs":     {{"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "kubeproxy_sync_proxy_rules_duration_seconds"}, {"kubeproxy_sync_full_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last"}},
		"nftables": {{"kubeproxy_sync_partial_proxy_rules_duration_seconds", "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"}, {"kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last"}},
	} {
		got := names(t, mode)
		for _, n := range want[0] {
			if !slices.Contains(got, n) {
				t.Errorf("%s mode does not serve %s", mode, n)
			}
		}
		for _, n := range want[1] {
			if slices.Contains(got, n) {
				t.Errorf("%s mode serves %s, which kube-proxy serves in other modes only", mode, n)
			}
		}
	}
}
