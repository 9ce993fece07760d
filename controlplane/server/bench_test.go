package server

// BenchmarkPropagate1000Agents measures end-to-end propagation through the
// real gRPC server: from publishing one endpoint change to every one of
// 1,000 connected agents having applied and acknowledged it. It covers what
// the table benchmarks leave out: stream goroutines, the codec, HTTP/2
// framing, the agents' decoding and the ACK round trip.
//
// The transport is bufconn (in memory), so it shows the control plane's own
// cost, not a network's: over TCP each agent also costs a write, a read
// and grpc-go's per-connection goroutines, which dominate (the fleet
// harness, e2e/cmd/fleet, measures the real binary over TCP). The agents run in the same process and on the same
// CPUs as the server: ms/change includes their decoding too, which on real
// nodes happens elsewhere.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

const (
	benchAgents   = 1000
	benchServices = 1000
	// benchConns is how many client connections carry the agents' streams
	// (round-robin): a few, as agents behind one proxy or a test harness
	// would share them. Real agents each have their own.
	benchConns = 4
	// benchSetupWait bounds the initial snapshots of all agents;
	// benchChangeWait bounds one change's propagation.
	benchSetupWait  = 2 * time.Minute
	benchChangeWait = 60 * time.Second
)

// benchAgent is one simulated node agent. Its goroutine (run) owns the
// stream: it receives, answers keepalives, applies table responses as a
// real agent would (checking that they add up), ACKs them, and reports on
// reached once it has ACKed the version in want.
type benchAgent struct {
	idx    int
	node   *compute.Node
	stream grpc.BidiStreamingClient[pb.SyncRequest, pb.SyncResponse]
	want   atomic.Uint64 // the version the benchmark waits for
}

// benchShared is what all agent goroutines report into. Nothing here calls
// b.Fatal: errors travel on errs to the benchmark goroutine.
type benchShared struct {
	reached   chan int   // an agent's index, once it ACKed its want
	errs      chan error // the first error of each failing agent
	wireBytes atomic.Int64
}

func (a *benchAgent) run(ctx context.Context, sh *benchShared) {
	fail := func(err error) {
		if ctx.Err() == nil { // not the benchmark ending the stream
			select {
			case sh.errs <- fmt.Errorf("%s: %w", a.node.Name, err):
			default:
			}
		}
	}
	var (
		version  uint64
		entries  map[string]uint64
		nodeHash uint64
	)
	for {
		m, err := a.stream.Recv()
		if err != nil {
			fail(fmt.Errorf("recv: %w", err))
			return
		}
		if m.GetKeepalive() != nil {
			if err := a.stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Keepalive{Keepalive: &pb.Keepalive{}}}); err != nil {
				fail(fmt.Errorf("send keepalive: %w", err))
				return
			}
			continue
		}
		sh.wireBytes.Add(int64(proto.Size(m)))

		// Apply, keeping the sum of held hashes, which must equal the
		// version the response announces.
		var announced string
		switch {
		case m.GetSnapshot() != nil:
			s := m.GetSnapshot()
			entries = make(map[string]uint64, len(s.GetEntries()))
			nodeHash = s.GetNode().GetHash()
			version = nodeHash
			for _, e := range s.GetEntries() {
				entries[e.GetKey()] = e.GetHash()
				version += e.GetHash()
			}
			announced = s.GetVersion()
		case m.GetDelta() != nil:
			d := m.GetDelta()
			if entries == nil || d.GetBaseVersion() != compute.FormatVersion(version) {
				fail(fmt.Errorf("delta from %s, but the agent holds %s", d.GetBaseVersion(), compute.FormatVersion(version)))
				return
			}
			if d.GetNode() != nil {
				version += d.GetNode().GetHash() - nodeHash
				nodeHash = d.GetNode().GetHash()
			}
			for _, e := range d.GetUpserts() {
				version += e.GetHash() - entries[e.GetKey()]
				entries[e.GetKey()] = e.GetHash()
			}
			for _, k := range d.GetRemovals() {
				version -= entries[k]
				delete(entries, k)
			}
			announced = d.GetVersion()
		default:
			fail(errors.New("not a table response"))
			return
		}
		if got := compute.FormatVersion(version); got != announced {
			fail(fmt.Errorf("entries add up to %s, response says %s", got, announced))
			return
		}
		ack := &pb.SyncRequest{Kind: &pb.SyncRequest_Ack{Ack: &pb.Ack{Version: announced, Nonce: m.GetNonce()}}}
		if err := a.stream.Send(ack); err != nil {
			fail(fmt.Errorf("send ack: %w", err))
			return
		}
		if version == a.want.Load() {
			select {
			case sh.reached <- a.idx:
			case <-ctx.Done():
				return
			}
		}
	}
}

// awaitAll waits until n agents have reported reaching their want, or fails
// the benchmark (from the benchmark goroutine) on an agent error or after
// limit.
func (sh *benchShared) awaitAll(b *testing.B, n int, limit time.Duration, what string) {
	b.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for got := 0; got < n; {
		select {
		case <-sh.reached:
			got++
		case err := <-sh.errs:
			b.Fatalf("%s: agent failed: %v", what, err)
		case <-timer.C:
			b.Fatalf("%s: only %d of %d agents acknowledged within %s", what, got, n, limit)
		}
	}
}

// BenchmarkPropagate1000Agents: a store with 1,000 Services of 3 endpoints
// and 1,000 agents connected over a few client connections, all holding
// their acknowledged snapshot. Each iteration publishes one endpoint change
// to one Service and waits until all 1,000 agents have ACKed the new
// version. ms/change is that wait; wire-bytes/change sums the encoded size
// of the table responses the agents received for it.
func BenchmarkPropagate1000Agents(b *testing.B) {
	// Registered first, so it runs last: after the agents have stopped
	// (deferred below) and the server and connections have closed (their
	// cleanups), every goroutine this benchmark started must be gone.
	baseline := runtime.NumGoroutine()
	b.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > baseline {
			b.Errorf("%d goroutines still running after the benchmark, %d before it", n, baseline)
		}
	})
	store := table.NewStore(100)
	initial := map[string]*compute.Service{}
	for i := range benchServices {
		name := fmt.Sprintf("svc-%04d", i)
		initial[name] = service(b, name, 3, 1)
	}
	publish(b, store, initial)
	// The changing Service alternates between these two versions, which
	// differ in all three endpoint addresses.
	changed := "svc-0000"
	versions := [2]*compute.Service{initial[changed], service(b, changed, 3, 2)}

	client, _, dial := newTestServer(b, store, Options{})
	clients := []pb.TableServiceClient{client}
	for len(clients) < benchConns {
		clients = append(clients, dial())
	}

	// Every goroutine started here ends before the benchmark returns, even
	// on b.Fatal: cancel ends the streams and wg waits for the agents.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	sh := &benchShared{reached: make(chan int, benchAgents), errs: make(chan error, benchAgents)}
	w := store.Current()
	agents := make([]*benchAgent, benchAgents)
	for i := range agents {
		name := fmt.Sprintf("node-%04d", i)
		stream, err := clients[i%len(clients)].Sync(ctx)
		if err != nil {
			b.Fatalf("opening Sync for %s: %v", name, err)
		}
		a := &benchAgent{idx: i, node: w.Node(name), stream: stream}
		a.want.Store(w.Version(a.node)) // its snapshot
		hello := &pb.Hello{NodeName: name, Capabilities: &pb.Capabilities{Deltas: true, Dataplane: "bench"}}
		if err := stream.Send(&pb.SyncRequest{Kind: &pb.SyncRequest_Hello{Hello: hello}}); err != nil {
			b.Fatalf("hello from %s: %v", name, err)
		}
		agents[i] = a
		wg.Go(func() { a.run(ctx, sh) })
	}
	sh.awaitAll(b, benchAgents, benchSetupWait, "initial snapshots")

	startBytes := sh.wireBytes.Load()
	gen, changes := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		gen ^= 1
		changes++
		old, next := versions[1-gen], versions[gen]
		for _, a := range agents {
			a.want.Add(next.EntryFor(a.node).Hash - old.EntryFor(a.node).Hash)
		}
		publish(b, store, map[string]*compute.Service{changed: next})
		sh.awaitAll(b, benchAgents, benchChangeWait, fmt.Sprintf("change %d", changes))
	}
	b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/change")
	b.ReportMetric(float64(sh.wireBytes.Load()-startBytes)/float64(b.N), "wire-bytes/change")
}
