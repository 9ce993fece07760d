// Package nstest builds throwaway network namespaces for tests that must
// prove dataplane behaviour with real packets through the real kernel.
//
// New creates one Topology per call: one or more node namespaces where the
// dataplanes under test program their rules, each with pod namespaces on a
// bridge inside it, a client namespace outside the cluster, and a LAN
// namespace whose bridge connects the client and the nodes. Every test
// gets its own namespaces, named from a hash of the test name, the process
// id and a counter (as in "nst3f2a-81234-7-node-0"), so parallel tests and
// parallel packages never share state, and t.Cleanup deletes them even
// when the test fails. A test binary killed before its cleanups ran (by
// -timeout, say) leaves its namespaces behind; the next New in any test
// process deletes those of processes that no longer exist.
//
// With Options{Nodes: 2} (node k, its j-th pod; pods are numbered across
// the topology, so node 1's pods are 2 and 3 by default):
//
//	client namespace            LAN namespace       node-k namespace
//	+---------------------+     +-------------+     +------------------------------+
//	| eth0 192.168.100.100|     | br0 .254    |     | eth0  192.168.100.(k+1)/24   |
//	|      fd00:100::100  +-----+ fd00:100::fe|     |       fd00:100::(k+1)/64     |
//	|                     |     | client      |     | default via the LAN router   |
//	| default via node-0  |     | node0 ------+-----+ node-0                       |
//	| 198.51.100.32k/27   |     | node1 ------+-----+ node-1                       |
//	|  via node-k         |     +-------------+     | br0   10.244.(k+1).1/24      |
//	| 2001:db8:100:k::/64 |                         |       fd00:244:(k+1)::1/64   |
//	|  via node-k         |                         |   veth0 (hairpin) -- pod     |
//	+---------------------+                         |    eth0 10.244.(k+1).(10+j)  |
//	                                                |         fd00:244:(k+1)::(10+j)|
//	                                                |    default via br0           |
//	                                                | ClusterIP ranges dev eth0    |
//	                                                | other nodes' pod CIDRs       |
//	                                                |   via their node IP          |
//	                                                +------------------------------+
//
// The client reaches pods and the ClusterIP range through its default route
// via node 0, so client traffic is forwarded by a node exactly like traffic
// from outside a real cluster, and each node's external range (198.51.100.0/24
// split in /27s, Node.ExternalIP) through that node, as a load balancer
// would send a LoadBalancer IP or externalIP. Pods reach everything through
// their bridge address, like pods behind a CNI bridge, and pods of other
// nodes by their own addresses over routes between the nodes, like a
// routed pod network. The nodes' default route leads to the LAN namespace,
// a router that knows nothing beyond the LAN and answers everything sent
// to it with "unreachable": so traffic a rule should have dropped is told
// apart from traffic no rule took, which a node routes there and which
// fails at once instead of timing out. Node.Name ("node-k") is also the backend name of
// servers in the node namespace and a natural Kubernetes Node name.
// Options.Hosts adds namespaces on the LAN outside the cluster, at
// 192.168.100.200 upwards, for what the nodes must reach without Service
// rules (a control plane, say).
//
// # Kernel pitfalls handled
//
// Without each setting below, a test fails in a way that looks like a
// dataplane bug rather than a harness one.
//
//   - net.ipv4.ip_forward=1 and net.ipv6.conf.{all,default}.forwarding=1 in
//     the node: a new namespace starts with forwarding off, and forwarded
//     service traffic silently times out while the node's own traffic works.
//   - send_redirects=0 (all, default and every interface) in the node: a
//     hairpinned or same-interface forward makes the node send ICMP
//     redirects, which use up the ICMP rate-limit tokens for that peer, so a
//     later REJECT's "port unreachable" is suppressed and "connection
//     refused" turns into a timeout.
//   - accept_redirects=0 (IPv4 and IPv6) everywhere: a node routes the
//     ClusterIP ranges out of the link its client traffic comes in on, and
//     IPv6 has no send_redirects switch, so it tells the client that the
//     ClusterIP is on-link (an ICMPv6 redirect). A client that believed
//     it would then look for the ClusterIP's neighbour itself, and its
//     next datagrams would vanish.
//   - net.ipv4.icmp_ratelimit=0, net.ipv4.icmp_ratemask=0,
//     net.ipv6.icmp.ratelimit=0 and an empty net.ipv6.icmp.ratemask in every
//     namespace: REJECTs and closed UDP ports answer with ICMP errors, which
//     the kernel rate-limits per peer (burst 6) and globally (1000/s, burst
//     50). icmp_ratelimit=0 lifts only the per-peer limit: measured here,
//     100 concurrent dials through a REJECT got 6 refusals with the
//     defaults and 48 with icmp_ratelimit=0 alone, the rest timing out.
//     icmp_ratemask=0 exempts every ICMP type from both limits.
//   - route_localnet=1 in the node: NodePorts on 127.0.0.1 in iptables mode
//     DNAT loopback traffic to a pod; without it the kernel drops packets
//     with a 127/8 source leaving the loopback device (kube-proxy sets it
//     itself in that mode, so tests see the same kernel it would).
//   - rp_filter=0 (all, default and every interface) everywhere: IPv4
//     settings of a new namespace are inherited from the host namespace
//     (net.core.devconf_inherit_init_net=0), where many distributions
//     enable strict reverse-path filtering, which drops asymmetric and
//     un-NATed replies.
//   - accept_dad=0 and IFA_F_NODAD on every IPv6 address: duplicate address
//     detection keeps addresses tentative (unusable) for about a second.
//   - net.bridge.bridge-nf-call-iptables and -ip6tables=1 in the nodes (and
//     0 in the LAN namespace, which only switches): a pod
//     reaching a service whose endpoint is on the same bridge gets its reply
//     bridged directly; only bridge netfilter sends that reply through
//     conntrack so it is un-DNATed. The kernel default is already 1; it is
//     set explicitly so the tests do not depend on it.
//   - hairpin on every bridge port: a pod reaching its own service is sent
//     back out of the port it came in on, which a bridge refuses by default.
//   - multicast snooping off on the bridge: IPv6 neighbour discovery uses
//     multicast, and snooping without a querier can drop solicitations sent
//     before the bridge learned a port's membership.
//   - a route for each ClusterIP range via the node's eth0: the node's own
//     connections to a ClusterIP need a route before OUTPUT DNAT runs, or
//     connect fails with "network is unreachable".
//   - New waits until every link's operational state is up: until the
//     kernel's link watcher has run, a link's queue discipline is "noop",
//     which drops the first packets sent after the link was brought up.
//   - An IPv6 REJECT (icmp6-port-unreachable) of a TCP SYN is reported
//     about 1 s late, and there is no setting to fix it: through veths the
//     ICMPv6 error arrives while connect() still holds the socket lock, and
//     tcp_v6_err then drops it (counted as TcpExtLockDroppedIcmps), so only
//     the retransmitted SYN's error refuses the connection. IPv4 refuses at
//     once, as do UDP and "--reject-with tcp-reset". Give dials that expect
//     "connection refused" over IPv6 a timeout of 2 s or more.
//   - Dials use a fresh source port each time (a per-topology counter over
//     40000-59999, not the kernel's random choice): conntrack pins a flow to
//     the backend chosen by its first packet, so a reused port after a rule
//     change would reach the old backend.
//
// Legacy iptables takes /run/xtables.lock, shared by all namespaces, so
// tests using iptables-legacy serialise; iptables-nft (plain "iptables" on
// this machine) and nft take no lock.
//
// # Traffic
//
// ServeTCP and ServeUDP start backends that answer each connection or
// datagram with one line, "<backend> <remote ip:port>", for example
// "pod-0 192.168.100.100:40001", so a test learns which backend answered and
// which source address it saw (for masquerade and source-IP checks).
// DialTCP and DialUDP send one line and parse that reply; IsRefused,
// IsTimeout and IsUnreachable classify their errors (a REJECT refuses, a
// DROP times out). All traffic stays inside the namespaces a Topology
// created, and every dial is bounded in time.
package nstest
