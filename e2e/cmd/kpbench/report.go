package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// row is one size's results.
type row struct {
	n int
	// up holds one result per kube-proxy process; the last one also has
	// the partial syncs and the floor.
	up []upstreamResult
	// upTimedOut says a kube-proxy did not finish its first sync within
	// the bound.
	upTimedOut bool
	pp         proxyplaneResult
	// load is /proc/loadavg's 1, 5 and 15 minute averages when the size's
	// measurements started and ended: other processes share the cores.
	load [2]string
}

func (r *row) upFull() []time.Duration {
	var out []time.Duration
	for _, u := range r.up {
		out = append(out, u.full)
	}
	return out
}

func (r *row) upLast() upstreamResult {
	if len(r.up) == 0 {
		return upstreamResult{}
	}
	return r.up[len(r.up)-1]
}

// printTable writes the Markdown table of medians.
func printTable(w io.Writer, o *Options, rows []row) {
	bound := "> " + o.UpstreamTimeout.String() + " (bound)"
	_, _ = fmt.Fprintln(w, "| Services | upstream full | proxyplane full | ratio | upstream one-Service | proxyplane one-Service | ratio | floor: proxyplane ruleset, nft -f | floor: upstream ruleset, nft -f | floor: one element, nft | floor: one element, netlink |")
	_, _ = fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		upFull, upPartial, fullRatio, partialRatio, upFloor := bound, "n/a", "n/a", "n/a", "n/a"
		ppFull, ppPartial := median(r.pp.full), median(r.pp.partial)
		if len(r.up) > 0 {
			f := median(r.upFull())
			upFull = ms(f)
			fullRatio = ratio(f, ppFull)
			if p := r.upLast().partial; len(p) > 0 {
				upPartial = ms(median(p))
				partialRatio = ratio(median(p), ppPartial)
			}
			if fl := r.upLast().floor; fl > 0 {
				upFloor = ms(fl)
			}
		}
		_, _ = fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			thousands(r.n), upFull, ms(ppFull), fullRatio, upPartial, ms(ppPartial), partialRatio,
			ms(median(r.pp.floor)), upFloor, ms(median(r.pp.nftElem)), ms(median(r.pp.netlinkElem)))
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
		_, _ = fmt.Fprintf(w, "%s Services (load average %s at start, %s at end):\n", thousands(r.n), r.load[0], r.load[1])
		_, _ = fmt.Fprintf(w, "  upstream: full %s; process start to full sync seen %s; one-Service %s\n", roundAll(r.upFull()), roundAll(ready), roundAll(u.partial))
		_, _ = fmt.Fprintf(w, "            ruleset %d bytes as listed, %d service-ips elements; through nft -f %s\n", u.dumpBytes, u.services, ms(u.floor))
		_, _ = fmt.Fprintf(w, "  proxyplane: full %s; one-Service %s\n", roundAll(r.pp.full), roundAll(r.pp.partial))
		_, _ = fmt.Fprintf(w, "            ruleset %d bytes as text, %d service-ips elements; through nft -f %s\n", r.pp.textBytes, r.pp.services, roundAll(r.pp.floor))
		_, _ = fmt.Fprintf(w, "  one element: nft %s, netlink %s\n", roundAll(r.pp.nftElem), roundAll(r.pp.netlinkElem))
	}
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
