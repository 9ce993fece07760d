package nftables

import (
	"runtime"
	"testing"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/dptest"
)

// heapAfterGC returns the bytes live on the heap and the bytes allocated
// so far, after a collection.
func heapAfterGC() (live, total uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.TotalAlloc
}

// TestFullSyncEncodingAllocatesOnlyTheBatch bounds what a full sync's
// transaction and its encoding allocate beyond the batch itself, whose
// bytes the kernel needs whole: the operations are generated from the
// state as they are encoded (no list of them, no copies of the shared
// sets' elements), the frequent expressions are written straight into the
// batch (no google/nftables values), and the batch grows by chunks (no
// estimate, no doublings). Before, at 5,000 Services x 50 endpoints, the
// transaction allocated 59 MiB and its encoding 63 MiB for a 23 MiB batch,
// and at 10,000 x 25 130 and 266 MiB for 112 MiB. Both layouts: endpoint
// maps and DNAT cascades.
func TestFullSyncEncodingAllocatesOnlyTheBatch(t *testing.T) {
	for _, w := range []struct{ services, endpoints int }{{500, 50}, {1000, 25}} {
		tbl := dptest.Table(t, &pb.NodeInfo{Name: "n", Hash: 1}, dptest.ScaleServices(w.services, w.endpoints)...)
		st := fullState(tbl, testConfig(dataplane.IPv4))
		_, before := heapAfterGC()
		b, err := encodeBatch(fullTransaction(st, nil, false), dataplane.IPv4, 1)
		if err != nil {
			t.Fatal(err)
		}
		_, after := heapAfterGC()
		// The chunks' spare room (at most chunkRoom each, and the last
		// chunk's), and the index of messages and elements for error
		// reports: a tenth, and two chunks.
		allocated, limit := after-before, uint64(b.size)+uint64(b.size)/10+2*chunkSize
		t.Logf("%d x %d: batch %d bytes in %d chunks, %d allocated", w.services, w.endpoints, b.size, len(b.bufs), allocated)
		if allocated > limit {
			t.Errorf("%d x %d: encoding a %d-byte batch allocated %d bytes, want at most %d", w.services, w.endpoints, b.size, allocated, limit)
		}
	}
}

// TestStateBytesPerEndpoint bounds the state a Dataplane keeps between
// syncs, per endpoint, at 1,000 Services x 50 endpoints (endpoint maps):
// an endpoint map holds addresses, not elements, and the hairpin set's
// counts are keyed without netip.Addr's pointer in a map sized once.
// Before, 237 bytes an endpoint here (66 MiB at 250,000 endpoints); now
// 132 (37 MiB).
func TestStateBytesPerEndpoint(t *testing.T) {
	const services, endpoints = 1000, 50
	tbl := dptest.Table(t, &pb.NodeInfo{Name: "n", Hash: 1}, dptest.ScaleServices(services, endpoints)...)
	cfg := testConfig(dataplane.IPv4)
	p := newParams(&cfg, tbl.Node)
	before, _ := heapAfterGC()
	st := buildState(tbl, &p)
	after, _ := heapAfterGC()
	runtime.KeepAlive(st)
	runtime.KeepAlive(tbl)
	perEndpoint := (after - before) / (services * endpoints)
	t.Logf("state: %d bytes, %d an endpoint", after-before, perEndpoint)
	if perEndpoint > 200 {
		t.Errorf("the state holds %d bytes an endpoint, want at most 200", perEndpoint)
	}
}
