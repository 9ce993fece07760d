// Package node runs one real Kubernetes node for the box: containerd
// (with runc and the CNI plugins bridge, host-local, loopback and
// portmap) and an upstream kubelet, both inside a given network namespace
// and inside a mount namespace of their own, registered with a given API
// server.
//
// Everything a kubelet and containerd change on a host is confined or
// restored (../../../shared/docs/kernel-facts.md lists what they change):
//
//   - files: both run in one mount namespace of their own (a slave of
//     the host's, so nothing mounted in it propagates out), in which /var/lib, /var/log and /run are bind mounts of
//     directories under the node's Dir. The kubelet's hard-coded paths
//     (/var/lib/kubelet/device-plugins, /var/log/containers,
//     /var/log/pods), CNI's (/var/lib/cni) and containerd's shim sockets
//     (/run/containerd/s) all land there; the kubelet's bind mount of its
//     root dir, pod volume mounts, overlay snapshots and pod network
//     namespace mounts live and die with that mount namespace;
//   - global sysctls (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
//     kernel.panic_on_oops, kernel.keys.root_maxkeys and root_maxbytes,
//     which the kubelet sets at start): in the node's mount namespace each
//     /proc/sys file is a bind mount of a plain file, so the kubelet reads
//     and writes that file and the machine's values never change;
//     containers mount a fresh /proc and see the real ones. Start records
//     the real values and Close checks, and restores, them anyway;
//   - cgroups: the kubelet's cgroupRoot is /proxyplane-node-NAME in every
//     hierarchy, created by Start and removed by Close after every process
//     in it is killed;
//   - the network namespace: containerd's bridge cni0 and the pods' veths
//     are removed by Close; the kubelet's iptables chains (KUBE-FIREWALL,
//     KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT) stay in the namespace,
//     which its owner deletes.
//
// The pod range is given, or (Config.PodCIDR zero) the one
// kube-controller-manager's node IPAM assigns the Node: the CNI
// configuration is written once it is, and the node turns Ready then.
//
// Close stops the kubelet, kills the pods' processes, containerd and its
// shims, removes the cgroups, the bridge and Dir, and then Check proves
// that nothing is left: no process in the node's mount namespace, no
// cgroup, no mount under Dir, no host path that did not exist before, the
// sysctls as they were.
package node
