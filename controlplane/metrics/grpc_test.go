package metrics

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeStream is a grpc.ServerStream whose messages go nowhere; RecvMsg
// ends with io.EOF after recv messages.
type fakeStream struct {
	grpc.ServerStream
	recv int
}

func (s *fakeStream) Context() context.Context { return context.Background() }
func (s *fakeStream) SendMsg(any) error        { return nil }
func (s *fakeStream) RecvMsg(any) error {
	if s.recv == 0 {
		return io.EOF
	}
	s.recv--
	return nil
}

const syncMethod = "/proxyplane.v1.TableService/Sync"

// TestStreamMessagesCounted: a bidi stream's messages, sent and received,
// are counted under the stream's labels (not the EOF that ends it, which
// go-grpc-middleware's provider counted as a message received), and the
// stream under its code.
func TestStreamMessagesCounted(t *testing.T) {
	l := map[string]string{"grpc_type": "bidi_stream", "grpc_service": "proxyplane.v1.TableService", "grpc_method": "Sync"}
	code := map[string]string{"grpc_code": "Unavailable"}
	for k, v := range l {
		code[k] = v
	}
	read := func() map[string]float64 {
		return map[string]float64{
			"started":  value(t, "grpc_server_started_total", l),
			"sent":     value(t, "grpc_server_msg_sent_total", l),
			"received": value(t, "grpc_server_msg_received_total", l),
			"handled":  value(t, "grpc_server_handled_total", code),
		}
	}
	before := read()
	info := &grpc.StreamServerInfo{FullMethod: syncMethod, IsClientStream: true, IsServerStream: true}
	err := GRPCServer.StreamServerInterceptor()(nil, &fakeStream{recv: 3}, info, func(_ any, ss grpc.ServerStream) error {
		for range 5 {
			if err := ss.SendMsg(nil); err != nil {
				return err
			}
		}
		for {
			if err := ss.RecvMsg(nil); err != nil {
				if errors.Is(err, io.EOF) {
					return status.Error(codes.Unavailable, "shutting down")
				}
				return err
			}
		}
	})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("interceptor returned %v, want the handler's Unavailable", err)
	}
	after := read()
	for name, want := range map[string]float64{"started": 1, "sent": 5, "received": 3, "handled": 1} {
		if got := after[name] - before[name]; got != want {
			t.Errorf("%s rose by %v, want %v", name, got, want)
		}
	}
}

// value reads the counter name with labels from GRPCServer; 0 when the
// series does not exist.
func value(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(GRPCServer)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestStreamMessageAllocatesNothing: counting a message of an agent's
// stream allocates nothing (go-grpc-middleware's provider, which this
// replaces, allocated and looked the counter up by its labels on every
// message).
func TestStreamMessageAllocatesNothing(t *testing.T) {
	info := &grpc.StreamServerInfo{FullMethod: syncMethod, IsClientStream: true, IsServerStream: true}
	var sendAllocs, recvAllocs float64
	_ = GRPCServer.StreamServerInterceptor()(nil, &fakeStream{recv: 1 << 30}, info, func(_ any, ss grpc.ServerStream) error {
		sendAllocs = testing.AllocsPerRun(1000, func() { _ = ss.SendMsg(nil) })
		recvAllocs = testing.AllocsPerRun(1000, func() { _ = ss.RecvMsg(nil) })
		return nil
	})
	if sendAllocs != 0 || recvAllocs != 0 {
		t.Errorf("allocations per message: %v sent, %v received; want none", sendAllocs, recvAllocs)
	}
}

// TestUnaryCounted: a unary call counts its request, its response when it
// succeeds, and its code.
func TestUnaryCounted(t *testing.T) {
	m := NewGRPCServerMetrics()
	info := &grpc.UnaryServerInfo{FullMethod: "/proxyplane.v1.TableService/ListNodes"}
	ok := func(context.Context, any) (any, error) { return "fine", nil }
	denied := func(context.Context, any) (any, error) { return nil, status.Error(codes.PermissionDenied, "no") }
	for _, h := range []grpc.UnaryHandler{ok, ok, denied} {
		_, _ = m.UnaryServerInterceptor()(context.Background(), "req", info, h)
	}
	l := []string{"unary", "proxyplane.v1.TableService", "ListNodes"}
	if got := testutil.ToFloat64(m.received.WithLabelValues(l...)); got != 3 {
		t.Errorf("received %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.sent.WithLabelValues(l...)); got != 2 {
		t.Errorf("sent %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.handled.WithLabelValues(append(l, "PermissionDenied")...)); got != 1 {
		t.Errorf("handled PermissionDenied %v, want 1", got)
	}
}

// TestInitializeMetrics: every method's series exist at zero before any
// call.
func TestInitializeMetrics(t *testing.T) {
	m := NewGRPCServerMetrics()
	m.InitializeMetrics(serviceInfo{"proxyplane.v1.TableService": {Methods: []grpc.MethodInfo{
		{Name: "Sync", IsClientStream: true, IsServerStream: true}, {Name: "ListNodes"},
	}}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	for name, want := range map[string]int{"grpc_server_started_total": 2, "grpc_server_msg_sent_total": 2, "grpc_server_msg_received_total": 2} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != want {
			t.Errorf("%s: %d series (%v), want %d", name, n, err, want)
		}
	}
}

type serviceInfo map[string]grpc.ServiceInfo

func (s serviceInfo) GetServiceInfo() map[string]grpc.ServiceInfo { return s }
