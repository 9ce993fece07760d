package scenarios

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/proxyplane/proxyplane/e2e/box"
)

// testAPIServerRestart kills the API server (SIGKILL, a crash). While it
// is away, a probe's connections from the client all succeed, both
// replicas keep serving their last tables (WatchTable), and an agent that
// lost its state entirely (a new node, say) gets its whole table from a
// replica and programs it.
// When the API server returns on the same data, a Service created then
// reaches every node: the replicas' informers caught up.
func (e *env) testAPIServerRestart(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	tp := b.Topology()
	web := webService(t, e)
	versions, _ := snapshotState(ctx, t, b)

	probe := b.StartProbe(tp.ClientNS(), box.ClusterAddr(web), probeInterval, probeTimeout, probeMaxDials)
	defer probe.Stop()
	if err := probe.WaitDials(ctx, 5); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	b.APIServer().Kill()
	if b.APIServer().Running() {
		t.Fatal("the API server runs after being killed")
	}
	for _, c := range b.ControlPlanes {
		for _, a := range b.Agents {
			s, err := c.Table(ctx, a.Node.Name())
			if err != nil {
				t.Fatal(err)
			}
			if s.GetVersion() != versions[a.Node.Name()] {
				t.Errorf("%s serves %s's table at %s without the API server, want its last, %s", c.Name(), a.Node.Name(), s.GetVersion(), versions[a.Node.Name()])
			}
		}
	}

	// A node with an empty state directory: the agent holds nothing, so
	// the replica must send its whole table, from memory.
	a := b.Agents[2]
	node := a.Node.Name()
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.ResetState(); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	err := box.Eventually(ctx, func() error {
		s, err := a.State(ctx)
		if err != nil {
			return err
		}
		if s.Version != versions[node] || !s.Connected {
			return fmt.Errorf("%s has %q in force (connected %t), want %s", a.Name(), s.Version, s.Connected, versions[node])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, st, err := b.Connections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st[node].GetBytesSent() == 0 {
		t.Errorf("%s got its table with 0 bytes sent: %v", node, st[node])
	}
	figure(t, "apiserver-down-fresh-agent", "node=%s table-bytes=%d version=%s", node, st[node].GetBytesSent(), versions[node])

	// Held for a number of probe dials, as the control plane outage is.
	if err := probe.WaitDials(ctx, outageDials); err != nil {
		t.Fatal(err)
	}
	restart := time.Now()
	if err := b.APIServer().Restart(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	r := probe.Stop()
	figure(t, "apiserver-outage-probe", "from=client dials=%d failed=%d over=%s", r.Dials, r.Failures, ms(r.Duration))
	if r.Failures != 0 {
		t.Errorf("probe from the client: %d of %d connections failed while the API server was down; first: %v", r.Failures, r.Dials, r.Errors)
	}
	svc, created, err := b.CreateService(ctx, box.NewService("after"), podOn(b, 0), podOn(b, 1))
	if err != nil {
		t.Fatal(err)
	}
	took := make([]time.Duration, tp.Nodes())
	errs := make([]error, tp.Nodes())
	var wg sync.WaitGroup
	for k := range tp.Nodes() {
		wg.Go(func() {
			var at time.Time
			at, errs[k] = b.DialUntil(ctx, tp.PodNS(podOn(b, k)), box.ClusterAddr(svc), "")
			took[k] = at.Sub(created)
		})
	}
	wg.Wait()
	for k, err := range errs {
		if err != nil {
			t.Fatalf("node-%d never reached Service after: %v", k, err)
		}
	}
	if _, err := b.WaitProgrammed(ctx, hasEntry(e, "e2e/after", podOn(b, 0), podOn(b, 1))); err != nil {
		t.Fatal(err)
	}
	figure(t, "apiserver-restart", "down=%s restart-to-ready=%s new-service-to-traffic %s", ms(restart.Sub(down)), ms(back.Sub(restart)), percentiles(took))
}
