// Package sysctl sets the conntrack sysctls kube-proxy sets from its
// conntrack configuration (cmd/kube-proxy/app's platformSetup): the table
// size, scaled with the CPUs, and the TCP and UDP timeouts, each written
// only when it differs from the kernel's value, so that an agent without
// the rights to write (a read-only /proc/sys) starts where an earlier
// privileged run (--init-only) has set them already. Set writes, the same
// way, the sysctls a proxy mode needs (IPVS's), for --init-only.
//
// The kernel is reached through Kernel, a seam over the /proc/sys and /sys
// files, with a fake for tests. Most nf_conntrack sysctls belong to the
// network namespace of the process writing them; nf_conntrack_max and the
// hashsize module parameter are the host's, read-only outside the host's
// namespace: there Apply leaves them, as it does when /sys is mounted
// read-only, and says so.
package sysctl
