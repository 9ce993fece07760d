// Package flowsuite proves, with real packets, that proxyplane forwards
// like upstream kube-proxy: one table-driven suite of packet flows that
// runs unchanged against every dataplane.
//
// The suite builds a cluster in network namespaces (internal/nstest): two
// nodes in two zones ("zone-a" and "zone-b") with two pods each, a client
// outside the cluster, and routes between them. Services and
// EndpointSlices are written as Kubernetes objects; the control plane's
// own code (controlplane/compute and controlplane/table) turns them into
// each node's table, as the control plane would serve it, and a real node
// agent per node (nodeagent/agent, with its cache, healthCheckNodePort
// server and conntrack cleaner) applies it to the dataplane under test in
// that node's namespace. Every case then sends TCP or UDP from a pod, a
// node or the client and checks which backend answered and what source
// address it saw, or that the traffic was refused or dropped.
//
// Only the API server and the gRPC stream are left out, so a failure
// points at the computation or the dataplane; the e2e suite covers the
// rest.
//
// The package has no code outside its tests: run it with
//
//	go test ./internal/flowsuite/
//
// as root (CI is); without root every test skips and says why.
package flowsuite
