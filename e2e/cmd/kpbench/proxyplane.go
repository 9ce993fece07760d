package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
	"github.com/proxyplane/proxyplane/internal/nstest"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/nftables"
)

// proxyplaneResult is proxyplane's nftables Dataplane, and the floors, at
// one size.
type proxyplaneResult struct {
	// full are first full syncs of a new Dataplane into the namespace
	// without the table: what an agent does on start.
	full []time.Duration
	// partial are partial syncs after one Service's endpoint changed.
	partial []time.Duration
	// floor is the same ruleset as nft text (Dataplane.Ruleset), loaded
	// by nft -f into the namespace without the table.
	floor []time.Duration
	// nftElem and netlinkElem add one service-ips element to the table in
	// force, with the nft command and with one netlink batch: the floor of
	// any update through nft, and of any update at all (the kernel
	// validates the table graph on each such commit).
	nftElem, netlinkElem []time.Duration
	services             int
	textBytes            int
}

// proxyplaneBench measures the Dataplane on a world of n Services in a
// fresh namespace.
func proxyplaneBench(ctx context.Context, o *Options, n int) (proxyplaneResult, error) {
	var res proxyplaneResult
	err := phase(fmt.Sprintf("kpbench-proxyplane-%d", n), func(tb *progTB) error {
		tp := nstest.New(tb, nstest.Options{Pods: 1}) //nolint:contextcheck // nstest bounds its own commands
		ns := tp.NodeNS()
		tb.Cleanup(func() { flushRuleset(context.WithoutCancel(ctx), ns) })
		cfg := nftables.DefaultConfig(dataplane.IPv4)
		cfg.LocalMode = dataplane.LocalClusterCIDR
		cfg.ClusterCIDRs = []string{clusterCIDR}
		cfg.NodeIPs = []string{tp.NodeIP().String()}
		cfg.NetNS = filepath.Join("/run/netns", ns)
		node := &pb.NodeInfo{Name: nodeName, Hash: 1}
		tbl, err := ppTable(node, n)
		if err != nil {
			return err
		}
		dropTable := func() error {
			out, _, err := runCmd(ctx, 10*time.Minute, ns, "", "nft", "delete", "table", "ip", nftables.TableName)
			if err != nil && !strings.Contains(string(out), "No such file") {
				return err
			}
			return nil
		}

		// Every sync is counted, so that the partial syncs measured are
		// known to have been partial.
		var partials, failures int
		observe := func(r dataplane.SyncResult) {
			if r.Err != nil {
				failures++
			} else if !r.Full {
				partials++
			}
		}
		var d *nftables.Dataplane
		for range o.Reps {
			if err := dropTable(); err != nil {
				return err
			}
			if d, err = nftables.New(cfg, observe); err != nil {
				return err
			}
			start := time.Now()
			if err := d.Sync(ctx, tbl, nil, true); err != nil {
				return err
			}
			res.full = append(res.full, time.Since(start))
		}
		log.Printf("proxyplane at %d Services: full syncs %v", n, roundAll(res.full))

		cur := tbl
		for k := range o.Partials {
			next, changed, err := ppChange(cur, changedService(n), k)
			if err != nil {
				return err
			}
			start := time.Now()
			if err := d.Sync(ctx, next, changed, false); err != nil {
				return err
			}
			res.partial = append(res.partial, time.Since(start))
			cur = next
		}
		if partials != o.Partials || failures != 0 {
			return fmt.Errorf("%d partial syncs and %d failures, want %d and none", partials, failures, o.Partials)
		}
		log.Printf("proxyplane at %d Services: one-Service partial syncs %v", n, roundAll(res.partial))

		listing, took, err := runCmd(ctx, 10*time.Minute, ns, "", "nft", "list", "table", "ip", nftables.TableName)
		if err != nil {
			return err
		}
		log.Printf("nft list table ip proxyplane: %d bytes in %v", len(listing), took.Round(time.Millisecond))
		res.services = countServiceIPs(string(listing))
		if err := os.WriteFile(filepath.Join(o.Dir, fmt.Sprintf("proxyplane-%d.nft", n)), listing, 0o644); err != nil {
			return err
		}

		// The floors. The ruleset as text, as nft would load it.
		text := d.Ruleset()
		res.textBytes = len(text)
		for range o.Reps {
			if err := dropTable(); err != nil {
				return err
			}
			_, took, err := runCmd(ctx, 10*time.Minute, ns, text, "nft", "-f", "-")
			if err != nil {
				return fmt.Errorf("loading proxyplane's ruleset text: %w", err)
			}
			res.floor = append(res.floor, took)
		}
		log.Printf("proxyplane's ruleset at %d Services through nft -f: %v", n, roundAll(res.floor))

		// One element in and out of service-ips, pointing at an existing
		// chain, over the table just loaded (the same ruleset).
		chain := firstServiceChain(text)
		if chain == "" {
			return fmt.Errorf("no service chain in the ruleset")
		}
		elem := "{ 10.63.0.1 . tcp . 80 : goto " + chain + " }"
		for range o.Partials {
			_, took, err := runCmd(ctx, time.Minute, ns, "", "nft", "add", "element", "ip", nftables.TableName, "service-ips", elem)
			if err != nil {
				return err
			}
			res.nftElem = append(res.nftElem, took)
			if _, _, err := runCmd(ctx, time.Minute, ns, "", "nft", "delete", "element", "ip", nftables.TableName, "service-ips", "{ 10.63.0.1 . tcp . 80 }"); err != nil {
				return err
			}
		}
		if res.netlinkElem, err = netlinkElement(cfg.NetNS, chain, o.Partials); err != nil {
			return err
		}
		log.Printf("one element at %d Services: nft %v, netlink %v", n, roundAll(res.nftElem), roundAll(res.netlinkElem))
		return nil
	})
	return res, err
}

var serviceChain = regexp.MustCompile(`(?m)^\s*chain (service-\S+) \{`)

func firstServiceChain(text string) string {
	m := serviceChain.FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	return m[1]
}

// netlinkElement adds (timed) and deletes (not timed) one service-ips
// element reps times, each a one-message netlink batch sent with
// google/nftables, in the namespace at nsPath.
func netlinkElement(nsPath, chain string, reps int) ([]time.Duration, error) {
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", nsPath, err)
	}
	defer func() { _ = unix.Close(fd) }()
	conn, err := gnft.New(gnft.WithNetNSFd(fd), gnft.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer func() { _ = conn.CloseLasting() }()
	set := &gnft.Set{Table: &gnft.Table{Name: nftables.TableName, Family: gnft.TableFamilyIPv4}, Name: "service-ips", IsMap: true}
	// ipv4_addr . inet_proto . inet_service: each field padded to 4 bytes.
	key := make([]byte, 12)
	copy(key[0:4], []byte{10, 63, 0, 1})
	key[4] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(key[8:10], 80)
	el := []gnft.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}}
	var out []time.Duration
	for range reps {
		start := time.Now()
		if err := conn.SetAddElements(set, el); err != nil {
			return nil, err
		}
		if err := conn.Flush(); err != nil {
			return nil, fmt.Errorf("netlink: adding an element: %w", err)
		}
		out = append(out, time.Since(start))
		if err := conn.SetDeleteElements(set, []gnft.SetElement{{Key: key}}); err != nil {
			return nil, err
		}
		if err := conn.Flush(); err != nil {
			return nil, fmt.Errorf("netlink: deleting an element: %w", err)
		}
	}
	return out, nil
}
