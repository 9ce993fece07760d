package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestClientGoMetrics sends a real request through client-go to a server
// playing the API server and reads client-go's metrics back.
func TestClientGoMetrics(t *testing.T) {
	Register(prometheus.NewRegistry())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`))
	}))
	defer srv.Close()
	host := srv.Listener.Addr().String()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	requests := RESTClientRequestsTotal.WithLabelValues("200", "GET", host)
	before := testutil.ToFloat64(requests)
	latencies := sampleCount(t, RESTClientRequestDuration.WithLabelValues("GET", host))
	if _, err := client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(requests) - before; got != 1 {
		t.Errorf("rest_client_requests_total{code=200,method=GET,host=%s} rose by %v, want 1", host, got)
	}
	if got := sampleCount(t, RESTClientRequestDuration.WithLabelValues("GET", host)) - latencies; got != 1 {
		t.Errorf("rest_client_request_duration_seconds{verb=GET,host=%s}: %d observations, want 1", host, got)
	}
}

func sampleCount(t *testing.T, o prometheus.Observer) uint64 {
	t.Helper()
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
