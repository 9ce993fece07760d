package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/tablehash"
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
	entry := &pb.ServiceEntry{Key: "default/web", Service: &pb.Service{
		Namespace: "default", Name: "web", ClusterIps: []string{"10.96.0.10"},
		Ports: []*pb.ServicePort{{Name: "http", Protocol: pb.Protocol_PROTOCOL_TCP, Port: 80}},
	}}
	// Real hashes: loading the cache recomputes them.
	node := &pb.NodeInfo{Name: "n"}
	if entry.Hash, err = tablehash.Entry(entry.Key, entry.Service); err != nil {
		t.Fatal(err)
	}
	if node.Hash, err = tablehash.Node(node); err != nil {
		t.Fatal(err)
	}
	table, err := proxytable.FromSnapshot(&pb.Snapshot{Version: fmt.Sprintf("%016x", entry.Hash+node.Hash), Node: node, Entries: []*pb.ServiceEntry{entry}})
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
	for _, want := range []string{"version" + table.Version + ",1services", `"key":"default/web"`, `"10.96.0.10"`} {
		if !strings.Contains(flat, want) {
			t.Errorf("show-cache output lacks %q:\n%s", want, out.String())
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
	srv := httptest.NewServer(metricsHandler(prometheus.NewRegistry(), "nftables", http.NotFoundHandler()))
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
