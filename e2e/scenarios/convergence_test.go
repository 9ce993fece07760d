package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// driftWait bounds the wait for a tampered rule to be repaired and
// reported: the agents' periodic full sync, which runs the drift check,
// comes every syncPeriod (30s in deploy/kube-proxy.conf).
const driftWait = 100 * time.Second

// testConvergence moves a Service's endpoint through the API server and
// checks the convergence SLI: every replica lists the change, started at
// its trigger time, with every agent connected to it converged and the
// four quantiles reached, and `controlplane status` shows it at 100%.
// Then it tampers with one node's rules behind its agent's back (as a
// firewall reload or another proxy would) and checks that the repair is
// reported: in ListNodes, in `controlplane status`, and in the agent's
// and the control plane's metrics.
func (e *env) testConvergence(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	svc, _, err := b.CreateService(ctx, box.NewService("converge"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.Admin().CoreV1().Services(box.Namespace).Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	})
	if _, err := b.WaitProgrammed(ctx, hasEntry(e, "e2e/converge", 0)); err != nil {
		t.Fatal(err)
	}
	trigger, err := b.SetEndpoints(ctx, svc, podOn(b, 1))
	if err != nil {
		t.Fatal(err)
	}

	// Each replica measures its own agents; together they count every
	// agent once, all converged.
	var changes map[string]*pb.Convergence
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = box.Eventually(wctx, func() error {
		changes = map[string]*pb.Convergence{}
		nodes := 0
		for _, c := range b.ControlPlanes {
			resp, err := c.ListNodes(wctx)
			if err != nil {
				return err
			}
			for _, ch := range resp.GetConvergence() {
				if ch.GetFromTriggerTime() && ch.GetStartedAt().AsTime().Equal(trigger) &&
					strings.Join(ch.GetServices(), ",") == "e2e/converge" {
					if ch.GetConverged() != ch.GetNodes() || len(ch.GetReached()) != 4 {
						return fmt.Errorf("%s: %d of %d converged, reached %v", c.Name(), ch.GetConverged(), ch.GetNodes(), ch.GetReached())
					}
					changes[c.Name()] = ch
					nodes += int(ch.GetNodes())
				}
			}
		}
		if nodes != len(b.Agents) {
			return fmt.Errorf("the replicas count %d agents for the change, want %d", nodes, len(b.Agents))
		}
		return nil
	})
	cancel()
	if err != nil {
		t.Fatalf("the change of %s: %v", trigger.Format(time.RFC3339Nano), err)
	}
	for name, ch := range changes {
		var qs []string
		for _, r := range ch.GetReached() {
			qs = append(qs, fmt.Sprintf("p%g=%s", r.GetQuantile()*100, ms(r.GetAfter().AsDuration())))
		}
		figure(t, "convergence", "replica=%s nodes=%d %s (trigger time to the share of the replica's agents acknowledging)", name, ch.GetNodes(), strings.Join(qs, " "))
	}
	out := controlplaneStatus(ctx, t, b)
	if !strings.Contains(out, "CONVERGENCE") || !strings.Contains(out, "trigger  e2e/converge") ||
		!strings.Contains(out, fmt.Sprintf("%d/%d", len(b.Agents), len(b.Agents))) {
		t.Errorf("controlplane status does not show the change at 100%%:\n%s", out)
	}

	// Tamper with node-1's rules.
	a := b.Agents[1]
	node := a.Node.Name()
	how := tamper(ctx, t, b, a)
	var drift []*pb.DriftRepair
	wctx, cancel = context.WithTimeout(ctx, driftWait)
	err = box.Eventually(wctx, func() error {
		for _, c := range b.ControlPlanes {
			st, err := c.NodeStatus(wctx, node)
			if err != nil {
				return err
			}
			if st.GetConnected() && len(st.GetDrift()) > 0 {
				drift = st.GetDrift()
				return nil
			}
		}
		return fmt.Errorf("no replica reports drift on %s", node)
	})
	cancel()
	if err != nil {
		t.Fatalf("after %s on %s: %v\n%s", how, node, err, a.LogTail(20))
	}
	figure(t, "drift-reported", "node=%s tamper=%q dataplane=%s family=%s count=%d detail=%q", node, how,
		drift[0].GetDataplane(), drift[0].GetIpFamily(), drift[0].GetCount(), drift[0].GetDetail())
	out = controlplaneStatus(ctx, t, b)
	if !strings.Contains(out, "DRIFT REPAIRED") || !strings.Contains(out, node+"  "+drift[0].GetDataplane()) {
		t.Errorf("controlplane status does not show %s's drift:\n%s", node, out)
	}
	m, err := a.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := m.Sum("proxyplane_agent_drift_repairs_total"); n < 1 {
		t.Errorf("%s: proxyplane_agent_drift_repairs_total = %v, want at least 1", a.Name(), n)
	}
	total := 0.0
	for _, c := range b.ControlPlanes {
		m, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		total += m.Value("proxyplane_controlplane_drift_repairs_total")
	}
	if total < 1 {
		t.Errorf("proxyplane_controlplane_drift_repairs_total over the replicas = %v, want at least 1", total)
	}
}

// tamper changes node's rules behind its agent's back in a way its drift
// check notices, and says how: in nftables mode it adds a chain to the
// agent's table; in iptables mode it flushes nat PREROUTING, as a
// firewall reload does, taking the agent's jump with it.
func tamper(ctx context.Context, t *testing.T, b *box.Box, a *box.Agent) string {
	t.Helper()
	tp := b.Topology()
	ns := a.Node.NS()
	if out, err := tp.ExecContext(ctx, ns, "nft", "list", "table", "ip", "proxyplane"); err == nil && len(out) > 0 {
		if out, err := tp.ExecContext(ctx, ns, "nft", "add", "chain", "ip", "proxyplane", "e2e-tamper"); err != nil {
			t.Fatalf("adding a chain: %v\n%s", err, out)
		}
		return "nft add chain ip proxyplane e2e-tamper"
	}
	for _, bin := range []string{"iptables-nft", "iptables-legacy"} {
		out, err := tp.ExecContext(ctx, ns, bin, "-t", "nat", "-S", "PREROUTING")
		if err != nil || !strings.Contains(string(out), "PP-SERVICES") {
			continue
		}
		if out, err := tp.ExecContext(ctx, ns, bin, "-t", "nat", "-F", "PREROUTING"); err != nil {
			t.Fatalf("flushing PREROUTING: %v\n%s", err, out)
		}
		return bin + " -t nat -F PREROUTING"
	}
	t.Fatalf("%s holds neither an nftables table nor an iptables jump of proxyplane's", a.Node.Name())
	return ""
}

// controlplaneStatus runs `controlplane status` against every replica from host-0,
// with the box's credentials, and returns its output.
func controlplaneStatus(ctx context.Context, t *testing.T, b *box.Box) string {
	t.Helper()
	dir, err := box.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, c := range b.ControlPlanes {
		addrs = append(addrs, c.LocalGRPCAddr())
	}
	args := []string{"status", "--server", strings.Join(addrs, ",")}
	if b.Credentials().Insecure {
		args = append(args, "--insecure")
	} else {
		args = append(args, "--ca-file", b.CAFile(), "--server-name", b.ServerName(), "--token-file", b.DebugTokenFile())
	}
	out, err := b.Topology().ExecContext(ctx, b.HostNS(), filepath.Join(dir, "controlplane"), args...)
	if err != nil {
		t.Fatalf("controlplane %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	// -o json parses: scripts can rely on it.
	jsonOut, err := b.Topology().ExecContext(ctx, b.HostNS(), filepath.Join(dir, "controlplane"), append(args, "-o", "json")...)
	if err != nil {
		t.Fatalf("controlplane status -o json: %v\n%s", err, jsonOut)
	}
	var rep struct {
		Changes []json.RawMessage `json:"changes"`
	}
	if err := json.Unmarshal(jsonOut, &rep); err != nil || len(rep.Changes) == 0 {
		t.Errorf("controlplane status -o json: %v, %d changes\n%s", err, len(rep.Changes), jsonOut)
	}
	t.Logf("controlplane %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}
