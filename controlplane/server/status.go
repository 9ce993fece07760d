package server

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	"github.com/proxyplane/proxyplane/controlplane/table"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// maxNackError bounds the NACK detail kept per node: an agent's error text
// is its own to choose, and the registry must not grow with it.
const maxNackError = 1024

// registry holds each node's sync status on this replica, and the stream
// currently serving each node. Streams record into their own streamStatus;
// the registry's lock is taken only when a stream starts or ends and when
// ListNodes reads, never per table sent or acknowledged.
type registry struct {
	known func(node string) bool // whether a Node object exists

	mu    sync.Mutex            // guards nodes
	nodes map[string]*nodeEntry // connected nodes, and known ones that were
}

// nodeEntry is what the registry keeps of a node: its stream while one is
// connected, and afterwards only fixed-size results, so that a node that
// is gone costs nothing and a disconnected one little.
type nodeEntry struct {
	stream *streamStatus // the connected stream, or nil
	last   syncResult    // as of the last stream's end
}

// syncResult is what a stream learned of its node's agent.
type syncResult struct {
	sentVersion, ackedVersion, nackedVersion uint64
	sent, acked, nacked                      bool
	sentNonce                                uint64
	ackedAt                                  time.Time
	nackError                                string
	nackedAt                                 time.Time
	bytesSent                                uint64
	// drift is what the agent last reported of its drift repairs; the
	// slice and its messages are never modified once stored.
	drift []*pb.DriftRepair
	// behindSince is when the stream first had a table to send that the
	// agent has not acknowledged since; zero while it is current.
	behindSince time.Time
}

// streamStatus is one stream's status. The stream's goroutines write it
// and ListNodes and the registry read it, each holding mu only for that:
// never while the stream writes to its agent, so that one agent whose
// writes block holds back no ListNodes and no other stream's attach.
type streamStatus struct {
	r           *registry
	node        string
	cancel      context.CancelCauseFunc
	caps        *pb.Capabilities
	peer        string
	connectedAt time.Time

	mu  sync.Mutex // guards res
	res syncResult
}

func newRegistry(known func(string) bool) *registry {
	return &registry{known: known, nodes: map[string]*nodeEntry{}}
}

// attach makes a new stream, whose status s names its node, peer,
// capabilities and cancel function, the one serving s.node. An older
// stream for the same node is cancelled: an agent reconnecting has given
// up on it, and it is most likely half-open.
func (r *registry) attach(s *streamStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.nodes[s.node]
	if e == nil {
		e = &nodeEntry{}
		r.nodes[s.node] = e
	}
	if e.stream != nil {
		e.last = e.stream.result()
		e.stream.cancel(errReplaced)
	} else {
		metrics.NodesConnected.Inc()
	}
	s.r, s.connectedAt = r, time.Now()
	s.mu.Lock()
	// The last NACK and the drift reported stay visible across reconnects.
	s.res.nackedVersion, s.res.nacked, s.res.nackError, s.res.nackedAt = e.last.nackedVersion, e.last.nacked, e.last.nackError, e.last.nackedAt
	s.res.drift = e.last.drift
	s.mu.Unlock()
	e.stream = s
}

func (s *streamStatus) sent(version, nonce uint64, bytes int) {
	s.mu.Lock()
	s.res.sentVersion, s.res.sent, s.res.sentNonce = version, true, nonce
	s.res.bytesSent += uint64(bytes)
	s.mu.Unlock()
}

// acked records that the agent acknowledged version, at now.
func (s *streamStatus) acked(version uint64, now time.Time) {
	s.mu.Lock()
	s.res.ackedVersion, s.res.acked, s.res.ackedAt = version, true, now
	s.mu.Unlock()
}

// behind records that the agent fell behind (at now) or caught up.
func (s *streamStatus) behind(behind bool, now time.Time) {
	if !behind {
		now = time.Time{}
	}
	s.mu.Lock()
	s.res.behindSince = now
	s.mu.Unlock()
}

func (s *streamStatus) nacked(version uint64, detail string) {
	if len(detail) > maxNackError {
		detail = strings.ToValidUTF8(detail[:maxNackError], "") + "…"
	}
	now := time.Now()
	s.mu.Lock()
	s.res.nackedVersion, s.res.nacked, s.res.nackError, s.res.nackedAt = version, true, detail, now
	s.mu.Unlock()
}

// drifted records the agent's drift report, and returns how many repairs
// it adds to what this replica knew of the node. Counts are the agent's
// since it started, so a report is compared with the node's last one on
// this replica, stream or not:
//   - the same agent (FirstRepairedAt unchanged): the rise in its count;
//   - a restarted agent (FirstRepairedAt changed): its whole count;
//   - a node this replica has no report of (it restarted, or the agent
//     served another replica until now): only what provably happened
//     since this stream connected; the rest may be counted elsewhere, and
//     counting it again would make every rollout look like an attack.
func (s *streamStatus) drifted(repairs []*pb.DriftRepair) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var added uint64
	for _, r := range repairs {
		var before *pb.DriftRepair
		for _, o := range s.res.drift {
			if o.GetDataplane() == r.GetDataplane() && o.GetIpFamily() == r.GetIpFamily() {
				before = o
			}
		}
		switch {
		case before == nil:
			if r.GetFirstRepairedAt().AsTime().After(s.connectedAt) {
				added += r.GetCount()
			} else if r.GetCount() > 0 && r.GetLastRepairedAt().AsTime().After(s.connectedAt) {
				added++ // the last one, at least
			}
		case !r.GetFirstRepairedAt().AsTime().Equal(before.GetFirstRepairedAt().AsTime()):
			added += r.GetCount()
		case r.GetCount() > before.GetCount():
			added += r.GetCount() - before.GetCount()
		}
	}
	s.res.drift = repairs
	return added
}

func (s *streamStatus) result() syncResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res
}

// detach marks the node disconnected if s still serves it, and reports
// whether it did. What the agent sent (capabilities, peer) is dropped; a
// node without a Node object is forgotten altogether, so names invented
// in hellos leave nothing behind.
func (s *streamStatus) detach() bool {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	e := s.r.nodes[s.node]
	if e == nil || e.stream != s {
		return false
	}
	metrics.NodesConnected.Dec()
	e.stream = nil
	if !s.r.known(s.node) {
		delete(s.r.nodes, s.node)
		return true
	}
	e.last = s.result()
	// Both describe the current stream only.
	e.last.bytesSent, e.last.behindSince = 0, time.Time{}
	return true
}

// connected returns the names of the nodes connected to this replica.
func (r *registry) connected() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.nodes))
	for name, e := range r.nodes {
		if e.stream != nil {
			out = append(out, name)
		}
	}
	return out
}

// pendingReason says why node has not converged to a change: its agent
// left this replica ("disconnected"), rejected its latest table since it
// last acknowledged one ("nacked"), or has yet to answer ("pending").
func (r *registry) pendingReason(node string) string {
	r.mu.Lock()
	var s *streamStatus
	if e := r.nodes[node]; e != nil {
		s = e.stream
	}
	r.mu.Unlock()
	if s == nil {
		return "disconnected"
	}
	res := s.result()
	if res.nacked && !res.nackedAt.Before(res.ackedAt) {
		return "nacked"
	}
	return "pending"
}

// list returns the status of every node known in w and every connected
// one, sorted by name, with each node's current version in w, and forgets
// disconnected nodes that are gone.
func (r *registry) list(w *table.World) []*pb.NodeStatus {
	out := r.statuses(w.NodeNames(), time.Now())
	for _, st := range out {
		// Outside the lock: the first Version of a world builds its index.
		// World.Version shares each zone's sum between the nodes of the
		// zone, so this costs one pass over the Services per zone and
		// world, not per node.
		st.CurrentVersion = compute.FormatVersion(w.Version(w.Node(st.NodeName)))
	}
	return out
}

// statuses returns what the registry knows of names and of every
// connected node, sorted by name, as of now.
func (r *registry) statuses(names []string, now time.Time) []*pb.NodeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*pb.NodeStatus, 0, len(names)+len(r.nodes))
	for name, e := range r.nodes {
		known := r.known(name)
		if e.stream == nil && !known {
			delete(r.nodes, name)
			continue
		}
		st := &pb.NodeStatus{NodeName: name, Known: known}
		res := e.last
		if s := e.stream; s != nil {
			st.Connected, st.Peer, st.ConnectedAt = true, s.peer, timestamppb.New(s.connectedAt)
			st.Capabilities = proto.CloneOf(s.caps)
			res = s.result()
		}
		res.fill(st, now)
		out = append(out, st)
	}
	for _, name := range names {
		if _, ok := r.nodes[name]; !ok {
			out = append(out, &pb.NodeStatus{NodeName: name, Known: true})
		}
	}
	slices.SortFunc(out, func(a, b *pb.NodeStatus) int { return strings.Compare(a.NodeName, b.NodeName) })
	return out
}

func (res syncResult) fill(st *pb.NodeStatus, now time.Time) {
	if res.sent {
		st.SentVersion = compute.FormatVersion(res.sentVersion)
		st.SentNonce = formatNonce(res.sentNonce)
	}
	if res.acked {
		st.AckedVersion = compute.FormatVersion(res.ackedVersion)
		if !res.ackedAt.IsZero() {
			st.AckedAt = timestamppb.New(res.ackedAt)
		}
	}
	if res.nacked {
		st.NackedVersion, st.NackError = compute.FormatVersion(res.nackedVersion), res.nackError
	}
	st.BytesSent = res.bytesSent
	st.Drift = res.drift
	if !res.behindSince.IsZero() {
		st.Lag = durationpb.New(now.Sub(res.behindSince))
	}
}
