package status

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/proxyplane/proxyplane/controlplane/adminclient"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Drift is one dataplane family's drift repairs on a node, as its agent
// reported them: rules someone else changed that the agent put back.
type Drift struct {
	// Dataplane is the agent's dataplane ("nftables").
	Dataplane string `json:"dataplane"`
	// IPFamily is "IPv4" or "IPv6".
	IPFamily string `json:"ipFamily"`
	// Count is the repairs since the agent started.
	Count uint64 `json:"count"`
	// FirstRepaired and LastRepaired are when the first and the last
	// repair happened.
	FirstRepaired time.Time `json:"firstRepaired"`
	// LastRepaired is when the last repair happened.
	LastRepaired time.Time `json:"lastRepaired"`
	// Detail is what the last check found changed.
	Detail string `json:"detail,omitempty"`
}

func drifts(in []*pb.DriftRepair) []Drift {
	var out []Drift
	for _, d := range in {
		out = append(out, Drift{
			Dataplane: d.GetDataplane(), IPFamily: d.GetIpFamily(), Count: d.GetCount(),
			FirstRepaired: d.GetFirstRepairedAt().AsTime(), LastRepaired: d.GetLastRepairedAt().AsTime(), Detail: d.GetDetail(),
		})
	}
	return out
}

// Change is one change to the Services and how far it has converged.
//
// Each replica measures the agents connected to it. A change carrying a
// trigger time is the same change on every replica (same Services, same
// start), and its rows merge: nodes and converged add up, the pending
// nodes join, and each quantile is the largest of the replicas' times,
// shown only once every replica reached it. That largest time is exact
// for 100% of the agents that stayed on one replica until they converged
// (the last of them is the last of some replica) and an upper bound for
// the other quantiles: when every replica has q of its nodes, the
// cluster has q of all of them, maybe sooner. An agent that disconnects
// or moves to another replica before converging counts on none: its
// replica counts it in Left. A change without a trigger time starts when
// each replica published it, and its rows stay apart.
type Change struct {
	// Replicas are the replicas whose rows merged into this one.
	Replicas []string `json:"replicas"`
	// Services are the keys of (some of) the Services the change
	// altered; ServicesChanged counts them all, 0 when unknown.
	Services []string `json:"services,omitempty"`
	// ServicesChanged is how many Services the change altered.
	ServicesChanged int `json:"servicesChanged"`
	// Started is when the change started.
	Started time.Time `json:"started"`
	// FromTriggerTime is set when Started is the trigger time annotation.
	FromTriggerTime bool `json:"fromTriggerTime"`
	// Nodes are the agents that must receive it; Converged, those that
	// have acknowledged it.
	Nodes int `json:"nodes"`
	// Converged counts the agents that acknowledged a table holding it.
	Converged int `json:"converged"`
	// Left counts the agents that left their replica (disconnected, or
	// moved to another) before converging: they are not in Nodes.
	Left int `json:"left"`
	// Reached maps a quantile ("0.5", "0.9", "0.99", "1") to the time
	// from Started until that share of Nodes had converged.
	Reached map[string]Seconds `json:"reachedSeconds,omitempty"`
	// Pending names nodes that have not converged (the replicas list up
	// to 10 each).
	Pending []Pending `json:"pending,omitempty"`
}

// Pending is a node that has not converged to a change, and why.
type Pending struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Reason is "pending", "nacked" or "disconnected" (for a moment:
	// then it counts in Left).
	Reason string `json:"reason"`
	// Replica is the replica that counts it.
	Replica string `json:"replica"`
}

// quantileLabel renders a quantile as metric labels do.
func quantileLabel(q float64) string { return strconv.FormatFloat(q, 'f', -1, 64) }

// MergeChanges merges the replicas' changes (see Change), newest first.
func MergeChanges(replies []Reply) []Change {
	type group struct {
		c      *Change
		counts map[string]int // replicas that reached each quantile
		max    map[string]time.Duration
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, r := range replies {
		if r.Err != nil {
			continue
		}
		for _, c := range r.Convergence {
			key := fmt.Sprintf("%s/%d", r.Replica, c.GetRevision())
			if c.GetFromTriggerTime() {
				key = fmt.Sprintf("%d|%d|%s", c.GetStartedAt().AsTime().UnixNano(), c.GetServicesChanged(), strings.Join(c.GetServices(), ","))
			}
			g := byKey[key]
			if g == nil {
				g = &group{
					c: &Change{
						Services: c.GetServices(), ServicesChanged: int(c.GetServicesChanged()),
						Started: c.GetStartedAt().AsTime(), FromTriggerTime: c.GetFromTriggerTime(),
					},
					counts: map[string]int{}, max: map[string]time.Duration{},
				}
				byKey[key] = g
				groups = append(groups, g)
			}
			g.c.Replicas = append(g.c.Replicas, r.Replica)
			g.c.Nodes += int(c.GetNodes())
			g.c.Converged += int(c.GetConverged())
			g.c.Left += int(c.GetLeft())
			for _, q := range c.GetReached() {
				l := quantileLabel(q.GetQuantile())
				g.counts[l]++
				g.max[l] = max(g.max[l], q.GetAfter().AsDuration())
			}
			for _, p := range c.GetPending() {
				g.c.Pending = append(g.c.Pending, Pending{Node: p.GetNodeName(), Reason: p.GetReason(), Replica: r.Replica})
			}
		}
	}
	var out []Change
	for _, g := range groups {
		for l, n := range g.counts {
			if n == len(g.c.Replicas) {
				if g.c.Reached == nil {
					g.c.Reached = map[string]Seconds{}
				}
				g.c.Reached[l] = Seconds(g.max[l])
			}
		}
		slices.SortFunc(g.c.Pending, func(a, b Pending) int { return strings.Compare(a.Node, b.Node) })
		out = append(out, *g.c)
	}
	slices.SortStableFunc(out, func(a, b Change) int { return b.Started.Compare(a.Started) })
	return out
}

// tableQuantiles are the quantiles the table shows, in its column order.
var tableQuantiles = []string{"0.5", "0.9", "0.99", "1"}

// WriteChanges prints one line per change under a header:
//
//	STARTED (UTC)  FROM     SERVICES     REPLICAS       NODES  50%   90%   99%   100%  NOT CONVERGED
//	09:41:07.250   trigger  default/web  10.0.0.5:9640  3/3    12ms  31ms  31ms  31ms  -
//
// FROM says whether the start is the trigger time annotation ("trigger")
// or when the replica published the change ("seen"); NODES is converged
// of those that must converge, then "+N left" for the agents that left
// before converging; a quantile not yet reached shows "-".
func WriteChanges(w io.Writer, changes []Change) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	var b strings.Builder
	b.WriteString("STARTED (UTC)\tFROM\tSERVICES\tREPLICAS\tNODES\t50%\t90%\t99%\t100%\tNOT CONVERGED\n")
	for _, c := range changes {
		from := "seen"
		if c.FromTriggerTime {
			from = "trigger"
		}
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\t%d/%d", c.Started.UTC().Format("15:04:05.000"), from, servicesCell(c), replicasCell(c.Replicas), c.Converged, c.Nodes)
		if c.Left > 0 {
			fmt.Fprintf(&b, " +%d left", c.Left)
		}
		for _, q := range tableQuantiles {
			cellText := "-"
			if d, ok := c.Reached[q]; ok {
				cellText = durationCell(time.Duration(d))
			}
			b.WriteString("\t" + cellText)
		}
		b.WriteString("\t" + pendingCell(c) + "\n")
	}
	_, err := io.WriteString(tw, b.String())
	return errors.Join(err, tw.Flush())
}

func servicesCell(c Change) string {
	switch {
	case len(c.Services) == 0 && c.ServicesChanged == 0:
		return "(too many to track)"
	case c.ServicesChanged > len(c.Services):
		return adminclient.Cell(strings.Join(c.Services, ",")) + fmt.Sprintf(" +%d", c.ServicesChanged-len(c.Services))
	}
	return adminclient.Cell(strings.Join(c.Services, ","))
}

func replicasCell(rs []string) string {
	if len(rs) <= 2 {
		return adminclient.Cell(strings.Join(rs, ","))
	}
	return fmt.Sprintf("%d replicas", len(rs))
}

func durationCell(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// maxPendingShown bounds the nodes a change's row names.
const maxPendingShown = 5

func pendingCell(c Change) string {
	if c.Converged >= c.Nodes {
		return "-"
	}
	parts := make([]string, 0, maxPendingShown+1)
	for _, p := range c.Pending[:min(len(c.Pending), maxPendingShown)] {
		parts = append(parts, adminclient.Cell(p.Node)+" ("+adminclient.Cell(p.Reason)+")")
	}
	if more := c.Nodes - c.Converged - len(parts); more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(parts, ", ")
}

// WriteDrift prints one line per node and dataplane family whose agent
// repaired drift, most recent first, under a header:
//
//	NODE    DATAPLANE  FAMILY  REPAIRS  LAST (UTC)  WHAT
//	node-1  nftables   IPv4    2        09:41:07    IPv4 table proxyplane: chains deleted service-abc
func WriteDrift(w io.Writer, rows []Row) error {
	type line struct {
		node string
		d    Drift
	}
	var lines []line
	for _, r := range rows {
		for _, d := range r.Drift {
			lines = append(lines, line{r.Node, d})
		}
	}
	slices.SortStableFunc(lines, func(a, b line) int {
		return cmp.Or(b.d.LastRepaired.Compare(a.d.LastRepaired), strings.Compare(a.node, b.node))
	})
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	var b strings.Builder
	b.WriteString("NODE\tDATAPLANE\tFAMILY\tREPAIRS\tLAST (UTC)\tWHAT\n")
	for _, l := range lines {
		what := []rune(adminclient.Cell(l.d.Detail))
		if len(what) > maxNackText*2 {
			what = append(what[:maxNackText*2], '…')
		}
		fmt.Fprintf(&b, "%s\t%s\t%s\t%d\t%s\t%s\n", adminclient.Cell(l.node), adminclient.Cell(l.d.Dataplane), adminclient.Cell(l.d.IPFamily), l.d.Count,
			l.d.LastRepaired.UTC().Format("15:04:05"), orDash(string(what)))
	}
	_, err := io.WriteString(tw, b.String())
	return errors.Join(err, tw.Flush())
}
