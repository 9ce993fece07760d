// Package box runs proxyplane as a cluster in a box, for end-to-end tests
// and the demo: every part real, every part a process, nothing on the
// machine's own network.
//
// Start builds, with internal/nstest, node namespaces (zones zone-a,
// zone-b, ...) with backend pods behind them, a client outside the
// cluster and host-0 on the nodes' LAN. In host-0 it starts e2e-apiserver
// (a real etcd and kube-apiserver) and renders deploy/ with kustomize,
// through an overlay that sets the box's CONTROL_PLANE_ADDRESSES as
// deploy/README.md tells operators to, and server-side applies every
// object with strict field validation, so the real API server validates
// every manifest. The control plane replicas then run in host-0 with the
// Deployment's arguments, authenticated by a TokenRequest token of the
// Deployment's ServiceAccount: exactly the RBAC deploy/ grants, not
// admin. One agent per node runs in the node's namespace with the
// DaemonSet's arguments, expanded from the rendered ConfigMaps as the
// kubelet would, after the DaemonSet's init container, and dials the
// replicas on host-0's LAN address, as a real agent dials control-plane
// nodes. Both read their configuration files from the box's copies of
// their ConfigMap volumes.
//
//	test process (root namespace) --dial inside host-0--> API server, replicas
//	host-0  192.168.100.200: e2e-apiserver (127.0.0.1), controlplane-0 :9640/:9641,
//	                         controlplane-1 :9650/:9651
//	node-k  192.168.100.(k+1): nodeagent (healthz :10256, metrics 127.0.0.1:10249)
//	pod-i   10.244.(k+1).(10+j): TCP and UDP servers on 8080 answering their name
//	client  192.168.100.100: outside the cluster, routes ClusterIPs via node-0
//
// The box's helpers create Services and EndpointSlices for pods (no
// controller-manager runs), wait for tables to reach every node (ListNodes
// and WatchTable on every replica, and the agents' metrics), probe
// traffic, and stop, kill or restart any process. All waits poll a
// condition against a deadline.
//
// With Options.Kubelets the same box runs on real nodes, as proxyplane is
// installed: each node namespace runs containerd and upstream's kubelet
// (package node), kube-controller-manager and kube-scheduler run in
// host-0 beside the API server, and deploy/, applied the same way,
// becomes pods the controllers make and the kubelets run from the images
// `make images` built:
//
//	host-0  192.168.100.200: e2e-apiserver (127.0.0.1; relayed on :6443),
//	                         kube-controller-manager, kube-scheduler
//	node-0  192.168.100.1: kubelet, containerd; API server relayed on :6443;
//	                       control plane pod :9640/:9641, agent pod, pods 10.246.x.0/24
//	node-1  192.168.100.2: the same (the second control-plane node)
//	node-2  192.168.100.3: kubelet, containerd, agent pod, pods
//
// The replicas are then ControlPlanes whose Running says whether a Ready
// pod of the Deployment is on their node, and the agents Agents whose
// processes the box does not own: the scenarios use the Kubernetes API
// to roll, drain or break them.
package box
