package app

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"

	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
)

var dualStack = []dataplane.Family{dataplane.IPv4, dataplane.IPv6}

// clock is a fake time for healthHandler.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// get asks srv for path and returns the status and the decoded body.
func get(t *testing.T, srv *httptest.Server, path string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json as kube-proxy's", path, ct)
	}
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// optionsFrom parses args over the defaults, as the binary does.
func optionsFrom(t *testing.T, args ...string) *Options {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

// TestHealthzWithoutControlPlaneUnderShippedDefaults: with the options as
// shipped, hours without any control plane leave /healthz 200 (kube-proxy
// never fails it for the API server's absence, and a timeout would fail
// every node at once); only an operator's --control-plane-timeout fails
// it, and never /livez or /readyz. A fake clock stands for the wait.
func TestHealthzWithoutControlPlaneUnderShippedDefaults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		healthz int
	}{
		{"shipped defaults", nil, 200},
		{"opt-in timeout", []string{"--control-plane-timeout=30m"}, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(1_700_000_000, 0)
			c := &clock{t: start}
			h := newHealth(optionsFrom(t, tc.args...), dualStack, start)
			h.ControlPlane(true, start)
			h.Updated(start, false)
			h.ControlPlane(false, start.Add(time.Minute)) // every replica gone
			srv := httptest.NewServer(healthHandler(h, c.now))
			defer srv.Close()
			for _, after := range []time.Duration{time.Hour, 6 * time.Hour, 7 * 24 * time.Hour} {
				c.t = start.Add(after)
				if code, body := get(t, srv, "/healthz"); code != tc.healthz {
					t.Errorf("/healthz %s after the control plane left: %d %v, want %d", after, code, body, tc.healthz)
				}
				for _, path := range []string{"/livez", "/readyz"} {
					if code, body := get(t, srv, path); code != http.StatusOK {
						t.Errorf("%s %s after the control plane left: %d %v, want 200", path, after, code, body)
					}
				}
			}
		})
	}
}

// TestProbesWhileWaitingForTheFirstTable: an agent without a cache whose
// control plane has not answered for hours is live (a liveness probe must
// not kill it), not ready, and, its node unknown, not eligible (/healthz
// 503 with nodeEligible false, as kube-proxy before it has seen its
// Node). Once a table is programmed all three answer 200.
func TestProbesWhileWaitingForTheFirstTable(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := &clock{t: start.Add(5 * time.Hour)}
	h := newHealth(NewOptions(), dualStack, start)
	srv := httptest.NewServer(healthHandler(h, c.now))
	defer srv.Close()
	for path, want := range map[string]int{"/livez": 200, "/readyz": 503, "/healthz": 503} {
		if code, body := get(t, srv, path); code != want {
			t.Errorf("waiting for a first table: %s %d %v, want %d", path, code, body, want)
		}
	}
	if _, body := get(t, srv, "/healthz"); body["nodeEligible"] != false || body["healthy"] != true {
		t.Errorf("/healthz body %v: want nodeEligible false, healthy (the proxier's health) true", body)
	}
	h.Queued(c.t)
	h.Updated(c.t, false)
	for _, path := range []string{"/livez", "/readyz", "/healthz"} {
		if code, body := get(t, srv, path); code != 200 {
			t.Errorf("holding a table: %s %d %v, want 200", path, code, body)
		}
	}
}

// TestHealthStatusCodesAndCounters checks each probe's code in each state
// and kube-proxy's counters of /healthz and /livez answers.
func TestHealthStatusCodesAndCounters(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name                   string
		h                      func() *agent.Health
		healthz, livez, readyz int
	}{
		{"fresh", func() *agent.Health {
			h := agent.NewHealth(time.Minute, 0, dualStack, start)
			h.Updated(start, false)
			return h
		}, 200, 200, 200},
		{"a change waiting past the timeout", func() *agent.Health {
			h := agent.NewHealth(time.Minute, 0, dualStack, start)
			h.Updated(start, false)
			h.Queued(start.Add(time.Second))
			return h
		}, 503, 503, 503},
		{"node being deleted", func() *agent.Health {
			h := agent.NewHealth(time.Minute, 0, dualStack, start)
			h.Updated(start, true)
			return h
		}, 503, 200, 200},
	} {
		srv := httptest.NewServer(healthHandler(tc.h(), func() time.Time { return start.Add(time.Hour) }))
		for path, want := range map[string]int{"/healthz": tc.healthz, "/livez": tc.livez, "/readyz": tc.readyz} {
			var counter float64
			switch path {
			case "/healthz":
				counter = testutil.ToFloat64(metrics.ProxyHealthzTotal.WithLabelValues(strconv.Itoa(want)))
			case "/livez":
				counter = testutil.ToFloat64(metrics.ProxyLivezTotal.WithLabelValues(strconv.Itoa(want)))
			}
			if code, body := get(t, srv, path); code != want {
				t.Errorf("%s: %s %d %v, want %d", tc.name, path, code, body, want)
			}
			switch path {
			case "/healthz":
				counter = testutil.ToFloat64(metrics.ProxyHealthzTotal.WithLabelValues(strconv.Itoa(want))) - counter
			case "/livez":
				counter = testutil.ToFloat64(metrics.ProxyLivezTotal.WithLabelValues(strconv.Itoa(want))) - counter
			default:
				counter = 1
			}
			if counter != 1 {
				t.Errorf("%s: %s rose kube-proxy's counter of code %d by %v, want 1", tc.name, path, want, counter)
			}
		}
		srv.Close()
	}
}

// upstreamFields are the JSON names of kube-proxy v1.36's ProxyHealth and
// ProxierHealth (pkg/proxy/healthcheck/proxy_health.go); TestHealthBodyIs
// Upstreams reads them from that file too when the module cache holds it.
var upstreamFields = map[string][]string{
	"ProxyHealth":   {"currentTime", "healthy", "lastUpdated", "nodeEligible", "status"},
	"ProxierHealth": {"healthy", "lastUpdated"},
}

// TestHealthBodyIsUpstreams checks the bodies' shape field by field
// against kube-proxy v1.36's: /healthz carries lastUpdated, currentTime,
// nodeEligible, healthy and status per family ("IPv4", "IPv6", each with
// lastUpdated and healthy); /livez the same without nodeEligible. Times
// are RFC 3339, and lastUpdated is the current time while healthy.
func TestHealthBodyIsUpstreams(t *testing.T) {
	if src := upstreamSource(); src != "" {
		got := jsonTags(t, src)
		for typ, want := range upstreamFields {
			if !slices.Equal(got[typ], want) {
				t.Errorf("upstream %s has JSON fields %v; this test (and proxyHealth) has %v", typ, got[typ], want)
			}
		}
	} else {
		t.Log("k8s.io/kubernetes@v1.36.4 is not in the module cache: checking against the names copied from it")
	}
	start := time.Unix(1_700_000_000, 0)
	h := agent.NewHealth(time.Minute, 0, dualStack, start)
	h.ControlPlane(true, start)
	h.Updated(start, false)
	now := start.Add(time.Hour)
	srv := httptest.NewServer(healthHandler(h, func() time.Time { return now }))
	defer srv.Close()
	for path, want := range map[string][]string{
		"/healthz": upstreamFields["ProxyHealth"],
		"/livez":   slices.DeleteFunc(slices.Clone(upstreamFields["ProxyHealth"]), func(s string) bool { return s == "nodeEligible" }),
	} {
		_, body := get(t, srv, path)
		if got := keys(body); !slices.Equal(got, want) {
			t.Errorf("%s fields %v, want kube-proxy's %v", path, got, want)
		}
		status, _ := body["status"].(map[string]any)
		if got := keys(status); !slices.Equal(got, []string{"IPv4", "IPv6"}) {
			t.Errorf("%s status %v, want one entry per family", path, status)
		}
		for f, v := range status {
			fh, _ := v.(map[string]any)
			if got := keys(fh); !slices.Equal(got, upstreamFields["ProxierHealth"]) {
				t.Errorf("%s status %s fields %v, want kube-proxy's %v", path, f, got, upstreamFields["ProxierHealth"])
			}
			if s, _ := fh["lastUpdated"].(string); !parses(s, start) {
				t.Errorf("%s status %s lastUpdated %v, want the family's last sync %v", path, f, fh["lastUpdated"], start)
			}
		}
		for _, field := range []string{"lastUpdated", "currentTime"} {
			if s, _ := body[field].(string); !parses(s, now) {
				t.Errorf("%s %s %q, want %v (kube-proxy's lastUpdated is the current time while healthy)", path, field, s, now)
			}
		}
	}
	// While the control plane is away, /healthz names since when.
	h.ControlPlane(false, start.Add(time.Minute))
	if _, body := get(t, srv, "/healthz"); body["controlPlaneLost"] == nil {
		t.Errorf("/healthz body %v without a control plane: want controlPlaneLost", body)
	}
}

// parses reports whether s is at in RFC 3339, as encoding/json writes a
// time.Time.
func parses(s string, at time.Time) bool {
	got, err := time.Parse(time.RFC3339Nano, s)
	return err == nil && got.Equal(at)
}

// keys returns m's keys, sorted.
func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// upstreamSource returns the path of kube-proxy v1.36.4's proxy_health.go
// in the module cache, or "" when it is not there.
func upstreamSource() string {
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			home, _ := os.UserHomeDir()
			gopath = filepath.Join(home, "go")
		}
		cache = filepath.Join(strings.Split(gopath, string(os.PathListSeparator))[0], "pkg", "mod")
	}
	p := filepath.Join(cache, "k8s.io", "kubernetes@v1.36.4", "pkg", "proxy", "healthcheck", "proxy_health.go")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// jsonTags returns, per struct type of the Go file at path, its fields'
// JSON names, sorted.
func jsonTags(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return true
		}
		for _, field := range st.Fields.List {
			if field.Tag == nil {
				continue
			}
			tag, _ := strconv.Unquote(field.Tag.Value)
			name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
			out[ts.Name.Name] = append(out[ts.Name.Name], name)
		}
		slices.Sort(out[ts.Name.Name])
		return true
	})
	return out
}
