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
	bytesSent                                uint64
	// behindSince is when the stream first had a table to send that the
	// agent has not acknowledged since; zero while it is current.
	behindSince time.Time
}

// streamStatus is one stream's status. Its stream goroutine writes it and
// ListNodes reads it.
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

// attach makes a new stream the one serving node. An older stream for the
// same node is cancelled: an agent reconnecting has given up on it, and it
// is most likely half-open.
func (r *registry) attach(node, peer string, caps *pb.Capabilities, cancel context.CancelCauseFunc) *streamStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.nodes[node]
	if e == nil {
		e = &nodeEntry{}
		r.nodes[node] = e
	}
	if e.stream != nil {
		e.last = e.stream.result()
		e.stream.cancel(errReplaced)
	} else {
		metrics.NodesConnected.Inc()
	}
	s := &streamStatus{r: r, node: node, cancel: cancel, caps: caps, peer: peer, connectedAt: time.Now()}
	// The last NACK stays visible across reconnects.
	s.res.nackedVersion, s.res.nacked, s.res.nackError = e.last.nackedVersion, e.last.nacked, e.last.nackError
	e.stream = s
	return s
}

func (s *streamStatus) sent(version, nonce uint64, bytes int) {
	s.mu.Lock()
	s.res.sentVersion, s.res.sent, s.res.sentNonce = version, true, nonce
	s.res.bytesSent += uint64(bytes)
	s.mu.Unlock()
}

func (s *streamStatus) acked(version uint64) {
	now := time.Now()
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
	s.mu.Lock()
	s.res.nackedVersion, s.res.nacked, s.res.nackError = version, true, detail
	s.mu.Unlock()
}

func (s *streamStatus) result() syncResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res
}

// detach marks the node disconnected if s still serves it. What the agent
// sent (capabilities, peer) is dropped; a node without a Node object is
// forgotten altogether, so names invented in hellos leave nothing behind.
func (s *streamStatus) detach() {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	e := s.r.nodes[s.node]
	if e == nil || e.stream != s {
		return
	}
	metrics.NodesConnected.Dec()
	e.stream = nil
	if !s.r.known(s.node) {
		delete(s.r.nodes, s.node)
		return
	}
	e.last = s.result()
	// Both describe the current stream only.
	e.last.bytesSent, e.last.behindSince = 0, time.Time{}
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
	if !res.behindSince.IsZero() {
		st.Lag = durationpb.New(now.Sub(res.behindSince))
	}
}
