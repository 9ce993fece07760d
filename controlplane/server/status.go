package server

import (
	"context"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/proxyplane/proxyplane/controlplane/compute"
	"github.com/proxyplane/proxyplane/controlplane/metrics"
	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// registry holds each node's sync status on this replica, and the stream
// currently serving each node.
type registry struct {
	mu    sync.Mutex            // guards nodes
	nodes map[string]*nodeEntry // by node name; kept after disconnect
}

type nodeEntry struct {
	status *pb.NodeStatus
	stream *streamStatus // the connected stream, or nil
}

// streamStatus is one stream's handle on its node's entry.
type streamStatus struct {
	r      *registry
	node   string
	cancel context.CancelCauseFunc
}

func newRegistry() *registry { return &registry{nodes: map[string]*nodeEntry{}} }

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
		e.stream.cancel(errReplaced)
	} else {
		metrics.NodesConnected.Inc()
	}
	s := &streamStatus{r: r, node: node, cancel: cancel}
	e.stream = s
	e.status = &pb.NodeStatus{
		NodeName: node, Connected: true, Capabilities: caps, Peer: peer,
		ConnectedAt: timestamppb.Now(),
		// The last NACK stays visible across reconnects.
		NackedVersion: e.status.GetNackedVersion(), NackError: e.status.GetNackError(),
	}
	return s
}

// update applies f to the node's status if s still serves the node.
func (s *streamStatus) update(f func(*pb.NodeStatus)) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if e := s.r.nodes[s.node]; e != nil && e.stream == s {
		f(e.status)
	}
}

func (s *streamStatus) sent(version uint64, nonce string, bytes int) {
	s.update(func(st *pb.NodeStatus) {
		st.SentVersion, st.SentNonce = compute.FormatVersion(version), nonce
		st.BytesSent += uint64(bytes)
	})
}

func (s *streamStatus) acked(version uint64) {
	s.update(func(st *pb.NodeStatus) {
		st.AckedVersion, st.AckedAt = compute.FormatVersion(version), timestamppb.Now()
	})
}

func (s *streamStatus) nacked(version uint64, detail string) {
	s.update(func(st *pb.NodeStatus) {
		st.NackedVersion, st.NackError = compute.FormatVersion(version), detail
	})
}

// detach marks the node disconnected if s still serves it.
func (s *streamStatus) detach() {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if e := s.r.nodes[s.node]; e != nil && e.stream == s {
		e.stream = nil
		e.status.Connected = false
		metrics.NodesConnected.Dec()
	}
}

// list returns the status of every known node and every connected one,
// sorted by name, and forgets the rest.
func (r *registry) list(known func(string) bool, names []string) []*pb.NodeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*pb.NodeStatus, 0, len(names)+len(r.nodes))
	for name, e := range r.nodes {
		if e.stream == nil && !known(name) {
			// Gone from the cluster and disconnected: forget it, or the
			// registry grows with every name that ever said hello.
			delete(r.nodes, name)
			continue
		}
		st := proto.CloneOf(e.status)
		st.Known = known(name)
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
