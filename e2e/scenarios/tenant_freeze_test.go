package scenarios

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// freezeWait bounds the wait for the Service created after the attack:
// the box programs a Service everywhere within about a second, and a
// frozen node never does.
const freezeWait = time.Minute

// testTenantFreeze is the attack of a tenant who may set a Service's
// externalIPs (nothing more than its namespace's Services): an external
// IP equal to a control plane address the agents dial, on its port. Every
// agent refuses a table that captures it (and keeps the last good one),
// so before the control plane dropped the value every node's table froze
// for as long as the Service stood. Now the value is left out of every
// table and reported by ListEvents as InvalidValue; every node goes on
// taking changes (a second Service reaches every node, acknowledged), and
// no agent refuses anything.
func (e *env) testTenantFreeze(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	cp := b.ControlPlanes[0]
	host, _, err := net.SplitHostPort(cp.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	nacks := func() float64 { return agentNACKs(ctx, t, b) }
	nacksBefore := nacks()

	bad := box.NewService("tenant-freeze")
	bad.Spec.ExternalIPs = []string{host}
	for i := range bad.Spec.Ports {
		bad.Spec.Ports[i].Port = int32(cp.GRPCPort)
	}
	later := box.NewService("after-freeze")
	for _, svc := range []string{bad.Name, later.Name} {
		t.Cleanup(func() { deleteService(t, b, svc) })
	}
	if _, _, err := b.CreateService(ctx, bad, podOn(b, 0)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.CreateService(ctx, later, podOn(b, 0)); err != nil {
		t.Fatal(err)
	}

	badKey, laterKey := box.Namespace+"/"+bad.Name, box.Namespace+"/"+later.Name
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, freezeWait)
	defer cancel()
	if _, err := b.WaitProgrammed(wctx, func(_ string, s *pb.Snapshot) error {
		if err := hasEntry(e, laterKey, podOn(b, 0))("", s); err != nil {
			return err
		}
		for _, en := range s.GetEntries() {
			if en.GetKey() != badKey {
				continue
			}
			if ips := en.GetService().GetExternalIps(); len(ips) > 0 {
				return fmt.Errorf("%s still has external IPs %q", badKey, ips)
			}
			return nil
		}
		return fmt.Errorf("no entry %s: the rest of the Service must be proxied", badKey)
	}); err != nil {
		t.Fatalf("a node stopped taking changes after the tenant's Service: %v", err)
	}
	programmed := time.Since(start)

	// Every replica says why the value is gone.
	for _, c := range b.ControlPlanes {
		err := box.Eventually(ctx, func() error {
			conn, err := c.Dial(b.Credentials())
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close() }()
			resp, err := pb.NewTableServiceClient(conn).ListEvents(ctx, &pb.ListEventsRequest{})
			if err != nil {
				return err
			}
			if slices.ContainsFunc(resp.GetEvents(), func(ev *pb.Event) bool {
				return ev.GetName() == bad.Name && ev.GetReason() == "InvalidValue" &&
					strings.Contains(ev.GetMessage(), "is control plane address "+cp.GRPCAddr())
			}) {
				return nil
			}
			return fmt.Errorf("%s reports no InvalidValue event for %s: %v", c.Name(), badKey, resp.GetEvents())
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := nacks() - nacksBefore; n != 0 {
		t.Errorf("agents refused %v tables", n)
	}
	figure(t, "tenant-freeze", "later-service-programmed=%s nodes=%d", ms(programmed), len(b.Agents))
	t.Run("UnlistedAddress", e.testFreezeThroughUnlistedAddress)
}

// agentNACKs sums the tables every agent refused.
func agentNACKs(ctx context.Context, t *testing.T, b *box.Box) float64 {
	t.Helper()
	var sum float64
	for _, a := range b.Agents {
		m, err := a.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sum += m.Value("proxyplane_agent_nacks_total")
	}
	return sum
}

// testFreezeThroughUnlistedAddress is the same attack through an address
// that no Node object lists but the node holds, as a bridge does
// (containerd's cni0 at 10.88.0.1, docker0 at 172.17.0.1): here one added
// to node 0's loopback link. Its agent, restarted so that it says hello
// again, reports it; the replica it is connected to leaves the value out
// of node 0's table, node 0 refuses nothing, and goes on taking changes.
// Only the replica the agent reports to knows the address (docs/
// protocol.md), so the other replicas' tables are not checked.
func (e *env) testFreezeThroughUnlistedAddress(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	nacks := func() float64 { return agentNACKs(ctx, t, b) }
	a0 := b.Agents[0]
	const bridge = "192.0.2.177"
	ip := func(ctx context.Context, args ...string) error {
		out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", a0.Node.NS()}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %v: %w: %s", args, err, out)
		}
		return nil
	}
	if err := ip(ctx, "addr", "add", bridge+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	// Last: the address goes, and the agent says hello without it.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), scenarioTimeout)
		defer cancel()
		if err := ip(ctx, "addr", "del", bridge+"/32", "dev", "lo"); err != nil {
			t.Error(err)
		}
		if err := a0.Restart(ctx); err != nil {
			t.Error(err)
		}
	})
	if err := a0.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	nacksBefore := nacks()

	bad := box.NewService("tenant-freeze-bridge")
	bad.Spec.ExternalIPs = []string{bridge}
	later := box.NewService("after-freeze-bridge")
	for _, svc := range []string{bad.Name, later.Name} {
		t.Cleanup(func() { deleteService(t, b, svc) })
	}
	for _, svc := range []*corev1.Service{bad, later} {
		if _, _, err := b.CreateService(ctx, svc, podOn(b, 0)); err != nil {
			t.Fatal(err)
		}
	}
	node := a0.Node.Name()
	explain := func(c *box.ControlPlane, name string) (*pb.ExplainResponse, error) {
		conn, err := c.Dial(b.Credentials())
		if err != nil {
			return nil, err
		}
		defer func() { _ = conn.Close() }()
		return pb.NewTableServiceClient(conn).Explain(ctx, &pb.ExplainRequest{NodeName: node, Namespace: box.Namespace, Name: name})
	}
	wctx, cancel := context.WithTimeout(ctx, freezeWait)
	defer cancel()
	err := box.Eventually(wctx, func() error {
		for _, c := range b.ControlPlanes {
			x, err := explain(c, later.Name)
			if err != nil || !x.GetConnected() {
				continue
			}
			if !x.GetAcknowledged() {
				return fmt.Errorf("%s has not acknowledged the version holding %s", node, later.Name)
			}
			x, err = explain(c, bad.Name)
			if err != nil {
				return err
			}
			for _, p := range x.GetService().GetPorts() {
				for _, f := range p.GetFamilies() {
					if len(f.GetExternalIps()) > 0 {
						return fmt.Errorf("%s programs %s with external IPs %q", node, bad.Name, f.GetExternalIps())
					}
				}
			}
			return nil
		}
		return fmt.Errorf("no replica has %s connected", node)
	})
	if err != nil {
		t.Fatalf("after a Service took an address of %s that no Node lists: %v", node, err)
	}
	if n := nacks() - nacksBefore; n != 0 {
		t.Errorf("agents refused %v tables", n)
	}
}

// deleteService deletes Service name of box.Namespace and the
// EndpointSlices CreateService made for it.
func deleteService(t *testing.T, b *box.Box, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), scenarioTimeout)
	defer cancel()
	admin := b.Admin()
	if err := admin.CoreV1().Services(box.Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting Service %s: %v", name, err)
	}
	if err := admin.DiscoveryV1().EndpointSlices(box.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + name}); err != nil {
		t.Errorf("deleting the EndpointSlices of %s: %v", name, err)
	}
}
