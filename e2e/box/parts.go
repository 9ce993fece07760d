package box

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// ControlPlane is one control plane replica, a process in host-0's
// namespace. Replicas share that namespace (in a cluster each has a node
// of its own), so replica i listens on ports 9640+10i (gRPC) and
// 9641+10i (metrics).
type ControlPlane struct {
	*Process
	// Index is the replica's number, from 0.
	Index int
	// GRPCPort is its port on every address of host-0, MetricsPort on
	// host-0's loopback (plaintext there; HTTPS on any other address).
	GRPCPort, MetricsPort int
	// MetricsHTTPS is set when the replica's metrics port listens beyond
	// loopback, where the control plane serves it over HTTPS only, also
	// on 127.0.0.1; Ready then checks it as the kubelet's probe does.
	MetricsHTTPS bool

	tp *nstest.Topology
	ns string
	ip string
	// creds returns the box's client credentials, read at each dial.
	creds func() ClientCredentials
	// onNode, for a replica that is a pod on a real node
	// (Options.Kubelets), reports whether a Ready pod of the Deployment
	// runs there; its Process is then never started.
	onNode func() bool
	// paced, for such a replica, keeps the box's own calls within the
	// per-address limit deploy/'s replicas run with (the box's process
	// replicas lift it): polled faster, every call would be refused at
	// the handshake, and a wait that needs several calls in a row would
	// never see them all answered.
	paced *rate.Limiter
}

// Running reports whether the replica runs: its process, or on a real
// node a Ready pod.
func (c *ControlPlane) Running() bool {
	if c.onNode != nil {
		return c.onNode()
	}
	return c.Process.Running()
}

// GRPCAddr returns the address agents dial: host-0's LAN address and the
// gRPC port.
func (c *ControlPlane) GRPCAddr() string { return net.JoinHostPort(c.ip, strconv.Itoa(c.GRPCPort)) }

// LocalGRPCAddr returns the gRPC address on host-0's loopback, for tools
// run inside host-0's namespace (grpcurl).
func (c *ControlPlane) LocalGRPCAddr() string { return "127.0.0.1:" + strconv.Itoa(c.GRPCPort) }

// dial opens a client connection to the replica from inside host-0 with
// the box's credentials. Each caller gets its own connection and closes
// it: a shared one would sit in gRPC's reconnect backoff (up to two
// minutes) after the replica was killed, hiding its return.
func (c *ControlPlane) dial(ctx context.Context) (*grpc.ClientConn, error) {
	// A connection and a call: two of the replica's per-address tokens.
	if c.paced != nil {
		if err := c.paced.WaitN(ctx, 2); err != nil {
			return nil, fmt.Errorf("connecting to %s: %w", c.Name(), err)
		}
	}
	return c.Dial(c.creds())
}

// Dial opens a client connection to the replica from inside host-0 with
// creds; the caller closes it.
func (c *ControlPlane) Dial(creds ClientCredentials) (*grpc.ClientConn, error) {
	opts, err := creds.DialOptions()
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", c.Name(), err)
	}
	conn, err := grpc.NewClient("passthrough:///"+c.LocalGRPCAddr(), append(opts,
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialIn(c.tp, c.ns)(ctx, "tcp", addr)
		}))...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", c.Name(), err)
	}
	return conn, nil
}

// ServingCertificate returns the certificate the replica presents now,
// verified against the box's CA bundle: a TLS handshake from inside
// host-0, nothing more.
func (c *ControlPlane) ServingCertificate(ctx context.Context) (*x509.Certificate, error) {
	creds := c.creds()
	ca, err := os.ReadFile(creds.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	raw, err := dialIn(c.tp, c.ns)(ctx, "tcp", c.LocalGRPCAddr())
	if err != nil {
		return nil, err
	}
	conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: creds.ServerName, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	defer func() { _ = conn.Close() }()
	if err := conn.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS handshake with %s: %w", c.Name(), err)
	}
	return conn.ConnectionState().PeerCertificates[0], nil
}

// ListNodes calls the replica's ListNodes.
func (c *ControlPlane) ListNodes(ctx context.Context) (*pb.ListNodesResponse, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	resp, err := pb.NewTableServiceClient(conn).ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		return nil, fmt.Errorf("%s: ListNodes: %w", c.Name(), err)
	}
	return resp, nil
}

// NodeStatus returns node's entry in the replica's ListNodes, or nil.
func (c *ControlPlane) NodeStatus(ctx context.Context, node string) (*pb.NodeStatus, error) {
	resp, err := c.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, st := range resp.GetNodes() {
		if st.GetNodeName() == node {
			return st, nil
		}
	}
	return nil, nil
}

// Table returns node's current table on this replica: the snapshot that
// opens a WatchTable stream, which is then closed.
func (c *ControlPlane) Table(ctx context.Context, node string) (*pb.Snapshot, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewTableServiceClient(conn).WatchTable(ctx, &pb.WatchTableRequest{NodeName: node})
	if err != nil {
		return nil, fmt.Errorf("%s: WatchTable %s: %w", c.Name(), node, err)
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("%s: WatchTable %s: %w", c.Name(), node, err)
	}
	if m.GetSnapshot() == nil {
		return nil, fmt.Errorf("%s: WatchTable %s opened with %T, not a snapshot", c.Name(), node, m.GetKind())
	}
	return m.GetSnapshot(), nil
}

// Metrics scrapes the replica's /metrics.
func (c *ControlPlane) Metrics(ctx context.Context) (Metrics, error) {
	return scrape(ctx, c.tp, c.ns, "http://127.0.0.1:"+strconv.Itoa(c.MetricsPort)+"/metrics")
}

// Ready reports whether /readyz answers 200: the informers have synced
// and the first tables exist.
func (c *ControlPlane) Ready(ctx context.Context) error {
	scheme := "http"
	if c.MetricsHTTPS {
		scheme = "https"
	}
	_, err := get(ctx, c.tp, c.ns, scheme+"://127.0.0.1:"+strconv.Itoa(c.MetricsPort)+"/readyz")
	return err
}

// WaitReady waits until the replica is ready, failing early if it exits.
func (c *ControlPlane) WaitReady(ctx context.Context) error {
	return waitProcess(ctx, c.Process, func() error { return c.Ready(ctx) })
}

// Restart stops the replica gracefully (SIGTERM), starts it again and
// waits until it is ready.
func (c *ControlPlane) Restart(ctx context.Context) error {
	if err := c.Stop(ctx); err != nil {
		return err
	}
	return c.StartReady(ctx)
}

// StartReady starts the replica and waits until it is ready.
func (c *ControlPlane) StartReady(ctx context.Context) error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.WaitReady(ctx)
}

// Agent is the node agent of one node, a process in the node's namespace.
type Agent struct {
	*Process
	// Node is the node it runs on.
	Node *nstest.Node
	// StateDir is its --state-dir, holding the bbolt table cache.
	StateDir string
	// Pod is the Pod object its token is bound to (nil with
	// Options.Insecure).
	Pod *corev1.Pod
	// TokenFile and CAFile are its --token-file and --ca-file, which the
	// box writes as the kubelet would.
	TokenFile, CAFile string

	tp *nstest.Topology
}

// Metrics scrapes the agent's /metrics (127.0.0.1:10249 in its node, the
// default of deploy/config.env).
func (a *Agent) Metrics(ctx context.Context) (Metrics, error) {
	return scrape(ctx, a.tp, a.Node.NS(), "http://127.0.0.1:10249/metrics")
}

// Healthz fetches the agent's /healthz on 10256 (kube-proxy's port and
// body); an error carries the status when it is not 200.
func (a *Agent) Healthz(ctx context.Context) (string, error) { return a.HealthPath(ctx, "/healthz") }

// HealthPath fetches path (/healthz, /livez or /readyz) from the agent's
// health port 10256; an error carries the status and body when it is not
// 200.
func (a *Agent) HealthPath(ctx context.Context, path string) (string, error) {
	body, err := get(ctx, a.tp, a.Node.NS(), "http://127.0.0.1:10256"+path)
	return string(body), err
}

// State is what an agent's metrics say about its table.
type State struct {
	// Version is the table version in force (programmed), empty if none.
	Version string
	// Connected is true while it has a Sync stream to a control plane.
	Connected bool
	// CacheSaved is when it last wrote its bbolt cache (Unix seconds),
	// which it does for every table it applies, and only then.
	CacheSaved float64
}

// State scrapes the agent's metrics into a State.
func (a *Agent) State(ctx context.Context) (State, error) {
	m, err := a.Metrics(ctx)
	if err != nil {
		return State{}, err
	}
	var s State
	for _, mt := range m["proxyplane_agent_applied_version_info"].GetMetric() {
		if mt.GetGauge().GetValue() == 1 {
			s.Version = label(mt, "version")
		}
	}
	s.Connected = m.Value("proxyplane_agent_connected") == 1
	s.CacheSaved = m.Value("proxyplane_agent_cache_saved_timestamp_seconds")
	return s, nil
}

// WaitServing waits until the agent answers on its metrics port (it then
// has programmed its cache, if any), failing early if it exits.
func (a *Agent) WaitServing(ctx context.Context) error {
	return waitProcess(ctx, a.Process, func() error { _, err := a.Metrics(ctx); return err })
}

// Restart stops the agent gracefully (SIGTERM), starts it again and
// waits until it serves its metrics, by when it has programmed its cache.
func (a *Agent) Restart(ctx context.Context) error {
	if err := a.Stop(ctx); err != nil {
		return err
	}
	if err := a.Start(); err != nil {
		return err
	}
	return a.WaitServing(ctx)
}

// ResetState deletes the agent's state directory, as on a new node. The
// agent must be stopped.
func (a *Agent) ResetState() error {
	if a.Running() {
		return fmt.Errorf("%s is running: stop it before deleting its state", a.Name())
	}
	if err := os.RemoveAll(a.StateDir); err != nil {
		return fmt.Errorf("deleting %s: %w", a.StateDir, err)
	}
	return nil
}

// Metrics are scraped metric families by name.
type Metrics map[string]*dto.MetricFamily

// Value returns the value of the first sample of family name (a gauge,
// counter or untyped), the count of a histogram or summary, or 0 if
// there is none.
func (m Metrics) Value(name string) float64 {
	f := m[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	mt := f.GetMetric()[0]
	switch {
	case mt.GetGauge() != nil:
		return mt.GetGauge().GetValue()
	case mt.GetCounter() != nil:
		return mt.GetCounter().GetValue()
	case mt.GetHistogram() != nil:
		return float64(mt.GetHistogram().GetSampleCount())
	case mt.GetSummary() != nil:
		return float64(mt.GetSummary().GetSampleCount())
	}
	return mt.GetUntyped().GetValue()
}

// Sum returns the sum of every sample of counter or gauge family name,
// across its labels (sent_bytes_total by kind, say); 0 if there is none.
func (m Metrics) Sum(name string) float64 {
	var sum float64
	for _, mt := range m[name].GetMetric() {
		sum += mt.GetCounter().GetValue() + mt.GetGauge().GetValue()
	}
	return sum
}

// Histogram returns the sample count and sum of histogram name, across
// its labels (ip_family, say).
func (m Metrics) Histogram(name string) (count uint64, sum float64) {
	for _, mt := range m[name].GetMetric() {
		count += mt.GetHistogram().GetSampleCount()
		sum += mt.GetHistogram().GetSampleSum()
	}
	return count, sum
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// scrape fetches and parses a Prometheus text endpoint inside ns.
func scrape(ctx context.Context, tp *nstest.Topology, ns, url string) (Metrics, error) {
	body, err := get(ctx, tp, ns, url)
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", url, err)
	}
	return fams, nil
}

// maxBody bounds what get reads: a metrics page of the box is a few tens
// of kilobytes.
const maxBody = 8 << 20

// get fetches url from inside ns; a status other than 200 is an error
// carrying the body.
func get(ctx context.Context, tp *nstest.Topology, ns, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	// A fresh transport per request: each dials from the namespace, and
	// nothing is kept alive to go stale across restarts.
	tr := &http.Transport{DialContext: dialIn(tp, ns), DisableKeepAlives: true}
	if strings.HasPrefix(url, "https://") {
		// The box's HTTPS GETs are probes, and a kubelet's probe does
		// not verify the server's certificate either.
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // a probe, as the kubelet's
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s in %s: %w", url, ns, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("GET %s in %s: reading body: %w", url, ns, err)
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s in %s: %s: %s", url, ns, resp.Status, body)
	}
	return body, nil
}

// waitProcess polls ready until it succeeds, failing at once if p exits
// meanwhile, with the end of its log.
func waitProcess(ctx context.Context, p *Process, ready func() error) error {
	exited := p.Exited()
	if exited == nil {
		return fmt.Errorf("%s is not running", p.Name())
	}
	err := Eventually(ctx, func() error {
		select {
		case <-exited:
			return Permanent(fmt.Errorf("%s exited: %w\n%s", p.Name(), exitStatus(p.ExitError()), p.LogTail(20)))
		default:
		}
		return ready()
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", p.Name(), err)
	}
	return nil
}

// exitStatus turns a clean exit (a nil error) into an error too, for
// messages about a process that should not have exited at all.
func exitStatus(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}

// errPermanent marks an error that Eventually must not retry.
type errPermanent struct{ err error }

func (e errPermanent) Error() string { return e.err.Error() }
func (e errPermanent) Unwrap() error { return e.err }

// Permanent wraps err so that Eventually returns it at once.
func Permanent(err error) error { return errPermanent{err} }

// isPermanent reports whether err was wrapped by Permanent.
func isPermanent(err error) bool {
	var p errPermanent
	return errors.As(err, &p)
}
