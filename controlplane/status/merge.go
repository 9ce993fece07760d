package status

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Report is the merged view of every replica's answer.
type Report struct {
	// Replicas are the replicas asked, in the order given.
	Replicas []ReplicaResult `json:"replicas"`
	// Nodes has one row per node any replica listed, sorted by name.
	Nodes []Row `json:"nodes"`
	// Changes are the latest changes and how far each has converged,
	// newest first (see MergeChanges).
	Changes []Change `json:"changes,omitempty"`
}

// ReplicaResult is what one replica answered.
type ReplicaResult struct {
	// Address is the address asked.
	Address string `json:"address"`
	// Connected counts the agents connected to it.
	Connected int `json:"connected"`
	// Error is why it did not answer; empty when it did.
	Error string `json:"error,omitempty"`
}

// Answered counts the replicas that answered.
func (r *Report) Answered() int {
	n := 0
	for _, rr := range r.Replicas {
		if rr.Error == "" {
			n++
		}
	}
	return n
}

// Row is one node's state across the replicas.
//
// A connected node's row is the answer of the replica its agent is
// connected to. A node connected to none shows the record of the replica
// it acknowledged a table on last (what it held when it left), without a
// lag: no replica streams to it.
type Row struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Known is set when some replica has a Node object for it.
	Known bool `json:"known"`
	// Connected is set when its agent is connected to a replica asked.
	Connected bool `json:"connected"`
	// Replica is the address of the replica the row comes from.
	Replica string `json:"replica,omitempty"`
	// AlsoConnected are other replicas that still count a stream of
	// the node: during a failover, until the old replica notices that
	// the agent left (its keepalive timeout).
	AlsoConnected []string `json:"alsoConnected,omitempty"`
	// Peer is the agent's address as the replica sees it.
	Peer string `json:"peer,omitempty"`
	// AckedVersion is the version the agent acknowledged (or held at
	// hello); empty when none is known.
	AckedVersion string `json:"ackedVersion,omitempty"`
	// CurrentVersion is the node's table version in the replica's current
	// world.
	CurrentVersion string `json:"currentVersion,omitempty"`
	// Lag is how long the agent has been behind the replica's current
	// world (NodeStatus.lag); zero when current, nil when not connected.
	Lag *Seconds `json:"lagSeconds,omitempty"`
	// NackedVersion and NackError are the last NACK the replica recorded.
	NackedVersion string `json:"nackedVersion,omitempty"`
	// NackError is that NACK's error detail.
	NackError string `json:"nackError,omitempty"`
	// Drift are the drift repairs the node's agent reported.
	Drift []Drift `json:"drift,omitempty"`
}

// Seconds is a duration that JSON encodes as a number of seconds.
type Seconds time.Duration

// MarshalJSON encodes s in seconds, the unit scripts compare against.
func (s Seconds) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, time.Duration(s).Seconds(), 'f', -1, 64), nil
}

// UnmarshalJSON decodes a number of seconds.
func (s *Seconds) UnmarshalJSON(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("lag %s: want seconds: %w", b, err)
	}
	*s = Seconds(f * float64(time.Second))
	return nil
}

// Merge merges the replicas' replies into one row per node.
func Merge(replies []Reply) *Report {
	rep := &Report{Replicas: make([]ReplicaResult, 0, len(replies))}
	type seen struct {
		replica string
		st      *pb.NodeStatus
	}
	byNode := map[string][]seen{}
	for _, r := range replies {
		rr := ReplicaResult{Address: r.Replica}
		if r.Err != nil {
			rr.Error = r.Err.Error()
			rep.Replicas = append(rep.Replicas, rr)
			continue
		}
		for _, st := range r.Nodes {
			if st.GetConnected() {
				rr.Connected++
			}
			byNode[st.GetNodeName()] = append(byNode[st.GetNodeName()], seen{r.Replica, st})
		}
		rep.Replicas = append(rep.Replicas, rr)
	}
	for name, all := range byNode {
		// The source: the newest stream when connected (an agent has
		// one; an older one a replica still counts is half-open), else
		// the last acknowledgement; the first replica given on a tie.
		best := all[0]
		for _, s := range all[1:] {
			if newer(s.st, best.st) {
				best = s
			}
		}
		row := Row{
			Node: name, Connected: best.st.GetConnected(), Replica: best.replica, Peer: best.st.GetPeer(),
			AckedVersion: best.st.GetAckedVersion(), CurrentVersion: best.st.GetCurrentVersion(),
			NackedVersion: best.st.GetNackedVersion(), NackError: best.st.GetNackError(),
			Drift: drifts(best.st.GetDrift()),
		}
		for _, s := range all {
			row.Known = row.Known || s.st.GetKnown()
			if s != best && s.st.GetConnected() {
				row.AlsoConnected = append(row.AlsoConnected, s.replica)
			}
		}
		if row.Connected {
			lag := Seconds(best.st.GetLag().AsDuration())
			row.Lag = &lag
		}
		rep.Nodes = append(rep.Nodes, row)
	}
	slices.SortFunc(rep.Nodes, func(a, b Row) int { return strings.Compare(a.Node, b.Node) })
	rep.Changes = MergeChanges(replies)
	return rep
}

// newer reports whether a is a better source of a node's row than b: a
// connected stream over none, a later stream over an earlier one, and
// among disconnected records the later acknowledgement.
func newer(a, b *pb.NodeStatus) bool {
	if a.GetConnected() != b.GetConnected() {
		return a.GetConnected()
	}
	if a.GetConnected() {
		return a.GetConnectedAt().AsTime().After(b.GetConnectedAt().AsTime())
	}
	return a.GetAckedAt().AsTime().After(b.GetAckedAt().AsTime())
}
