// Package deploy holds no Go code, only tests that keep the manifests,
// the configuration files and grafana-dashboard.json true to what the
// binaries accept and serve.
package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	cpmetrics "github.com/proxyplane/proxyplane/controlplane/metrics"
	agentmetrics "github.com/proxyplane/proxyplane/nodeagent/metrics"
)

// collected is a prometheus.Registerer that keeps the collectors
// registered on it, so that their descriptions can be read without
// observations (an empty vector gathers nothing).
type collected struct{ cs []prometheus.Collector }

func (c *collected) Register(x prometheus.Collector) error   { c.cs = append(c.cs, x); return nil }
func (c *collected) MustRegister(xs ...prometheus.Collector) { c.cs = append(c.cs, xs...) }
func (c *collected) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// served returns the name of every metric family the binaries serve: what
// their Run functions register (the Go and process collectors, and each
// binary's metrics.Register; the agent's in every mode).
func served(t *testing.T) map[string]bool {
	t.Helper()
	r := &collected{}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cpmetrics.Register(r)
	for _, mode := range agentmetrics.Modes {
		agentmetrics.Register(r, mode)
	}
	names := map[string]bool{}
	for _, c := range r.cs {
		ch := make(chan *prometheus.Desc, 1024)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names: %v", len(names), names)
	}
	return names
}

// PromQL's parts that are not metric names.
var (
	// noise is label matchers, range selectors, strings and grouping
	// clauses.
	noise = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]|"[^"]*"|\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	ident = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*\s*\(?`)
)

var keywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "le": true, "inf": true, "nan": true}

// metricNames returns the metric names expr selects: identifiers that are
// not functions, aggregations, keywords, labels or Grafana variables.
func metricNames(expr string) []string {
	var out []string
	s := noise.ReplaceAllString(expr, " ")
	for _, m := range ident.FindAllStringIndex(s, -1) {
		tok := s[m[0]:m[1]]
		if strings.HasSuffix(tok, "(") {
			continue // a function or an aggregation
		}
		if m[0] > 0 && s[m[0]-1] == '$' {
			continue // a Grafana variable
		}
		if name := strings.TrimSpace(tok); !keywords[strings.ToLower(name)] {
			out = append(out, name)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (le, ip_family) (rate(kubeproxy_x_bucket{job=~"$agent_job"}[$__rate_interval]))) - on (instance) b_total or time()`)
	if want := []string{"kubeproxy_x_bucket", "b_total"}; !slices.Equal(got, want) {
		t.Errorf("metricNames = %v, want %v", got, want)
	}
}

// TestDashboardQueriesServedMetrics fails when the dashboard queries a
// metric neither binary serves: a misspelt or renamed name.
func TestDashboardQueriesServedMetrics(t *testing.T) {
	raw, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	names := served(t)
	known := func(n string) bool {
		if names[n] {
			return true
		}
		// A histogram's series.
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(n, suffix); ok && names[base] {
				return true
			}
		}
		return false
	}
	check := func(where, expr string) int {
		found := metricNames(expr)
		for _, n := range found {
			if !known(n) {
				t.Errorf("%s queries %s, which neither binary serves (expr %s)", where, n, expr)
			}
		}
		return len(found)
	}
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has a target without expr", p.Title)
			}
			queried += check("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
			metric, _, _ := strings.Cut(q, ",")
			queried += check("variable "+v.Name, metric)
		}
	}
	if queried < 30 {
		t.Errorf("the dashboard queries only %d metrics; is the JSON what this test expects?", queried)
	}
}
