package plan_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/plan"
)

func TestPolicyTargets(t *testing.T) {
	for _, tt := range []struct {
		itp, etp                 bool
		wantInternal, wantExtern string
	}{
		{false, false, "SVC", "SVC"},
		{true, false, "SVL", "SVC"},
		{false, true, "SVC", "SVL"},
		{true, true, "SVL", "SVL"},
	} {
		s := &plan.Service{InternalLocal: tt.itp, ExternalLocal: tt.etp}
		if in, ex := plan.PolicyTargets(s, "SVC", "SVL"); in != tt.wantInternal || ex != tt.wantExtern {
			t.Errorf("iTP Local %v, eTP Local %v: PolicyTargets = %s, %s; want %s, %s", tt.itp, tt.etp, in, ex, tt.wantInternal, tt.wantExtern)
		}
	}
}

func TestMapEndpoints(t *testing.T) {
	ep := func(s string) plan.Endpoint {
		ap := netip.MustParseAddrPort(s)
		return plan.Endpoint{Addr: ap.Addr(), Port: int32(ap.Port())}
	}
	p := &plan.Port{
		Cluster: []plan.Endpoint{ep("10.0.0.1:80"), ep("10.0.0.2:80"), ep("10.0.0.1:80")},
		Local:   []plan.Endpoint{ep("10.0.0.2:80"), ep("10.0.0.3:80")},
	}
	calls := 0
	cluster, local, all := plan.MapEndpoints(p, func(e plan.Endpoint) string {
		calls++
		return e.Addr.String()
	})
	if !slices.Equal(cluster, []string{"10.0.0.1", "10.0.0.2", "10.0.0.1"}) || !slices.Equal(local, []string{"10.0.0.2", "10.0.0.3"}) {
		t.Errorf("MapEndpoints sets = %v, %v; want every endpoint of each, in order", cluster, local)
	}
	if !slices.Equal(all, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}) || calls != 3 {
		t.Errorf("MapEndpoints all = %v after %d calls; want each distinct endpoint once", all, calls)
	}
	if c, l, a := plan.MapEndpoints(&plan.Port{}, func(plan.Endpoint) int { return 0 }); len(c)+len(l)+len(a) != 0 {
		t.Errorf("MapEndpoints of no endpoints = %v, %v, %v", c, l, a)
	}
}
