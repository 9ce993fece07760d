package scenarios

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyplane/proxyplane/e2e/box"
)

// testGRPCurl drives the live replicas with grpcurl from inside host-0,
// as README.md shows: list and describe through reflection, the health
// service, ListNodes (every node connected to exactly one replica, with
// the version its agent has in force acknowledged), ListEvents, and
// WatchTable's debug stream, bounded by -max-time.
func (e *env) testGRPCurl(t *testing.T) {
	ctx := e.begin(t)
	b := e.b
	web := webService(t, e)
	bin := b.GRPCurl()
	if bin == "" {
		t.Skip("grpcurl is not built: run `make tools`, or `make e2e`")
	}
	// Every call carries the box's credentials, as README.md shows: the
	// published CA bundle, the control plane's name and a token of an
	// identity that may list EndpointSlices.
	auth := b.GRPCurlArgs()
	run := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := b.Topology().Exec(b.HostNS(), bin, append(slices.Clone(auth), args...)...)
		// -max-time ends a stream with DeadlineExceeded and a non-zero
		// status: that is how the watch is meant to end here.
		if err != nil && !strings.Contains(string(out), "DeadlineExceeded") {
			t.Fatalf("grpcurl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	contains := func(t *testing.T, what, out string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", what, w, out)
			}
		}
	}

	connected := map[string]int{}
	for _, c := range b.ControlPlanes {
		addr := c.LocalGRPCAddr()
		contains(t, "list", run(t, addr, "list"), "proxyplane.v1.TableService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection")
		contains(t, "describe", run(t, addr, "describe", "proxyplane.v1.TableService"),
			"rpc Sync ( stream .proxyplane.v1.SyncRequest ) returns ( stream .proxyplane.v1.SyncResponse )",
			"rpc WatchTable", "rpc ListNodes", "rpc ListEvents")
		// The health service follows readiness once a second: a replica
		// just ready may still say NOT_SERVING for that long.
		var health string
		if err := box.Eventually(ctx, func() error {
			health = run(t, addr, "grpc.health.v1.Health/Check")
			if !strings.Contains(health, `"status": "SERVING"`) {
				return errors.New("not serving yet")
			}
			return nil
		}); err != nil {
			t.Errorf("health on %s: %v:\n%s", c.Name(), err, health)
		}
		run(t, addr, "proxyplane.v1.TableService/ListEvents")

		var nodes struct {
			Nodes []struct {
				NodeName     string `json:"nodeName"`
				Known        bool   `json:"known"`
				Connected    bool   `json:"connected"`
				AckedVersion string `json:"ackedVersion"`
			} `json:"nodes"`
		}
		out := run(t, addr, "proxyplane.v1.TableService/ListNodes")
		if err := json.Unmarshal([]byte(out), &nodes); err != nil {
			t.Fatalf("ListNodes on %s: %v:\n%s", c.Name(), err, out)
		}
		if len(nodes.Nodes) != len(b.Agents) {
			t.Errorf("ListNodes on %s lists %d nodes, want %d:\n%s", c.Name(), len(nodes.Nodes), len(b.Agents), out)
		}
		for _, n := range nodes.Nodes {
			if !n.Known {
				t.Errorf("ListNodes on %s: %s not known", c.Name(), n.NodeName)
			}
			if n.Connected {
				connected[n.NodeName]++
			}
		}
	}
	for _, a := range b.Agents {
		if got := connected[a.Node.Name()]; got != 1 {
			t.Errorf("%s is connected to %d replicas, want 1", a.Node.Name(), got)
		}
	}

	// The watch of one node's table: a snapshot naming the Service with
	// its ClusterIP and an endpoint, whose version is what the node's
	// agent has in force.
	a := b.Agents[1]
	out := run(t, "-max-time", "2", "-d", `{"node_name": "`+a.Node.Name()+`"}`, b.ControlPlanes[0].LocalGRPCAddr(), "proxyplane.v1.TableService/WatchTable")
	contains(t, "WatchTable", out, `"key": "e2e/web"`, `"`+web.Spec.ClusterIPs[0]+`"`, `"`+b.Topology().PodIP(0).String()+`"`)
	var first struct {
		Snapshot struct {
			Version string `json:"version"`
		} `json:"snapshot"`
	}
	if end := strings.Index(out, "\n}\n"); end < 0 {
		t.Fatalf("WatchTable output is not a JSON object:\n%s", out)
	} else if err := json.Unmarshal([]byte(out[:end+2]), &first); err != nil {
		t.Fatalf("WatchTable's first message: %v", err)
	}
	state, err := a.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first.Snapshot.Version != state.Version {
		t.Errorf("WatchTable's snapshot is version %q, %s has %q in force", first.Snapshot.Version, a.Name(), state.Version)
	}
	figure(t, "grpcurl", "replicas=%d watched=%s version=%s", len(b.ControlPlanes), a.Node.Name(), first.Snapshot.Version)

	if b.Credentials().Insecure {
		return
	}
	// Without a token the debug calls are refused, while reflection and
	// health stay open; in plaintext nothing answers at all.
	addr := b.ControlPlanes[0].LocalGRPCAddr()
	tlsOnly := []string{"-cacert", b.CAFile(), "-authority", b.ServerName()}
	// The debug identity's token for the API server's own audience, what
	// `kubectl create token` gives without --audience, is refused: no
	// caller hands a replica a token that works against the API server.
	apiToken, err := b.Token(ctx, types.NamespacedName{Namespace: b.Deployment().Namespace, Name: box.DebugServiceAccount}, nil, nil, tokenSeconds)
	if err != nil {
		t.Fatal(err)
	}
	withAPIToken := append(slices.Clone(tlsOnly), "-H", "authorization: Bearer "+apiToken.Status.Token)
	refused := []struct {
		name string
		args []string
		want string
	}{
		{"ListNodes without a token", append(slices.Clone(tlsOnly), addr, "proxyplane.v1.TableService/ListNodes"), "Code: Unauthenticated"},
		{"WatchTable without a token", append(slices.Clone(tlsOnly), "-max-time", "2", "-d", `{"node_name": "node-0"}`, addr, "proxyplane.v1.TableService/WatchTable"), "Code: Unauthenticated"},
		{"ListNodes with a token for the API server", append(slices.Clone(withAPIToken), addr, "proxyplane.v1.TableService/ListNodes"), "Code: Unauthenticated"},
		{"plaintext", []string{"-plaintext", addr, "proxyplane.v1.TableService/ListNodes"}, "Failed to dial target host"},
		{"without the CA bundle", []string{"-authority", b.ServerName(), addr, "proxyplane.v1.TableService/ListNodes"}, "certificate signed by unknown authority"},
		{"without the server name", []string{"-cacert", b.CAFile(), addr, "proxyplane.v1.TableService/ListNodes"}, "doesn't contain any IP SANs"},
	}
	for _, r := range refused {
		out, err := b.Topology().Exec(b.HostNS(), bin, r.args...)
		if err == nil || !strings.Contains(string(out), r.want) {
			t.Errorf("grpcurl %s: err %v, output lacks %q:\n%s", r.name, err, r.want, out)
		}
	}
	for _, open := range [][]string{
		{addr, "list"},
		{addr, "grpc.health.v1.Health/Check"},
	} {
		if out, err := b.Topology().Exec(b.HostNS(), bin, append(slices.Clone(tlsOnly), open...)...); err != nil {
			t.Errorf("grpcurl %s without a token: %v (reflection and health stay open)\n%s", strings.Join(open, " "), err, out)
		}
	}
}
