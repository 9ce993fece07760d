package server

import (
	"context"
	"net/netip"
	"time"

	pb "github.com/proxyplane/proxyplane/gen/proxyplane/v1"
)

// Options tune the server. Zero values are replaced by the defaults below.
type Options struct {
	// KeepaliveInterval is how often a keepalive goes to each agent.
	KeepaliveInterval time.Duration
	// KeepaliveTimeout closes a stream whose agent sent nothing for this
	// long (it answers every keepalive, so silence means it is gone).
	KeepaliveTimeout time.Duration
	// WriteTimeout closes a stream whose agent does not take a message
	// within this time: a half-open or stalled peer.
	WriteTimeout time.Duration
	// AckTimeout closes a stream whose agent neither ACKs nor NACKs a
	// table response within this time. It must cover a full kernel sync.
	AckTimeout time.Duration
	// Authorize, when set, decides whether the stream's peer may act for
	// nodeName; it reads credentials from ctx (metadata or TLS), never
	// from messages. A non-nil error refuses the stream: a gRPC status
	// (Unauthenticated, PermissionDenied) as it is, any other error as
	// PermissionDenied.
	Authorize func(ctx context.Context, nodeName string) error
	// AuthorizeRead, when set, decides whether the caller may read status:
	// nodeName's table for WatchTable, or every node's status and the
	// events for ListNodes and ListEvents (nodeName ""). Like Authorize it
	// reads credentials from ctx; its error (a gRPC status, or any error
	// for PermissionDenied) refuses the call.
	AuthorizeRead func(ctx context.Context, nodeName string) error
	// Events, when set, supplies what ListEvents reports; without it
	// ListEvents reports no events.
	Events EventSource
	// Stale, when set, says why this replica's world may be behind the
	// cluster (a watch failing), nil when it is not. A stale replica still
	// serves agents that hold exactly its table or none, and refuses the
	// others (UNAVAILABLE): their table may be newer than its own, and
	// serving it would roll them back.
	Stale func() error
	// AdmissionRate bounds how many Sync streams per second start being
	// served; AdmissionBurst is how many may start at once. Streams over
	// the rate wait their turn (they are not refused), so a reconnect of
	// every agent after a restart is spread out instead of stampeding.
	AdmissionRate  float64
	AdmissionBurst int
	// DisableConvergence turns off the convergence SLI's bookkeeping
	// (convergence.go): no histograms, no changes in ListNodes. It exists
	// to measure what the bookkeeping costs.
	DisableConvergence bool
	// NodeAddresses, when set, is told the node's own addresses that an
	// authorized agent's hello reports (Hello.node_addresses, validated),
	// before the stream takes its first table: the agent refuses a table
	// capturing one of them, so the tables sent from then on must guard
	// them (watch.Watcher.ReportNodeAddresses). It returns once they do,
	// or with ctx's error.
	NodeAddresses func(ctx context.Context, node string, addrs []netip.Addr) error
}

// EventSource supplies the events about invalid Services and
// EndpointSlices that ListEvents serves (watch.Watcher is one).
type EventSource interface {
	// Events returns the current events, sorted. It is called from any
	// goroutine, must not block, and returns a snapshot that its owner
	// never modifies again, so the server sends it as is; callers must not
	// modify it either.
	Events() *pb.ListEventsResponse
}

// Defaults.
const (
	// DefaultKeepaliveInterval: frequent enough to notice a dead agent
	// within a minute, rare enough to cost nothing at 5,000 agents.
	DefaultKeepaliveInterval = 15 * time.Second
	// DefaultKeepaliveTimeout allows two lost keepalives.
	DefaultKeepaliveTimeout = 45 * time.Second
	// DefaultWriteTimeout: a 10k-service snapshot is a few MB, which any
	// live peer takes in well under this.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultAckTimeout: a full iptables restore of 10k services takes
	// about 5 s here; this leaves a wide margin for a loaded node.
	DefaultAckTimeout = 5 * time.Minute
	// DefaultAdmissionRate lets 5,000 agents back in within 5 s of a
	// restart, while a stream start (TLS, token review, first response)
	// costs about a millisecond of CPU: a stampede takes at most half of
	// a 2-core replica.
	DefaultAdmissionRate = 1000
	// DefaultAdmissionBurst admits a small cluster's agents at once.
	DefaultAdmissionBurst = 100
)

func (o Options) withDefaults() Options {
	if o.KeepaliveInterval <= 0 {
		o.KeepaliveInterval = DefaultKeepaliveInterval
	}
	if o.KeepaliveTimeout <= 0 {
		o.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = DefaultAckTimeout
	}
	if o.AdmissionRate <= 0 {
		o.AdmissionRate = DefaultAdmissionRate
	}
	if o.AdmissionBurst <= 0 {
		o.AdmissionBurst = DefaultAdmissionBurst
	}
	return o
}
