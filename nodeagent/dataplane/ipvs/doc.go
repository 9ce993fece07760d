// Package ipvs is the node agent's IPVS dataplane: it programs one IP
// family of a node's proxy table into the kernel's IP Virtual Server table,
// with the structure and behaviour of kube-proxy's IPVS mode but objects of
// its own (the pp-ipvs0 link, PP- ipsets, PP-IPVS- chains), so it never
// touches kube-proxy's.
//
// The work is split by job:
//
//   - plan.go turns a proxytable.Table, with the per-port decisions of
//     package plan, into the wanted kernel state: virtual servers with
//     their real servers, the addresses bound to the dummy link, and the
//     members of each ipset. rules.go writes the few iptables
//     rules IPVS mode needs (masquerade, source ranges, drops, the access
//     filter), which depend on the configuration only; sets.go names the
//     sets and writes `ipset restore` input. All of it is pure: no I/O, no
//     goroutines, deterministic output.
//   - kernel.go declares the kernel seams (IPVS, links, sysctls, ipset)
//     as small interfaces; netlink.go implements the first three with
//     github.com/moby/ipvs and github.com/vishvananda/netlink, exec.go
//     ipset through package tool. The iptables tools and the choice of
//     their backend are package xtables', shared with the iptables
//     dataplane.
//   - dataplane.go is the Dataplane: the IPVS check at New, and the
//     engine a dataplane.Driver runs: full syncs (read the kernel, repair
//     drift), partial ones (change what differs), and graceful draining
//     of removed real servers.
//
// README.md in this directory explains the choices, where they differ from
// kube-proxy, and how to run the real-kernel packet tests on a kernel with
// IPVS.
package ipvs
