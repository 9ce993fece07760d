package app

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/proxyplane/proxyplane/nodeagent/agent"
	"github.com/proxyplane/proxyplane/nodeagent/metrics"
)

// proxyHealth is the body of /healthz, /livez and /readyz: kube-proxy
// v1.36's ProxyHealth (pkg/proxy/healthcheck/proxy_health.go), field for
// field, and one field of the agent's own. Probes and scripts parse it.
type proxyHealth struct {
	// LastUpdated is the latest family's last sync; the current time
	// while the answer is 200, as kube-proxy keeps it for older clients.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is on /healthz only, as kube-proxy's.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is whether every family is healthy: kube-proxy's proxier
	// health, which leaves out node eligibility (the status code does
	// not).
	Healthy bool `json:"healthy"`
	// Status is each family's health, keyed "IPv4" and "IPv6".
	Status map[string]proxierHealth `json:"status,omitempty"`
	// ControlPlaneLost is the agent's own: since when no control plane
	// has answered, on /healthz while none does.
	ControlPlaneLost *time.Time `json:"controlPlaneLost,omitempty"`
}

// proxierHealth is kube-proxy's ProxierHealth: one family's.
type proxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// healthHandler serves, on kube-proxy's healthz port, kube-proxy's
// /healthz and /livez with its status codes and body, and /readyz
// (agent.Health says what each means):
//
//   - /livez answers 503 while a family has a change waiting past the
//     timeout, and 200 otherwise, also while no table has arrived yet;
//   - /healthz answers 503 as /livez does, for a node not eligible (being
//     deleted, or not yet named by a table), and, only with
//     --control-plane-timeout above 0, once no control plane has answered
//     for that long;
//   - /readyz answers 200 once a table is in force, while /livez would.
//
// now is time.Now outside tests.
func healthHandler(h *agent.Health, now func() time.Time) http.Handler {
	type endpoint int
	const (
		healthz endpoint = iota
		livez
		readyz
	)
	serve := func(e endpoint) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			now := now()
			st := h.Check(now)
			body := proxyHealth{LastUpdated: st.LastUpdated, CurrentTime: now, Healthy: st.Live, Status: map[string]proxierHealth{}}
			for f, fh := range st.Families {
				body.Status[f.String()] = proxierHealth{LastUpdated: fh.LastUpdated, Healthy: fh.Healthy}
			}
			ok := st.Live
			switch e {
			case healthz:
				ok = st.Healthy
				body.NodeEligible = &st.NodeEligible
				if !st.ControlPlaneLost.IsZero() {
					body.ControlPlaneLost = &st.ControlPlaneLost
				}
			case readyz:
				ok = st.Ready
			}
			code := http.StatusOK
			if ok {
				// As kube-proxy: "lastUpdated" is recent while healthy,
				// the meaning it had in older releases.
				body.LastUpdated = now
			} else {
				code = http.StatusServiceUnavailable
			}
			switch e {
			case healthz:
				metrics.ProxyHealthzTotal.WithLabelValues(strconv.Itoa(code)).Inc()
			case livez:
				metrics.ProxyLivezTotal.WithLabelValues(strconv.Itoa(code)).Inc()
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(code)
			out, _ := json.Marshal(body) // of a struct of times and bools: cannot fail
			_, _ = w.Write(out)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/healthz", serve(healthz))
	mux.Handle("/livez", serve(livez))
	mux.Handle("/readyz", serve(readyz))
	return mux
}
