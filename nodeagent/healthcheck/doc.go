// Package healthcheck serves the healthCheckNodePort of every Service
// with externalTrafficPolicy Local, as kube-proxy's service health server
// (pkg/proxy/healthcheck/service_health.go) does: a cloud load balancer
// probes the port on each node and sends the Service's traffic only to the
// nodes that answer 200, which are the nodes with endpoints to serve it
// locally (the Local policy drops traffic on the others).
//
// The agent calls Server.Sync after each successful dataplane sync, so the
// ports follow the table in force: the table's Services with
// externalTrafficPolicy Local and a non-zero health_check_node_port (the
// control plane sets it for LoadBalancer Services only, as upstream's
// NeedsHealthCheck) each get a port.
//
// # Answers
//
// A port answers any path and method. The status is 200 when the Service
// has local endpoints and the proxy is healthy (Config.Healthy, meant to
// be kube-proxy's /healthz condition without node eligibility, which
// upstream leaves out of service health checks), 503 otherwise. The body
// is upstream's, byte for byte:
//
//	{
//		"service": {
//			"namespace": "default",
//			"name": "web"
//		},
//		"localEndpoints": 2,
//		"serviceProxyHealthy": true
//	}
//
// with Content-Type application/json, X-Content-Type-Options nosniff, and
// the count again in X-Load-Balancing-Endpoint-Weight, which some load
// balancers use to weight nodes.
//
// # Counting
//
// localEndpoints is what upstream's EndpointsMap.LocalReadyEndpoints
// counts: the Service's endpoints on this node that are ready, each
// address once however many ports or target ports it serves. Endpoints
// that are only serving and terminating are not counted, although the
// dataplane still uses them when a port has nothing else: a node left with
// those fails its check, so the load balancer drains it while its
// connections finish. The endpoints come from the table's local_endpoints.
//
// Upstream runs one proxier per IP family, each knowing only the Services
// with a cluster IP of its family and only endpoints of its family, and
// each with its own health server. This package keeps that split: a
// Service gets a socket per family of its cluster IPs, and each socket
// answers with that family's count. A dual-stack Service whose pod has
// an IPv4 and an IPv6 address thus reports 1 on either family, not 2.
//
// # Addresses
//
// Each family listens on its unspecified address ("tcp4" 0.0.0.0 and
// "tcp6" [::], never a "tcp" socket that would take both families and
// collide with the other), or, when Config.NodePortAddresses holds
// prefixes of that family and no /0 among them, on each of the node's
// addresses inside them, as kube-proxy's --nodeport-addresses and the
// agent's dataplane do. With Config.NodePortAddressesFor the prefixes
// come from each table's NodeInfo: nodePortAddresses "primary" is the
// node's primary IPs, which the control plane sends. A restricted family with no matching address gets
// no socket. The node's addresses are listed again at each Sync, so the
// sockets follow address changes; when listing fails, the sockets stay
// where they were, and before any success they listen on all addresses,
// as upstream does when it cannot list them.
//
// # Failures
//
// A port that cannot be opened, typically because another process holds
// it, is logged at Error and returned by Sync as a ListenError; every
// other port is served regardless, and the next Sync tries again. Upstream
// does the same and also records a FailedToStartServiceHealthcheck event
// on the Service; the agent has no Kubernetes client, so the caller should
// report Sync's error (log, metric) and not fail the dataplane sync on it.
//
// # Differences from upstream
//
//   - No Kubernetes event on a port that cannot be opened (see Failures).
//   - Sockets are managed one by one: with --nodeport-addresses, a port
//     that fails on one node address still answers on the others, where
//     upstream closes all of a Service's sockets when one fails. Upstream
//     also lists node addresses only once, at start.
//   - Two Services with one healthCheckNodePort (the API server prevents
//     it): the first by "namespace/name" keeps the port and the other is
//     reported with ErrPortConflict; upstream opens them in map order and
//     the second fails to bind.
//   - A request that races the closing of its socket gets a bare 503;
//     upstream writes an empty 200.
//   - The count comes from local_endpoints, which the control plane fills
//     only for ports that use local endpoints (upstream's
//     UsesLocalEndpoints). Under externalTrafficPolicy Local that is every
//     port of a Service with a node port, an external IP or a load
//     balancer IP; a LoadBalancer Service with none of these
//     (allocateLoadBalancerNodePorts false and no VIP-mode ingress IP yet)
//     reports 0 where upstream counts its ready local endpoints.
//   - Per-family sockets match upstream since kubernetes#137370; before
//     it, both families' servers raced for one "tcp" socket and the loser
//     logged a bind error.
//   - The HTTP servers have a read-header timeout (upstream has none), so
//     that an idle client cannot hold a connection forever.
package healthcheck
