// Package readyline is the contract between e2e-apiserver and the cluster
// package: the one JSON line the binary prints on stdout once kube-apiserver
// answers /readyz. It lives apart so that the cluster package, and so every
// test binary, links neither etcd nor kube-apiserver.
package readyline

// Line is printed by e2e-apiserver, as one line of JSON, when it is ready.
// Nothing else is printed on stdout; logs go to stderr.
type Line struct {
	// URL is kube-apiserver's HTTPS address, https://127.0.0.1:PORT.
	URL string `json:"url"`
	// Dir is the --dir the process was given, made absolute.
	Dir string `json:"dir"`
	// AdminKubeconfig authenticates as "admin" in group system:masters.
	AdminKubeconfig string `json:"adminKubeconfig"`
	// ControlplaneKubeconfig authenticates as "proxyplane-controlplane",
	// in no privileged group: RBAC objects decide what it may do.
	ControlplaneKubeconfig string `json:"controlplaneKubeconfig"`
	// CAFile is the PEM bundle that verifies the serving certificate.
	CAFile string `json:"caFile"`
	// SecurePort, EtcdClientPort and EtcdPeerPort are the ports in use, so
	// that a restart on the same Dir can ask for the same ones.
	SecurePort     int `json:"securePort"`
	EtcdClientPort int `json:"etcdClientPort"`
	EtcdPeerPort   int `json:"etcdPeerPort"`
	// PID is the process id of e2e-apiserver.
	PID int `json:"pid"`
}
