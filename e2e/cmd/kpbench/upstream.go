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
	mNFTFailures  = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	mIPTFailures  = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
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
	// partial are kube-proxy's own durations of the syncs after one
	// EndpointSlice changed; added after one Service (with its slice)
	// was created.
	partial, added []time.Duration
	// rss and peakRSS are kube-proxy's resident memory (VmRSS, VmHWM)
	// after the syncs.
	rss, peakRSS uint64
	// floor is kube-proxy's ruleset, as `nft list table` or iptables-save
	// printed it, loaded by nft -f or iptables-restore into the namespace
	// without it.
	floor time.Duration
	// elements counts the service-ips elements (nftables) or the rules
	// (iptables) kube-proxy programmed.
	elements int
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

// run measures one kube-proxy process in mode (nftables or iptables) on
// world w: its first full sync, then partials one-endpoint changes and
// as many Services added (each deleted again), its memory, and,
// withFloor, the load of its listed ruleset by nft or iptables-restore.
// A first sync past the bound is reported in the result, not as an
// error.
func (u *upstream) run(ctx context.Context, mode string, w world, rep, partials int, withFloor bool) (upstreamResult, error) {
	var res upstreamResult
	n := w.Services
	err := phase(fmt.Sprintf("kpbench-upstream-%s-%d-%d", mode[:3], n, rep), func(tb *progTB) error {
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
		kp, err := u.start(ctx, mode, ns, fmt.Sprintf("kube-proxy-%s-%dx%d-%d.log", mode, n, w.Endpoints, rep))
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
			if m, err := procStatus(kp.cmd.Process.Pid); err == nil {
				res.rss, res.peakRSS = m.rss, m.hwm
			}
			log.Printf("kube-proxy %s at %s: no full sync within %v (RSS %d MiB, peak %d MiB); stopping it", mode, w, u.opts.UpstreamTimeout, res.rss>>20, res.peakRSS>>20)
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
		failures := mNFTFailures
		if mode == "iptables" {
			failures = mIPTFailures
		}
		if f := m.value(failures, family, ipv4); f != 0 {
			return fmt.Errorf("kube-proxy reports %v failed syncs; see %s", f, kp.logPath)
		}
		log.Printf("kube-proxy %s at %s: first full sync %v (process start to done: %v)", mode, w, res.full.Round(time.Millisecond), res.ready.Round(time.Millisecond))

		if partials > 0 {
			if res.partial, res.added, err = u.partials(ctx, scrapeKP, w, partials); err != nil {
				return err
			}
		}
		if m, err := procStatus(kp.cmd.Process.Pid); err == nil {
			res.rss, res.peakRSS = m.rss, m.hwm
		}
		log.Printf("kube-proxy %s at %s: RSS %d MiB, peak %d MiB", mode, w, res.rss>>20, res.peakRSS>>20)
		if !withFloor {
			return nil
		}
		// What kube-proxy programmed, and that ruleset through the tools
		// alone.
		kp.stop()
		list, load := []string{"nft", "list", "table", "ip", kpTable}, []string{"nft", "-f", "-"}
		if mode == "iptables" {
			list, load = []string{"iptables-save"}, []string{"iptables-restore"}
		}
		dump, took, err := runStdout(ctx, u.opts.UpstreamTimeout, ns, list[0], list[1:]...)
		if err != nil {
			return err
		}
		log.Printf("%s: %d bytes in %v", strings.Join(list, " "), len(dump), took.Round(time.Millisecond))
		res.dumpBytes = len(dump)
		ext := map[string]string{"nftables": "nft", "iptables": "iptables"}[mode]
		if err := os.WriteFile(filepath.Join(u.opts.Dir, fmt.Sprintf("kube-proxy-%dx%d.%s", n, w.Endpoints, ext)), dump, 0o644); err != nil {
			return err
		}
		if mode == "iptables" {
			res.elements = countRules(string(dump))
			// iptables (here iptables-nft, as kube-proxy found it) keeps
			// its tables in nf_tables: an empty ruleset is no rules.
			if _, _, err := runCmd(ctx, u.opts.UpstreamTimeout, ns, "", "nft", "flush", "ruleset"); err != nil {
				return err
			}
		} else {
			res.elements = countServiceIPs(string(dump))
			if _, _, err := runCmd(ctx, u.opts.UpstreamTimeout, ns, "", "nft", "delete", "table", "ip", kpTable); err != nil {
				return err
			}
		}
		if _, res.floor, err = runCmd(ctx, u.opts.UpstreamTimeout, ns, string(dump), load[0], load[1:]...); err != nil {
			return fmt.Errorf("loading kube-proxy's listed ruleset: %w", err)
		}
		log.Printf("kube-proxy's ruleset at %s through %s: %v", w, strings.Join(load, " "), res.floor.Round(time.Millisecond))
		return nil
	})
	return res, err
}

// partials changes one EndpointSlice partials times, back and forth, then
// adds a Service (and its slice) and deletes it partials times, and
// returns kube-proxy's own durations of the syncs each change and each
// addition triggered. It restores the slice afterwards.
func (u *upstream) partials(ctx context.Context, scrapeKP func() (metrics, error), w world, partials int) (changed, added []time.Duration, err error) {
	i := changedService(w.Services)
	for k := range partials {
		d, err := u.nextSync(ctx, scrapeKP, func() error { return setEndpoints(ctx, u.cs, i, w.Endpoints, k) })
		if err != nil {
			return nil, nil, err
		}
		changed = append(changed, d)
	}
	if err := setEndpoints(ctx, u.cs, i, w.Endpoints, -1); err != nil {
		return nil, nil, err
	}
	log.Printf("kube-proxy at %s: one-endpoint syncs %v", w, roundAll(changed))
	a := addedService(w.Services)
	for range partials {
		d, err := u.nextSync(ctx, scrapeKP, func() error { return createOne(ctx, u.cs, a, w.Endpoints) })
		if err != nil {
			return nil, nil, err
		}
		added = append(added, d)
		if _, err := u.nextSync(ctx, scrapeKP, func() error { return deleteService(ctx, u.cs, a) }); err != nil {
			return nil, nil, err
		}
	}
	log.Printf("kube-proxy at %s: one-Service-added syncs %v", w, roundAll(added))
	return changed, added, nil
}

// nextSync waits until kube-proxy has nothing pending, makes change, and
// returns kube-proxy's own duration of the sync it triggered, full or
// partial (the mean when it ran several).
func (u *upstream) nextSync(ctx context.Context, scrapeKP func() (metrics, error), change func() error) (time.Duration, error) {
	var count uint64
	var sum float64
	counted := func(m metrics) (uint64, float64) {
		cf, sf := m.histogram(mFull, family, ipv4)
		cp, sp := m.histogram(mPartial, family, ipv4)
		return cf + cp, sf + sp
	}
	// Start from quiet: nothing pending, so the next sync is the one this
	// change triggers.
	err := poll(ctx, 100*time.Millisecond, u.opts.UpstreamTimeout, func() (bool, error) {
		m, err := scrapeKP()
		if err != nil {
			return false, err
		}
		count, sum = counted(m)
		return m.value(mEPPending, "", "") == 0 && m.value(mSvcPending, "", "") == 0, nil
	})
	if err != nil {
		return 0, fmt.Errorf("waiting for kube-proxy to be idle: %w", err)
	}
	if err := change(); err != nil {
		return 0, err
	}
	var d time.Duration
	err = poll(ctx, 200*time.Millisecond, u.opts.UpstreamTimeout, func() (bool, error) {
		m, err := scrapeKP()
		if err != nil {
			return false, err
		}
		c, s := counted(m)
		if c == count {
			return false, nil
		}
		if c > count+1 {
			log.Printf("kube-proxy ran %d syncs for one change; taking their mean", c-count)
		}
		d = seconds((s - sum) / float64(c-count))
		return true, nil
	})
	if err != nil {
		return 0, fmt.Errorf("waiting for kube-proxy's sync: %w", err)
	}
	return d, nil
}

// kubeProxy is a running kube-proxy process.
type kubeProxy struct {
	cmd     *exec.Cmd
	logPath string
	started time.Time
	done    chan struct{}
	waitErr error
}

func (u *upstream) start(ctx context.Context, mode, ns, logName string) (*kubeProxy, error) {
	logPath := filepath.Join(u.opts.Dir, logName)
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cfg := kubeproxy.Config{
		Binary:             u.opts.KubeProxy,
		Mode:               mode,
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
