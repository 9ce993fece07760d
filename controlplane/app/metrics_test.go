package app

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/proxyplane/proxyplane/controlplane/certs"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// handled reads grpc_server_handled_total for one method and code.
func handled(t *testing.T, method, code string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.GRPCServer)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "grpc_server_handled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["grpc_method"] == method && labels["grpc_code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestGRPCServerMetricsCountRefusedCalls checks that the server's metrics
// interceptors sit outside authentication: a call without a token is
// counted, with its code.
func TestGRPCServerMetricsCountRefusedCalls(t *testing.T) {
	store := table.NewStore(100)
	sec, caFile, _ := testSecurity(t)
	gs, _ := NewGRPCServer(store, fixedEvents{&pb.ListEventsResponse{}}, NewOptions(), sec, Readiness{Synced: store.Ready(), Certified: sec.Ready}, slog.New(slog.DiscardHandler))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(sec.Limits.Listener(lis)) }()
	t.Cleanup(gs.Stop)

	creds, err := credentials.NewClientTLSFromFile(caFile, certs.ServerName("proxyplane-system"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	before := handled(t, "ListNodes", "Unauthenticated")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pb.NewTableServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListNodes without a token: %v, want Unauthenticated", err)
	}
	if got := handled(t, "ListNodes", "Unauthenticated") - before; got != 1 {
		t.Errorf("grpc_server_handled_total{grpc_method=ListNodes,grpc_code=Unauthenticated} rose by %v, want 1", got)
	}
}
