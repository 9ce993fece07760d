// Package nftables is the node agent's nftables dataplane: it programs one
// IP family of a node's proxy table into a table of its own ("ip
// proxyplane" or "ip6 proxyplane") with the behaviour of kube-proxy's
// nftables mode, over netlink, one atomic transaction per Sync.
//
// The work is split by job:
//
//   - plan.go names the chains and sets of each service port, whose
//     decisions (endpoint sets, traffic policies, REJECT or DROP) package
//     plan makes for every dataplane; build.go turns them into the ruleset
//     model of model.go: chains of rules made of structured matches and
//     verdicts, sets and verdict maps.
//   - state.go holds a whole ruleset and computes the transaction from one
//     state to the next: everything (full) or the changed Services only
//     (partial). transaction.go renders transactions and rulesets as nft
//     scripts. All of this is pure: no I/O, no goroutines.
//   - netlink.go encodes a transaction as one nf_tables batch; kernel.go
//     sends it over a netlink socket in the configured network namespace
//     behind the small kernel interface, which the tests fake, and reads
//     the table's contents and the ruleset generation.
//   - dataplane.go is the Dataplane, a dataplane.Driver running this
//     package's dataplane.Backend: what the kernel holds, full and partial
//     syncs, and the drift check that tells when memory may no longer be
//     trusted.
//
// README.md in this directory explains the ruleset (every chain, why each
// hook and priority), the measurements behind the layout and the library
// choice, the drift check, and where proxyplane differs from kube-proxy.
package nftables
