package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/proxyplane/proxyplane/e2e/internal/kubeproxy"
	"github.com/proxyplane/proxyplane/internal/nstest"
)

// kube-proxy's metrics (pkg/proxy/metrics), per IP family.
const (
	mFull         = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	mPartial      = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	mFailures     = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	mEPPending    = "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
	mSvcPending   = "kubeproxy_sync_proxy_rules_service_changes_pending"
	family        = "ip_family"
	ipv4          = "IPv4"
	kpMetricsAddr = "127.0.0.1:10249"
	kpTable       = "kube-proxy"
)

// upstreamResult is one kube-proxy run at one size.
type upstreamResult struct {
	// full is kube-proxy's own duration of its first full IPv4 sync (its
	// sync_full_proxy_rules_duration_seconds sample).
	full time.Duration
	// ready is process start to that sync seen done, wall clock: it adds
	// start-up, listing the objects and the scrape interval.
	ready time.Duration
	// timedOut says the first sync did not end within the bound.
	timedOut bool
	// partial are kube-proxy's own durations of partial syncs after one
	// EndpointSlice changed.
	partial []time.Duration
	// floor is kube-proxy's ruleset, as `nft list table` printed it,
	// loaded by nft -f into the namespace without the table.
	floor time.Duration
	// services counts the service-ips elements kube-proxy programmed.
	services int
	// dumpBytes is the size of the listed ruleset.
	dumpBytes int
}

// upstream runs kube-proxy in a fresh network namespace, against the API
// server holding a world of n Services, and measures it.
type upstream struct {
	opts       *Options
	cs         kubernetes.Interface
	kubeconfig string
	// apiAddr is the API server's host:port, relayed into the namespace.
	apiAddr string
}

// run measures one kube-proxy process: its first full sync, then partials
// one-Service updates and, withFloor, the load of its listed ruleset by
// nft. A first sync past the bound is reported in the result, not as an
// error.
func (u *upstream) run(ctx context.Context, n, rep, partials int, withFloor bool) (upstreamResult, error) {
	var res upstreamResult
	err := phase(fmt.Sprintf("kpbench-upstream-%d-%d", n, rep), func(tb *progTB) error {
		tp := nstest.New(tb, nstest.Options{Pods: 1}) //nolint:contextcheck // nstest bounds its own commands
		ns := tp.NodeNS()
		// Deleting a namespace frees its table in the kernel's cleanup
		// work, in the background; flushed here, the next phase does not
		// share the cores with it.
		tb.Cleanup(func() { flushRuleset(context.WithoutCancel(ctx), ns) })
		rctx, stopRelay := context.WithCancel(ctx)
		defer stopRelay()
		if err := relay(rctx, tp, ns, u.apiAddr); err != nil {
			return err
		}
		kp, err := u.start(ctx, ns, fmt.Sprintf("kube-proxy-%d-%d.log", n, rep))
		if err != nil {
			return err
		}
		defer kp.stop()

		scrapeKP := func() (metrics, error) { return scrape(ctx, tp, ns, "http://"+kpMetricsAddr+"/metrics") }
		// The first full sync: a scrape every half second, which costs
		// kube-proxy little (a few milliseconds of its CPU each).
		var full float64
		err = poll(ctx, 500*time.Millisecond, u.opts.UpstreamTimeout, func() (bool, error) {
			if kp.exited() {
				return false, fmt.Errorf("kube-proxy exited: %w; last lines of %s:\n%s", kp.waitErr, kp.logPath, tail(kp.logPath, 20))
			}
			m, err := scrapeKP()
			if err != nil {
				return false, nil // not listening yet
			}
			count, sum := m.histogram(mFull, family, ipv4)
			full = sum
			return count >= 1, nil
		})
		res.ready = time.Since(kp.started)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			res.timedOut = true
			log.Printf("kube-proxy at %d Services: no full sync within %v", n, u.opts.UpstreamTimeout)
			return nil
		}
		if err != nil {
			return err
		}
		res.full = seconds(full)
		m, err := scrapeKP()
		if err != nil {
			return err
		}
		if f := m.value(mFailures, family, ipv4); f != 0 {
			return fmt.Errorf("kube-proxy reports %v failed nftables syncs; see %s", f, kp.logPath)
		}
		log.Printf("kube-proxy at %d Services: first full sync %v (process start to done: %v)", n, res.full.Round(time.Millisecond), res.ready.Round(time.Millisecond))

		if partials > 0 {
			if res.partial, err = u.partials(ctx, scrapeKP, n, partials); err != nil {
				return err
			}
		}
		if !withFloor {
			return nil
		}
		// What kube-proxy programmed, and that ruleset through nft alone.
		kp.stop()
		dump, took, err := runCmd(ctx, u.opts.UpstreamTimeout, ns, "", "nft", "list", "table", "ip", kpTable)
		if err != nil {
			return err
		}
		log.Printf("nft list table ip kube-proxy: %d bytes in %v", len(dump), took.Round(time.Millisecond))
		res.dumpBytes = len(dump)
		if err := os.WriteFile(filepath.Join(u.opts.Dir, fmt.Sprintf("kube-proxy-%d.nft", n)), dump, 0o644); err != nil {
			return err
		}
		res.services = countServiceIPs(string(dump))
		if _, _, err := runCmd(ctx, time.Minute, ns, "", "nft", "delete", "table", "ip", kpTable); err != nil {
			return err
		}
		if _, res.floor, err = runCmd(ctx, u.opts.UpstreamTimeout, ns, string(dump), "nft", "-f", "-"); err != nil {
			return fmt.Errorf("loading kube-proxy's listed ruleset: %w", err)
		}
		log.Printf("kube-proxy's ruleset at %d Services through nft -f: %v", n, res.floor.Round(time.Millisecond))
		return nil
	})
	return res, err
}

// partials changes one EndpointSlice partials times, back and forth, and
// returns kube-proxy's own duration of the partial sync each triggered. It
// restores the slice afterwards.
func (u *upstream) partials(ctx context.Context, scrapeKP func() (metrics, error), n, partials int) ([]time.Duration, error) {
	i := changedService(n)
	var out []time.Duration
	for k := range partials {
		// Start from quiet: nothing pending, so the next partial sync is
		// the one this change triggers.
		var count uint64
		var sum float64
		err := poll(ctx, 100*time.Millisecond, 2*time.Minute, func() (bool, error) {
			m, err := scrapeKP()
			if err != nil {
				return false, err
			}
			count, sum = m.histogram(mPartial, family, ipv4)
			return m.value(mEPPending, "", "") == 0 && m.value(mSvcPending, "", "") == 0, nil
		})
		if err != nil {
			return nil, fmt.Errorf("waiting for kube-proxy to be idle: %w", err)
		}
		if err := setEndpoints(ctx, u.cs, i, k); err != nil {
			return nil, err
		}
		var d time.Duration
		err = poll(ctx, 200*time.Millisecond, u.opts.UpstreamTimeout, func() (bool, error) {
			m, err := scrapeKP()
			if err != nil {
				return false, err
			}
			c, s := m.histogram(mPartial, family, ipv4)
			if c == count {
				return false, nil
			}
			if c > count+1 {
				log.Printf("kube-proxy ran %d partial syncs for one change; taking their mean", c-count)
			}
			d = seconds((s - sum) / float64(c-count))
			return true, nil
		})
		if err != nil {
			return nil, fmt.Errorf("waiting for kube-proxy's partial sync: %w", err)
		}
		out = append(out, d)
	}
	if err := setEndpoints(ctx, u.cs, i, -1); err != nil {
		return nil, err
	}
	log.Printf("kube-proxy at %d Services: one-Service partial syncs %v", n, roundAll(out))
	return out, nil
}

// kubeProxy is a running kube-proxy process.
type kubeProxy struct {
	cmd     *exec.Cmd
	logPath string
	started time.Time
	done    chan struct{}
	waitErr error
}

func (u *upstream) start(ctx context.Context, ns, logName string) (*kubeProxy, error) {
	logPath := filepath.Join(u.opts.Dir, logName)
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cfg := kubeproxy.Config{
		Binary:             u.opts.KubeProxy,
		Mode:               "nftables",
		Kubeconfig:         u.kubeconfig,
		NodeName:           nodeName,
		ClusterCIDR:        clusterCIDR,
		MetricsBindAddress: kpMetricsAddr,
		HealthzBindAddress: "127.0.0.1:10256",
		// Sync on every change (no 1 s minimum), and no periodic resync
		// during the measurement (its full resync is hourly anyway).
		// The iptables- flags set the shared SyncPeriod and MinSyncPeriod
		// in every mode but ipvs.
		Extra: []string{"--iptables-min-sync-period=0", "--iptables-sync-period=1h", "--v=2"},
	}
	args := append([]string{"netns", "exec", ns}, cfg.Args()...)
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdout, cmd.Stderr = f, f
	// "ip netns exec" execs kube-proxy: the signals reach it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting kube-proxy: %w", err)
	}
	kp := &kubeProxy{cmd: cmd, logPath: logPath, started: time.Now(), done: make(chan struct{})}
	go func() {
		kp.waitErr = cmd.Wait()
		_ = f.Close()
		close(kp.done)
	}()
	return kp, nil
}

func (kp *kubeProxy) exited() bool {
	select {
	case <-kp.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to 30 s before killing it. Stopping a
// stopped kube-proxy does nothing.
func (kp *kubeProxy) stop() {
	if kp.exited() {
		return
	}
	_ = kp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-kp.done:
	case <-time.After(30 * time.Second):
		_ = kp.cmd.Process.Kill()
		<-kp.done
	}
}

// flushRuleset empties namespace ns's ruleset, bounded.
func flushRuleset(ctx context.Context, ns string) {
	if _, took, err := runCmd(ctx, 10*time.Minute, ns, "", "nft", "flush", "ruleset"); err != nil {
		log.Printf("flushing the ruleset of %s: %v", ns, err)
	} else if took > time.Second {
		log.Printf("flushing the ruleset of %s took %v", ns, took.Round(time.Millisecond))
	}
}

// countServiceIPs counts the elements of map service-ips in an nft
// listing: each maps an address, protocol and port to a verdict.
func countServiceIPs(listing string) int {
	_, rest, ok := strings.Cut(listing, "map service-ips {")
	if !ok {
		return 0
	}
	body, _, _ := strings.Cut(rest, "}")
	return strings.Count(body, " : goto ") + strings.Count(body, " : jump ")
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
