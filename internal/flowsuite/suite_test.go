package flowsuite

import (
	"testing"

	"github.com/proxyplane/proxyplane/internal/nstest"
)

// TestPacketFlows runs every flow case against every dataplane: one
// cluster per dataplane, all cases' Services programmed at once, then
// each case's traffic for IPv4 and IPv6.
func TestPacketFlows(t *testing.T) {
	nstest.RequireRoot(t)
	for _, kind := range dataplaneKinds(t) {
		t.Run(kind.name, func(t *testing.T) {
			c := newCluster(t, kind)
			var objs []serviceObjects
			for idx, fc := range flowCases {
				objs = append(objs, fc.objects(c, idx)...)
			}
			c.apply(t, objs...)
			for idx, fc := range flowCases {
				t.Run(fc.name, func(t *testing.T) {
					for _, f := range families {
						t.Run(f.name, func(t *testing.T) { fc.check(&run{t, c, idx, f}) })
					}
					if fc.update == nil {
						return
					}
					c.apply(t, fc.update(c, idx)...)
					for _, f := range families {
						t.Run(f.name+" after the update", func(t *testing.T) { fc.after(&run{t, c, idx, f}) })
					}
				})
			}
		})
	}
}
