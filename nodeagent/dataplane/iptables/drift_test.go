package iptables

import (
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// TestJumpRepairReportedAsDrift checks that a full sync that found a jump
// gone from a built-in chain, and put it back, is reported as drift (the
// agent tells its control plane), and that ordinary full syncs are not.
func TestJumpRepairReportedAsDrift(t *testing.T) {
	s := newSyncer(t, testConfig(dataplane.IPv4))
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if s.rec.Last(t).Drifted {
		t.Error("the first sync reported drift")
	}
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if s.rec.Last(t).Drifted {
		t.Error("a full sync of an untouched kernel reported drift")
	}
	s.f.kernel.tables["nat"].chains["PREROUTING"] = nil // flushed by someone
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if got := s.rec.Last(t); !got.Drifted || got.DriftDetail != "IPv4: a jump from a built-in chain was gone" {
		t.Errorf("the repairing sync reported Drifted=%v, detail %q; want drift naming the jump", got.Drifted, got.DriftDetail)
	}
	s.mustSync(true, dptest.ClusterIPTwoEndpoints())
	if s.rec.Last(t).Drifted {
		t.Error("the full sync after the repair reported drift")
	}
}
