// Package config reads the node agent's configuration file: a
// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1, upstream's own
// type from k8s.io/kube-proxy), the file kube-proxy takes with --config
// and kubeadm writes into the kube-proxy ConfigMap.
//
// Load decodes as kube-proxy does: strictly first, then leniently (unknown
// and duplicate fields dropped) with the strict error handed back for a
// warning. FromKubeProxy maps the fields to Proxy, the settings of the
// agent that kube-proxy's configuration names, with upstream's defaults
// for what the file leaves unset. A field that applies but holds a value
// proxyplane cannot honour (a Windows mode, BridgeInterface detection) is
// an error naming it; a field set to a non-default value that has no
// meaning for the agent (the API client, the Windows section, profiling)
// is listed in File.Ignored for one warning.
package config
