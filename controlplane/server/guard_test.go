package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/table"
	"github.com/proxyplane/proxyplane/controlplane/watch"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/capture"
)

// entryExternalIPs returns the external IPs of the entry under key in a
// table response; ok is false when the response does not hold it.
func entryExternalIPs(r *pb.SyncResponse, key string) (ips []string, ok bool) {
	entries := slices.Concat(r.GetSnapshot().GetEntries(), r.GetDelta().GetUpserts())
	for _, e := range entries {
		if e.GetKey() == key {
			return e.GetService().GetExternalIps(), true
		}
	}
	return nil, false
}

// TestHelloNodeAddressesGuarded is the tenant freeze through an address
// that no Node object lists: a tenant's Service takes containerd's cni0
// address, 10.88.0.1, as an external IP on port 80. node-1's agent, which
// holds that bridge and would refuse every table carrying it, reports it
// in its hello: its first table already leaves the value out, as an
// InvalidValue event, and node-2, which has no such bridge, keeps being
// served. Hellos reporting malformed addresses are refused.
func TestHelloNodeAddressesGuarded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bridge := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bridge"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			ExternalIPs: []string{"10.88.0.1"},
			Ports:       []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	node := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	store := table.NewStore(100)
	w, err := watch.New(fake.NewClientset(bridge, node("node-1"), node("node-2")), store, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w.SetGuard(nil, capture.PortRange{}, false)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	client, _, _ := newTestServer(t, store, Options{Events: w, NodeAddresses: w.ReportNodeAddresses})

	// node-2 has no bridge: the external IP is its to proxy.
	a2 := connect(t, client, &pb.Hello{NodeName: "node-2"})
	r := a2.recv()
	if ips, _ := entryExternalIPs(r, "default/bridge"); !slices.Equal(ips, []string{"10.88.0.1"}) {
		t.Fatalf("node-2's first table: external IPs %q, want 10.88.0.1", ips)
	}
	a2.ack(r)

	// node-1 reports the bridge: its first table is one it accepts.
	a1 := connect(t, client, &pb.Hello{NodeName: "node-1", NodeAddresses: []string{"10.88.0.1", "192.168.0.21"}})
	r = a1.recv()
	if ips, ok := entryExternalIPs(r, "default/bridge"); !ok || len(ips) != 0 {
		t.Fatalf("node-1's first table: external IPs %q (entry present: %v), want the Service without them", ips, ok)
	}
	a1.ack(r)
	eventually(t, "an InvalidValue event about the bridge address", func() bool {
		ev, err := client.ListEvents(ctx, &pb.ListEventsRequest{})
		return err == nil && slices.ContainsFunc(ev.GetEvents(), func(e *pb.Event) bool {
			return e.GetName() == "bridge" && e.GetReason() == compute.ReasonInvalidValue && strings.Contains(e.GetMessage(), "10.88.0.1")
		})
	})

	// node-2 keeps receiving tables: the Service without the value.
	r = a2.recv()
	if ips, ok := entryExternalIPs(r, "default/bridge"); !ok || len(ips) != 0 {
		t.Fatalf("node-2's next table: external IPs %q (entry present: %v), want the Service without them", ips, ok)
	}
	a2.ack(r)
	eventually(t, "node-2 acknowledging it", func() bool { return nodeStatus(t, client, "node-2").GetAckedVersion() == a2.version })

	// Malformed reports are the agent's error.
	tooMany := make([]string, MaxNodeAddresses+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("10.1.0.%d", i+1)
	}
	for name, addrs := range map[string][]string{
		"too many":      tooMany,
		"not an IP":     {"bridge"},
		"not canonical": {"10.088.0.1"},
		"a zone":        {"fe80::1%eth0"},
		"loopback":      {"127.0.0.1"},
		"4in6":          {"::ffff:10.88.0.1"},
	} {
		a := connect(t, client, &pb.Hello{NodeName: "node-3", NodeAddresses: addrs})
		if err := a.recvErr(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: stream ended with %v, want InvalidArgument", name, err)
		}
		a.close()
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
