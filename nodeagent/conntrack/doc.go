// Package conntrack deletes stale UDP conntrack flows after the node
// agent has programmed a proxy table, as kube-proxy's conntrack reconciler
// does (pkg/proxy/conntrack, CleanStaleEntries, after every rule sync).
//
// # Why
//
// NAT is decided by a flow's first packet only: the kernel records the
// choice in the flow's conntrack entry and applies it to every later packet
// of the flow, without looking at the rules again. A TCP client notices a
// dead endpoint (a reset or a timeout) and reconnects from a new source
// port, which is a new flow. A UDP client usually does not: a resolver
// sending to a DNS ClusterIP from one long-lived socket keeps refreshing
// the same entry (for up to 120 s after each datagram once it has seen
// replies), so its datagrams keep going to the endpoint the first one chose
// after that endpoint is gone, and a flow recorded while the Service had no
// rules or no endpoints keeps going nowhere after endpoints appear.
// Deleting the entry makes the next datagram a new flow, which the current
// rules send to a live endpoint.
//
// # Which flows
//
// Clean follows upstream's current filter: the service port and the
// endpoint's target port are part of the match (kubernetes #130484 and
// #130542, in 1.33 and later), and ports without endpoints are cleaned too
// (#139629, merged in June 2026 as a regression fix; v1.36.4, like every
// release without it, skips such ports). For one IP family it indexes every UDP service port
// of the table that has a cluster IP of the family, with the port's
// serving endpoints of the family, and deletes a UDP flow when
//
//   - its original destination IP and port is one of that port's
//     frontends (the cluster IP, an external IP or a load balancer IP, at
//     the service port), and its reply source IP and port is none of the
//     port's endpoints; or
//   - its original destination port is that port's NodePort, whatever the
//     destination address, and its reply source is none of the endpoints.
//
// The reply source of a DNATed flow is the endpoint it was sent to; that
// of a flow that was never DNATed (recorded before the Service had rules)
// is the frontend itself, so it is stale too. Consequences, all as
// upstream:
//
//   - A service port without endpoints is cleaned against an empty set:
//     every UDP flow to it is deleted, so its clients' next datagrams meet
//     the rules for a Service without endpoints (rejected) instead of
//     following a flow to an endpoint that is gone. Upstream skipped such
//     ports from 1.32 until kubernetes #139629 (a regression fix, 2026;
//     not in v1.36.4), which left one-way senders pinned to the last
//     endpoint for as long as they kept sending (kubernetes #139628: a
//     statsd Service black-holed for 13 hours). internal/flowsuite's "a
//     UDP flow is refused ... when its Service scales to zero" shows it
//     in every mode, and fails with v1.36.4's rule.
//   - TCP and SCTP flows are never touched: their clients reconnect, and
//     deleting them would cut connections to terminating endpoints that
//     graceful termination keeps alive.
//   - A NodePort is matched by port alone, whatever the destination
//     address, so a UDP flow through the node to any address at that port
//     that was not DNATed to one of its endpoints is deleted too.
//   - A flow keeps any serving endpoint of the Service, whatever
//     topology, traffic policies and terminating state say, so that a UDP
//     flow lives as long as a TCP connection would: the endpoints the node
//     uses (cluster_endpoints, local_endpoints) and, when those leave some
//     out, the Service's udp_serving_endpoints. A topology change or a
//     terminating endpoint decides where new flows go, not where old ones
//     end (internal/flowsuite's "a UDP flow keeps ..." cases).
//   - Nothing is judged from what changed since the last Clean: the table
//     alone decides, so a restarted agent, which remembers nothing of the
//     kernel, cleans exactly as a long-running one.
//
// # Differences from upstream
//
//   - A frontend claimed by two Services (the same external IP and port)
//     keeps the endpoints of both, where upstream keeps one Service's in
//     map order, so the outcome does not depend on that order.
//   - Flows are read first and the kernel is asked to delete only when some
//     are stale, as upstream v1.36 does, and a table with no UDP frontend
//     is not read at all. Upstream's delete request matches the listed
//     stale flows by their exact tuples; this one re-applies the decision
//     to each flow it dumps, so a flow that turned stale between the two
//     dumps is deleted too, and one the new rules created is kept.
//   - An interrupted list (NLM_F_DUMP_INTR: the table changed during the
//     dump) is retried twice (upstream: four times) before Clean works
//     with the flows read, as upstream then does, and is
//     reported (IsInterrupted) rather than only logged, so the caller can
//     count it; an interrupted delete is reported the same way.
//   - A flow of the other family is never deleted, even at a NodePort;
//     upstream relies on the kernel listing one family only.
//   - The number of deleted flows is returned, for the agent's metric (the
//     counterpart of kubeproxy_conntrack_reconciler_deleted_entries_total);
//     the package itself exports no metrics.
//
// # Kernel access
//
// Cleaner talks to the kernel through netlink (NETLINK_NETFILTER) with
// github.com/vishvananda/netlink, the library kube-proxy uses: no conntrack
// binary is needed. New works in the agent's own network namespace;
// NewWithHandle takes a handle opened elsewhere (netlink.NewHandleAt), which
// is how the tests clean a namespace built by internal/nstest.
package conntrack
