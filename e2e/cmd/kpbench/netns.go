package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/proxyplane/proxyplane/e2e/internal/kubeproxy"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// progTB is the nstest.TB of a program: cleanups run when the phase that
// owns it ends, and Fatalf or Skip abort that phase (nstest expects them
// not to return).
type progTB struct {
	name     string
	cleanups []func()
}

// tbAbort carries a Fatalf or Skip out of a phase.
type tbAbort struct{ err error }

func (t *progTB) Helper()                         {}
func (t *progTB) Name() string                    { return t.name }
func (t *progTB) Cleanup(f func())                { t.cleanups = append(t.cleanups, f) }
func (t *progTB) Logf(format string, args ...any) { log.Printf(format, args...) }
func (t *progTB) Errorf(format string, args ...any) {
	log.Printf("error: "+format, args...)
}

func (t *progTB) Fatalf(format string, args ...any) {
	panic(tbAbort{fmt.Errorf(format, args...)})
}

func (t *progTB) Skip(args ...any) {
	panic(tbAbort{errors.New(fmt.Sprint(args...))})
}

var _ nstest.TB = (*progTB)(nil)

// phase runs f with a fresh progTB named name, then its cleanups, newest
// first, and turns a Fatalf or Skip into f's error.
func phase(name string, f func(tb *progTB) error) (err error) {
	tb := &progTB{name: name}
	defer func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}()
	defer func() {
		if r := recover(); r != nil {
			a, ok := r.(tbAbort)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%s: %w", name, a.err)
		}
	}()
	return f(tb)
}

// dialer dials TCP from inside namespace ns.
func dialer(tp *nstest.Topology, ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := tp.Do(ns, func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// relay listens on addr inside namespace ns and relays every connection
// to the same address in the program's own namespace, so that kube-proxy
// in ns reaches the API server on the root namespace's 127.0.0.1 with the
// admin kubeconfig unchanged (the serving certificate names 127.0.0.1).
// It stops when ctx ends.
func relay(ctx context.Context, tp *nstest.Topology, ns, addr string) error {
	var ln net.Listener
	if err := tp.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return fmt.Errorf("relay listening on %s in %s: %w", addr, ns, err)
	}
	go kubeproxy.Relay(ctx, ln, (&net.Dialer{}).DialContext, addr)
	return nil
}

// metrics is a parsed Prometheus text page.
type metrics map[string]*dto.MetricFamily

// scrape fetches and parses url from inside namespace ns.
func scrape(ctx context.Context, tp *nstest.Topology, ns, url string) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// A fresh transport per scrape: nothing kept alive across restarts.
	client := &http.Client{Transport: &http.Transport{DialContext: dialer(tp, ns), DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, firstLines(string(body), 3))
	}
	return parseMetrics(body)
}

func parseMetrics(body []byte) (metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return fams, nil
}

// histogram returns the sample count and sum of the histogram name whose
// labels include label=value; zero when it has no sample yet.
func (m metrics) histogram(name, label, value string) (uint64, float64) {
	for _, s := range m[name].GetMetric() {
		if hasLabel(s, label, value) {
			h := s.GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// value returns the counter or gauge name whose labels include
// label=value (any sample when label is ""); zero when absent.
func (m metrics) value(name, label, value string) float64 {
	for _, s := range m[name].GetMetric() {
		if label == "" || hasLabel(s, label, value) {
			if c := s.GetCounter(); c != nil {
				return c.GetValue()
			}
			return s.GetGauge().GetValue()
		}
	}
	return 0
}

func hasLabel(s *dto.Metric, name, value string) bool {
	for _, l := range s.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// runCmd runs a command, inside namespace ns unless ns is "", bounded by
// timeout, with stdin, and returns its combined output and how long it
// took.
func runCmd(ctx context.Context, timeout time.Duration, ns, stdin string, name string, args ...string) ([]byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if ns != "" {
		args = append([]string{"netns", "exec", ns, name}, args...)
		name = "ip"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return out, took, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, firstLines(string(out), 5))
	}
	return out, took, nil
}

// runStdout is runCmd for listings: it returns the standard output only
// (iptables-nft-save warns on its standard error about legacy tables,
// which would otherwise land inside the dump).
func runStdout(ctx context.Context, timeout time.Duration, ns string, name string, args ...string) ([]byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if ns != "" {
		args = append([]string{"netns", "exec", ns, name}, args...)
		name = "ip"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		var stderr string
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			stderr = string(ee.Stderr)
		}
		return out, took, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, firstLines(stderr, 5))
	}
	return out, took, nil
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// poll calls cond every interval until it reports done, returns an error,
// ctx ends or timeout passes.
func poll(ctx context.Context, interval, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		done, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// memStatus is a process's resident memory, from /proc/PID/status.
type memStatus struct {
	// rss is VmRSS, hwm VmHWM (the peak), in bytes.
	rss, hwm uint64
}

// procStatus reads pid's resident memory.
func procStatus(pid int) (memStatus, error) {
	var m memStatus
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *uint64
		switch k {
		case "VmRSS":
			dst = &m.rss
		case "VmHWM":
			dst = &m.hwm
		default:
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return m, fmt.Errorf("parsing %s of process %d: %w", k, pid, err)
		}
		*dst = kb << 10
	}
	return m, nil
}
