package scenarios

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxyplane/proxyplane/e2e/box"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// explained is the part of `controlplane explain -o json` the scenario
// reads.
type explained struct {
	Replica     string `json:"replica"`
	Explanation struct {
		NodeName     string `json:"nodeName"`
		Version      string `json:"version"`
		Acknowledged bool   `json:"acknowledged"`
		Connected    bool   `json:"connected"`
		Service      struct {
			Ports []struct {
				Name     string `json:"name"`
				Families []struct {
					Family  string `json:"family"`
					Cluster struct {
						Used      bool `json:"used"`
						Endpoints []struct {
							IP string `json:"ip"`
						} `json:"endpoints"`
						Topology string `json:"topology"`
					} `json:"cluster"`
					Local struct {
						Used      bool `json:"used"`
						Endpoints []struct {
							IP string `json:"ip"`
						} `json:"endpoints"`
					} `json:"local"`
				} `json:"families"`
			} `json:"ports"`
			Source struct {
				Allowed bool `json:"allowed"`
			} `json:"source"`
		} `json:"service"`
	} `json:"explanation"`
}

// testExplain runs `controlplane explain`, as README.md shows it, from
// the host against every replica, for a Service with internalTrafficPolicy
// Local and an endpoint on each node: for every node, the answer comes
// from the replica its agent is connected to, says that the agent has
// acknowledged the version holding the entry (the version the agent has
// in force), and names the endpoints of that node's table, each node its
// own local one; and for a LoadBalancer Service with zone hints and a
// source range (testExplainZones), each node its own zone's endpoint and
// the client dropped. The same through grpcurl. A node or Service that
// does not exist is NotFound; an agent's token reads its own node only
// (PermissionDenied for another).
func (e *env) testExplain(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	dir, err := box.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "controlplane")

	// One endpoint on every node: its first pod.
	var pods []int
	for _, a := range b.Agents {
		pods = append(pods, a.Node.Pods()[0])
	}
	svc := box.NewService("explain")
	svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	svc, _, err = b.CreateService(ctx, svc, pods...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeService(ctx, t, b, svc) })
	versions, err := b.WaitProgrammed(ctx, func(_ string, s *pb.Snapshot) error {
		for _, e := range s.GetEntries() {
			if e.GetKey() == box.Namespace+"/explain" {
				return nil
			}
		}
		return errors.New("no entry e2e/explain yet")
	})
	if err != nil {
		t.Fatal(err)
	}
	on, _, err := b.Connections(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var servers []string
	for _, c := range b.ControlPlanes {
		servers = append(servers, c.LocalGRPCAddr())
	}
	creds := []string{"--insecure"}
	if !b.Credentials().Insecure {
		creds = []string{"--ca-file", b.CAFile(), "--server-name", b.ServerName(), "--token-file", b.DebugTokenFile()}
	}
	run := func(t *testing.T, wantOK bool, tokenFile string, args ...string) string {
		t.Helper()
		argv := append([]string{"explain", "--server", strings.Join(servers, ",")}, creds...)
		if tokenFile != "" {
			argv = append(argv, "--token-file", tokenFile)
		}
		out, err := b.Topology().Exec(b.HostNS(), bin, append(argv, args...)...)
		if (err == nil) != wantOK {
			t.Fatalf("controlplane %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	for _, a := range b.Agents {
		node := a.Node.Name()
		var x explained
		out := run(t, true, "", "--node", node, "--service", box.Namespace+"/explain", "-o", "json")
		if err := json.Unmarshal([]byte(out), &x); err != nil {
			t.Fatalf("%s: -o json: %v\n%s", node, err, out)
		}
		state, err := a.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c := on[node]; c == nil || x.Replica != c.LocalGRPCAddr() || !x.Explanation.Connected {
			t.Errorf("%s: answered by %s (connected %v), want the replica its agent is connected to", node, x.Replica, x.Explanation.Connected)
		}
		if !x.Explanation.Acknowledged || x.Explanation.Version != versions[node] || x.Explanation.Version != state.Version {
			t.Errorf("%s: version %s acknowledged %v; programmed %s, in force %s", node, x.Explanation.Version, x.Explanation.Acknowledged, versions[node], state.Version)
		}
		// The endpoints explained are the node's table's, and with
		// internalTrafficPolicy Local, the node's own pod's.
		table, err := on[node].Table(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]string{}
		for _, e := range table.GetEntries() {
			if e.GetKey() == box.Namespace+"/explain" {
				for _, pe := range e.GetService().GetLocalEndpoints() {
					for _, ep := range pe.GetEndpoints() {
						want[pe.GetPortName()] = append(want[pe.GetPortName()], ep.GetIp())
					}
				}
			}
		}
		got := map[string][]string{}
		for _, p := range x.Explanation.Service.Ports {
			for _, f := range p.Families {
				if f.Cluster.Used {
					t.Errorf("%s port %s %s: cluster endpoints used under internalTrafficPolicy Local", node, p.Name, f.Family)
				}
				for _, ep := range f.Local.Endpoints {
					got[p.Name] = append(got[p.Name], ep.IP)
				}
			}
		}
		for port := range want {
			slices.Sort(want[port])
			slices.Sort(got[port])
		}
		for port := range got {
			slices.Sort(got[port])
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || len(got["tcp"]) == 0 {
			t.Errorf("%s: local endpoints explained %v, the table has %v", node, got, want)
		}
		if local := b.Topology().PodIP(a.Node.Pods()[0]).String(); !slices.Contains(got["tcp"], local) {
			t.Errorf("%s: local endpoints %v lack its own pod %s", node, got["tcp"], local)
		}
	}

	testExplainZones(ctx, t, b, pods, run)
	// Every node's table changed with the second Service.
	if versions, err = b.WaitProgrammed(ctx, nil); err != nil {
		t.Fatal(err)
	}

	// The human form, as README.md shows it.
	node := b.Agents[0].Node.Name()
	text := run(t, true, "", "--node", node, "--service", box.Namespace+"/explain", "--port", "tcp", "--from", b.Topology().ClientIP().String())
	for _, want := range []string{
		"Service e2e/explain on node " + node,
		"acknowledged  yes, at ",
		"policies      externalTrafficPolicy Cluster, internalTrafficPolicy Local",
		"port tcp TCP ",
		"    cluster endpoints: not used",
		"    local endpoints: " + b.Topology().PodIP(b.Agents[0].Node.Pods()[0]).String() + ":",
		"      why: every ready endpoint on this node (1)",
		"not this one",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("explain output lacks %q:\n%s", want, text)
		}
	}
	t.Logf("controlplane explain --node %s --service e2e/explain --port tcp --from %s:\n%s", node, b.Topology().ClientIP(), text)

	for _, tc := range []struct{ name, node, service, want string }{
		{"unknown node", "node-nope", box.Namespace + "/explain", "NotFound"},
		{"unknown Service", node, box.Namespace + "/nope", "NotFound"},
	} {
		if out := run(t, false, "", "--node", tc.node, "--service", tc.service); !strings.Contains(out, tc.want) || !strings.Contains(out, "nope") {
			t.Errorf("%s: output lacks %q and the name:\n%s", tc.name, tc.want, out)
		}
	}

	// grpcurl, against the replica serving the node.
	if gbin := b.GRPCurl(); gbin == "" {
		t.Log("grpcurl is not built: its part is skipped")
	} else {
		grpcurl := func(args ...string) (string, error) {
			out, err := b.Topology().Exec(b.HostNS(), gbin, append(slices.Clone(b.GRPCurlArgs()), args...)...)
			return string(out), err
		}
		req := func(node, name string) string {
			return fmt.Sprintf(`{"node_name": %q, "namespace": %q, "name": %q, "port": "tcp"}`, node, box.Namespace, name)
		}
		addr := on[node].LocalGRPCAddr()
		out, err := grpcurl("-d", req(node, "explain"), addr, "proxyplane.v1.TableService/Explain")
		if err != nil || !strings.Contains(out, `"acknowledged": true`) || !strings.Contains(out, `"version": "`+versions[node]+`"`) {
			t.Errorf("grpcurl Explain: %v\n%s", err, out)
		}
		out, err = grpcurl("-d", req(node, "nope"), addr, "proxyplane.v1.TableService/Explain")
		if err == nil || !strings.Contains(out, "Code: NotFound") || !strings.Contains(out, "e2e/nope is in no table") {
			t.Errorf("grpcurl Explain of a Service that does not exist: %v\n%s", err, out)
		}
	}
	if b.Credentials().Insecure {
		return
	}

	// An agent's token explains its own node only, as it watches only its
	// own table.
	if len(b.Agents) < 2 {
		t.Fatal("the box has one node: no other node to be refused")
	}
	a0, a1 := b.Agents[0], b.Agents[1]
	run(t, true, a0.TokenFile, "--node", a0.Node.Name(), "--service", box.Namespace+"/explain")
	out := run(t, false, a0.TokenFile, "--node", a1.Node.Name(), "--service", box.Namespace+"/explain")
	if !strings.Contains(out, "PermissionDenied") || !strings.Contains(out, "own node") {
		t.Errorf("an agent token explaining another node: output lacks PermissionDenied and why:\n%s", out)
	}
	// It is refused whether the names exist or not: it learns nothing.
	out = run(t, false, a0.TokenFile, "--node", "node-nope", "--service", box.Namespace+"/nope")
	if !strings.Contains(out, "PermissionDenied") {
		t.Errorf("an agent token explaining a node that does not exist: output lacks PermissionDenied:\n%s", out)
	}
	if gbin := b.GRPCurl(); gbin != "" {
		tok, err := os.ReadFile(a0.TokenFile)
		if err != nil {
			t.Fatal(err)
		}
		bearer := "authorization: Bearer " + strings.TrimSpace(string(tok))
		out, err := b.Topology().Exec(b.HostNS(), gbin, "-cacert", b.CAFile(), "-authority", b.ServerName(), "-H", bearer,
			"-d", fmt.Sprintf(`{"node_name": %q, "namespace": %q, "name": "explain"}`, a1.Node.Name(), box.Namespace),
			on[a1.Node.Name()].LocalGRPCAddr(), "proxyplane.v1.TableService/Explain")
		if err == nil || !strings.Contains(string(out), "Code: PermissionDenied") {
			t.Errorf("grpcurl Explain of another node with an agent token: %v\n%s", err, out)
		}
	}
	figure(t, "explain", "nodes=%d replicas=%d", len(b.Agents), len(b.ControlPlanes))
}

// testExplainZones explains a LoadBalancer Service whose endpoints (one
// per node) carry zone hints, as the EndpointSlice controller writes them
// under trafficDistribution PreferSameZone, and whose source range leaves
// the client out: every node uses its own zone's endpoint by the zone
// rule, and the client is dropped at the load balancer IP.
func testExplainZones(ctx context.Context, t *testing.T, b *box.Box, pods []int, run func(*testing.T, bool, string, ...string) string) {
	t.Helper()
	admin := b.Admin()
	svc := box.NewService("explain-zones")
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
	svc.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameZone)
	svc, err := admin.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: box.FieldManager})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeService(ctx, t, b, svc) })
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.77"}}
	if _, err := admin.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{FieldManager: box.FieldManager}); err != nil {
		t.Fatal(err)
	}
	for _, s := range b.EndpointSlices(svc, time.Now(), pods...) {
		for i := range s.Endpoints {
			s.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: *s.Endpoints[i].Zone}}}
		}
		if _, err := admin.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: box.FieldManager}); err != nil {
			t.Fatal(err)
		}
	}
	key := box.Namespace + "/explain-zones"
	if _, err := b.WaitProgrammed(ctx, func(_ string, s *pb.Snapshot) error {
		for _, e := range s.GetEntries() {
			if e.GetKey() == key && len(e.GetService().GetLoadBalancerIps()) > 0 {
				return nil
			}
		}
		return errors.New("no entry e2e/explain-zones with its load balancer IP yet")
	}); err != nil {
		t.Fatal(err)
	}
	for _, a := range b.Agents {
		node := a.Node.Name()
		var x explained
		out := run(t, true, "", "--node", node, "--service", key, "--port", "tcp", "--from", b.Topology().ClientIP().String(), "-o", "json")
		if err := json.Unmarshal([]byte(out), &x); err != nil {
			t.Fatalf("%s: -o json: %v\n%s", node, err, out)
		}
		own := b.Topology().PodIP(a.Node.Pods()[0]).String()
		ports := x.Explanation.Service.Ports
		if len(ports) != 1 || len(ports[0].Families) == 0 {
			t.Fatalf("%s: ports explained: %+v", node, ports)
		}
		v4 := ports[0].Families[0].Cluster
		if v4.Topology != "zone" || len(v4.Endpoints) != 1 || v4.Endpoints[0].IP != own {
			t.Errorf("%s: cluster endpoints %v by topology %q, want its own zone's %s by zone hints", node, v4.Endpoints, v4.Topology, own)
		}
		if x.Explanation.Service.Source.Allowed {
			t.Errorf("%s: the client is allowed past 203.0.113.0/24", node)
		}
	}
	node := b.Agents[0].Node.Name()
	text := run(t, true, "", "--node", node, "--service", key, "--port", "tcp", "--from", b.Topology().ClientIP().String())
	for _, want := range []string{
		"type          LoadBalancer",
		"dropped: in no loadBalancerSourceRanges entry",
		"load balancer 192.0.2.77",
		"topology zone: every ready endpoint has zone hints and some name zone " + b.Zone(node),
		"ready, but hinted for zone",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("explain output lacks %q:\n%s", want, text)
		}
	}
	t.Logf("controlplane explain --node %s --service %s --port tcp --from %s:\n%s", node, key, b.Topology().ClientIP(), text)
}

// removeService deletes svc and its EndpointSlices, leaving the box as
// the scenario found it.
func removeService(ctx context.Context, t *testing.T, b *box.Box, svc *corev1.Service) {
	t.Helper()
	// It runs as a cleanup: even after the scenario's deadline.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), scenarioTimeout)
	defer cancel()
	admin := b.Admin()
	if err := admin.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting Service %s: %v", svc.Name, err)
	}
	for _, s := range b.EndpointSlices(svc, time.Time{}) {
		if err := admin.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting EndpointSlice %s: %v", s.Name, err)
		}
	}
}
