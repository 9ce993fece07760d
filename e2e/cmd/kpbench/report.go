package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// row is one world's results in one mode.
type row struct {
	w    world
	mode string
	// up holds one result per kube-proxy process; the last one also has
	// the partial syncs and the floor.
	up []upstreamResult
	// upTimedOut says a kube-proxy did not finish its first sync within
	// the bound (the last of up).
	upTimedOut bool
	pp         proxyplaneResult
	// load is /proc/loadavg's 1, 5 and 15 minute averages when the
	// world's measurements in this mode started and ended: other
	// processes share the cores.
	load [2]string
}

func (r *row) upFull() []time.Duration {
	var out []time.Duration
	for _, u := range r.up {
		if !u.timedOut {
			out = append(out, u.full)
		}
	}
	return out
}

func (r *row) upLast() upstreamResult {
	if len(r.up) == 0 {
		return upstreamResult{}
	}
	return r.up[len(r.up)-1]
}

// printTable writes the Markdown table of medians; ratios are upstream /
// proxyplane, and proxyplane / its floor.
func printTable(w io.Writer, o *Options, rows []row) {
	bound := "> " + o.UpstreamTimeout.String() + " (bound)"
	_, _ = fmt.Fprintln(w, "| Services x endpoints | mode | upstream full | proxyplane full | ratio | floor: proxyplane's ruleset through the tool | proxyplane / floor | upstream one endpoint | proxyplane one endpoint | ratio | upstream one Service added | proxyplane one Service added | ratio | upstream RSS (peak) | proxyplane RSS (peak) | floor: upstream's ruleset through the tool |")
	_, _ = fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		upFull, upPartial, upAdded, fullRatio, partialRatio, addedRatio, upFloor := bound, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a"
		ppFull, ppPartial, ppAdded, ppFloor := median(r.pp.Full), median(r.pp.Partial), median(r.pp.Added), median(r.pp.Floor)
		u := r.upLast()
		upRSS := mib(u.peakRSS)
		if r.upTimedOut {
			fullRatio = "> " + ratio(o.UpstreamTimeout, ppFull)
			upRSS = ">= " + upRSS
		}
		if f := r.upFull(); len(f) > 0 && !r.upTimedOut {
			upFull = ms(median(f))
			fullRatio = ratio(median(f), ppFull)
			if p := u.partial; len(p) > 0 {
				upPartial = ms(median(p))
				partialRatio = ratio(median(p), ppPartial)
			}
			if p := u.added; len(p) > 0 {
				upAdded = ms(median(p))
				addedRatio = ratio(median(p), ppAdded)
			}
			if fl := u.floor; fl > 0 {
				upFloor = ms(fl)
			}
		}
		_, _ = fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.w, r.mode, upFull, ms(ppFull), fullRatio, ms(ppFloor), ratio(ppFull, ppFloor),
			upPartial, ms(ppPartial), partialRatio, upAdded, ms(ppAdded), addedRatio,
			upRSS, mib(r.pp.PeakRSS), upFloor)
	}
	_, _ = fmt.Fprintln(w)
}

// printDetails writes every sample and the checks, for the spread.
func printDetails(w io.Writer, rows []row) {
	for _, r := range rows {
		u := r.upLast()
		var ready []time.Duration
		for _, x := range r.up {
			ready = append(ready, x.ready)
		}
		what := map[string]string{"nftables": "service-ips elements", "iptables": "rules"}[r.mode]
		_, _ = fmt.Fprintf(w, "%s, %s (load average %s at start, %s at end):\n", r.w, r.mode, r.load[0], r.load[1])
		_, _ = fmt.Fprintf(w, "  upstream: full %s; process start to full sync seen (or given up) %s; one endpoint %s; one Service added %s; RSS %s, peak %s\n",
			roundAll(r.upFull()), roundAll(ready), roundAll(u.partial), roundAll(u.added), mib(u.rss), mib(u.peakRSS))
		_, _ = fmt.Fprintf(w, "            ruleset %d bytes as listed, %d %s; through the tool %s\n", u.dumpBytes, u.elements, what, ms(u.floor))
		_, _ = fmt.Fprintf(w, "  proxyplane: full %s; one endpoint %s; one Service added %s; full again (periodic) %s; peak RSS %s, heap in use %s, RSS with the table before the syncs %s\n",
			roundAll(r.pp.Full), roundAll(r.pp.Partial), roundAll(r.pp.Added), roundAll(r.pp.Resync), mib(r.pp.PeakRSS), mib(r.pp.HeapInuse), mib(r.pp.TableRSS))
		_, _ = fmt.Fprintf(w, "            ruleset %d bytes as text, %d %s; through the tool %s\n", r.pp.TextBytes, r.pp.Elements, what, roundAll(r.pp.Floor))
		if r.pp.Backend != "" {
			_, _ = fmt.Fprintf(w, "            iptables backend %s\n", r.pp.Backend)
		}
		if r.mode == "nftables" {
			_, _ = fmt.Fprintf(w, "  one element: nft %s, netlink %s\n", roundAll(r.pp.NftElem), roundAll(r.pp.NetlinkElem))
		}
	}
}

// mib prints a byte count in MiB.
func mib(b uint64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%d MiB", b>>20)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", a.Seconds()/b.Seconds())
}

// ms prints d in milliseconds with a thousands separator.
func ms(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return thousands(int(d.Round(time.Millisecond)/time.Millisecond)) + " ms"
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func roundAll(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = ms(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// loadAverage returns the 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
