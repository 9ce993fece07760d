package app

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxyplane/proxyplane/nodeagent/metrics"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/cache"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
	"github.com/proxyplane/proxyplane/nodeagent/proxytable"
)

func TestShowCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "table.db")
	var out bytes.Buffer
	if err := ShowCache(&out, path); err == nil {
		t.Fatalf("no error for a missing cache; printed %q", out.String())
	}

	c, _, err := cache.Open(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	entry := &pb.ServiceEntry{Key: "default/web", Hash: 5, Service: &pb.Service{
		Namespace: "default", Name: "web", ClusterIps: []string{"10.96.0.10"},
		Ports: []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80}},
	}}
	table, err := proxytable.FromSnapshot(&pb.Snapshot{Version: "000000000000000c", Node: &pb.NodeInfo{Name: "n", Hash: 7}, Entries: []*pb.ServiceEntry{entry}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Save(table, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := ShowCache(&out, path); err == nil {
		t.Error("show-cache read a cache the agent holds; want a clear lock error")
	}
	_ = c.Close()

	out.Reset()
	if err := ShowCache(&out, path); err != nil {
		t.Fatal(err)
	}
	// protojson varies its spacing on purpose: compare without spaces.
	flat := strings.Join(strings.Fields(out.String()), "")
	for _, want := range []string{"version000000000000000c,1services", `"key":"default/web"`, `"10.96.0.10"`} {
		if !strings.Contains(flat, want) {
			t.Errorf("show-cache output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestHealthEndpoints(t *testing.T) {
	get := func(h *agent.Health, path string) (int, map[string]any) {
		t.Helper()
		srv := httptest.NewServer(healthHandler(h))
		defer srv.Close()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body
	}
	fresh := agent.NewHealth(time.Hour, time.Hour)
	fresh.Updated(time.Now(), false)
	for _, path := range []string{"/healthz", "/livez"} {
		if code, body := get(fresh, path); code != http.StatusOK || body["currentTime"] == nil || body["lastUpdated"] == nil {
			t.Errorf("%s: %d %v, want 200 with kube-proxy's fields", path, code, body)
		}
	}
	before := testutil.ToFloat64(metrics.ProxyHealthzTotal.WithLabelValues("200"))
	if _, body := get(fresh, "/healthz"); body["nodeEligible"] != true {
		t.Errorf("/healthz body %v, want nodeEligible true", body)
	}
	if got := testutil.ToFloat64(metrics.ProxyHealthzTotal.WithLabelValues("200")) - before; got != 1 {
		t.Errorf("kubeproxy_proxy_healthz_total{code=\"200\"} rose by %v, want 1", got)
	}
	before = testutil.ToFloat64(metrics.ProxyLivezTotal.WithLabelValues("503"))
	if code, _ := get(agent.NewHealth(time.Nanosecond, 0), "/livez"); code != http.StatusServiceUnavailable {
		t.Errorf("stale /livez %d", code)
	}
	if got := testutil.ToFloat64(metrics.ProxyLivezTotal.WithLabelValues("503")) - before; got != 1 {
		t.Errorf("kubeproxy_proxy_livez_total{code=\"503\"} rose by %v, want 1", got)
	}

	for _, tc := range []struct {
		name           string
		h              func() *agent.Health
		healthz, livez int
	}{
		// Pending since creation, long past the timeout.
		{"stale rules", func() *agent.Health { return agent.NewHealth(time.Nanosecond, 0) }, 503, 503},
		{"node being deleted", func() *agent.Health {
			h := agent.NewHealth(time.Hour, 0)
			h.Updated(time.Now(), true)
			return h
		}, 503, 200},
		{"no control plane past the timeout", func() *agent.Health {
			h := agent.NewHealth(time.Hour, time.Nanosecond)
			h.Updated(time.Now(), false)
			return h
		}, 503, 200},
	} {
		if code, _ := get(tc.h(), "/healthz"); code != tc.healthz {
			t.Errorf("%s: /healthz %d, want %d", tc.name, code, tc.healthz)
		}
		if code, _ := get(tc.h(), "/livez"); code != tc.livez {
			t.Errorf("%s: /livez %d, want %d", tc.name, code, tc.livez)
		}
	}
}

// TestIPVSWithoutKernelSupport checks that ipvs mode on a kernel without
// IPVS (this machine's) fails at start, naming the missing feature, before
// touching the cache or the kernel.
func TestIPVSWithoutKernelSupport(t *testing.T) {
	if err := ipvs.CheckKernel(); err == nil {
		t.Skip("this kernel has IPVS; the clear-error path needs one without it")
	}
	o := NewOptions()
	o.ControlPlanes = []string{"127.0.0.1:1"}
	o.ProxyMode = "ipvs"
	o.ClusterCIDRs = []string{"10.244.0.0/16"}
	o.StateDir = t.TempDir()
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	err := Run(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !ipvs.IsIPVSUnavailable(err) || !strings.Contains(err.Error(), "CONFIG_IP_VS") {
		t.Fatalf("Run = %v, want an error naming the missing IPVS kernel support", err)
	}
	if _, statErr := os.Stat(o.CachePath()); !os.IsNotExist(statErr) {
		t.Errorf("the cache was created (%v); a dataplane that cannot start must touch nothing", statErr)
	}
}

func TestMetricsEndpoints(t *testing.T) {
	srv := httptest.NewServer(metricsHandler(prometheus.NewRegistry(), "nftables"))
	defer srv.Close()
	for path, want := range map[string]string{"/proxyMode": "nftables", "/metrics": "", "/nothing": "404"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		switch {
		case want == "404" && resp.StatusCode != http.StatusNotFound:
			t.Errorf("%s: %d, want 404 (only kube-proxy's paths are served)", path, resp.StatusCode)
		case want != "404" && (resp.StatusCode != http.StatusOK || string(body) != want && want != ""):
			t.Errorf("%s: %d %q, want 200 %q", path, resp.StatusCode, body, want)
		}
	}
}
