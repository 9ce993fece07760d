package compute

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestIndexAllocations bounds what index allocates beyond the entries it
// builds: a Service is held for as long as it is in the world, 10,000 of
// them at once, so a Uniform one (most are) holds nothing but its one
// entry, and one with topology a few slices, no map until a Special node
// asks for its view.
func TestIndexAllocations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		// views are the shared views index builds; extra the allocations
		// allowed beyond them.
		views []class
		extra int
	}{{
		name:   "uniform",
		svc:    newService(),
		slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1", onNode("node-a")), ep("10.0.0.2", onNode("node-b")))},
		views:  []class{{}}, extra: 0,
	}, {
		// The slice of the three zones' names as it grows, the topology,
		// and its zones' entries.
		name: "zone hints",
		svc:  newService(),
		slices: []*discoveryv1.EndpointSlice{httpSlice("web-a",
			ep("10.0.0.1", onNode("node-a"), forZones("zone-a")),
			ep("10.0.0.2", onNode("node-b"), forZones("zone-b")),
			ep("10.0.0.3", onNode("node-c"), forZones("zone-c")))},
		views: []class{{}, {zone: "zone-a"}, {zone: "zone-b"}, {zone: "zone-c"}}, extra: 5,
	}, {
		name:   "eTP Local",
		svc:    nodePortService(withExternalLocal()),
		slices: []*discoveryv1.EndpointSlice{httpSlice("web-a", ep("10.0.0.1", onNode("node-a")), ep("10.0.0.2", onNode("node-b")))},
		views:  []class{{}}, extra: 3,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustBuild(t, tc.svc, tc.slices...)
			var views float64
			for _, c := range tc.views {
				views += testing.AllocsPerRun(20, func() { _ = newPart(s.sharedView(c, nil)) })
			}
			got := testing.AllocsPerRun(20, func() {
				s.others, s.topo = Entry{}, nil
				s.index()
			})
			if limit := views + float64(tc.extra); got > limit {
				t.Errorf("index allocates %.0f times, want at most %.0f (%d views of %.0f allocations, and %d more)",
					got, limit, len(tc.views), views, tc.extra)
			}
		})
	}
}
