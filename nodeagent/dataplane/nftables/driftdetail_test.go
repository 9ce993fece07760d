package nftables

import (
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

// TestDriftDetail checks that a sync that found drift says what changed,
// for the report the agent sends its control plane.
func TestDriftDetail(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func(t **fakeTable)
		want   string
	}{
		{"table deleted", tamperings[0].change, "IPv4 table proxyplane: deleted"},
		{"service chain deleted", tamperings[1].change, "IPv4 table proxyplane: chains deleted " + webServiceChain},
		{"chain added", func(t **fakeTable) { (*t).chains["intruder"] = &fakeChain{} }, "IPv4 table proxyplane: chains added intruder"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newSyncer(t, testConfig(dataplane.IPv4))
			s.mustSync(true, driftServices()...)
			s.k.commitBehind(tt.change)
			s.mustSync(true, driftServices()...)
			if got := s.rec.Last(t); !got.Drifted || got.DriftDetail != tt.want {
				t.Errorf("sync reported Drifted=%v, detail %q; want drift, %q", got.Drifted, got.DriftDetail, tt.want)
			}
		})
	}
}
