// Package compute turns Kubernetes objects into node proxy table entries.
//
// It is pure computation: no I/O, no goroutines, no clocks. Its one idea is
// that upstream kube-proxy's choice of endpoints depends on the node only
// through the node's name and zone, and for most Services not at all. A
// Service is therefore built once into a [Service] that knows every view a
// node can have of it:
//
//   - the shared part, keyed by a topology class: the node's name if some
//     endpoint hints name it, and its zone if some endpoint hints name that
//     zone; every other node falls into the empty class. It holds the whole
//     Service with its Cluster-policy endpoints.
//   - the local part, keyed by the node's name when the Service uses local
//     endpoints (a Local traffic policy) and the node hosts some: the
//     endpoints of that node. Every other node's local part is empty.
//
// Each distinct part is encoded and hashed once, on first use, and shared by
// every node that sees it, so memory grows with services, endpoints and
// nodes, not with their product.
//
// [Service.Explain] answers why a node's view holds what it holds: it runs
// the functions that build the view with a trace recording each choice
// (topology mode and rule, terminating fallback, each candidate endpoint's
// verdict). The table path passes a nil trace, which records nothing, so
// there is one implementation of the rules, explained or not.
package compute
