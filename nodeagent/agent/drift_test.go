package agent

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
)

func TestDriftLog(t *testing.T) {
	l := NewDriftLog()
	report, changed := l.Report()
	if report != nil {
		t.Fatalf("empty log reports %v", report)
	}
	// Syncs without drift, or that failed, repair nothing.
	l.Observe(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv4, Full: true})
	l.Observe(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv4, Drifted: true, Err: errors.New("refused")})
	select {
	case <-changed:
		t.Fatal("a sync that repaired nothing signalled a repair")
	default:
	}
	l.Observe(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv4, Drifted: true, DriftDetail: "first"})
	select {
	case <-changed:
	default:
		t.Fatal("a repair did not close the channel")
	}
	held, _ := l.Report()
	l.Observe(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv4, Drifted: true, DriftDetail: "second"})
	l.Observe(dataplane.SyncResult{Mode: "nftables", Family: dataplane.IPv6, Drifted: true, DriftDetail: strings.Repeat("é", 300)})
	report, _ = l.Report()
	r := report.GetRepairs()
	if len(r) != 2 || r[0].GetIpFamily() != "IPv4" || r[0].GetCount() != 2 || r[0].GetDetail() != "second" ||
		!r[0].GetFirstRepairedAt().AsTime().Equal(held.GetRepairs()[0].GetFirstRepairedAt().AsTime()) || r[1].GetCount() != 1 {
		t.Errorf("report = %v; want IPv4 twice (first time kept, last detail) and IPv6 once", report)
	}
	if d := r[1].GetDetail(); len(d) > maxDriftDetail || !utf8.ValidString(d) {
		t.Errorf("detail of %d bytes (valid UTF-8: %v), want at most %d", len(d), utf8.ValidString(d), maxDriftDetail)
	}
	// A report handed out is never modified.
	if got := held.GetRepairs()[0]; got.GetCount() != 1 || got.GetDetail() != "first" {
		t.Errorf("an earlier report changed: %v", got)
	}
}
