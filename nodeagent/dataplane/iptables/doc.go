// Package iptables is the node agent's iptables dataplane: it programs one
// IP family of a node's proxy table into the kernel with iptables-restore,
// with the structure and behaviour of kube-proxy's iptables mode but in
// chains of its own (PP-*), so it never touches kube-proxy's KUBE-* chains.
//
// The work is split by job:
//
//   - plan.go and render.go turn a proxytable.Table into iptables-restore
//     input, with the per-port decisions of package plan. They are pure:
//     no I/O, no goroutines, deterministic output. The input is planned
//     first and then written (to iptables-restore's stdin) Service by
//     Service, never whole in memory (README.md, "Writing the input as
//     it is rendered").
//   - package xtables runs the tools (iptables-restore, iptables-save,
//     iptables) behind its small Runner interface, and chooses between
//     the legacy and nft backends as kube-proxy's iptables-wrapper does;
//     jumps.go lists the hooks of our chains in the built-in ones.
//   - dataplane.go is the Dataplane: a dataplane.Driver running the
//     engine, which holds what the kernel holds (to rewrite only what
//     changed and prune what is gone) and forgets it after a failure.
//
// README.md in this directory explains the ruleset: every chain, why each
// hook, and the choices that are not obvious from the code.
package iptables
