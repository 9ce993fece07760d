package node

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// Paths of the node's files, all under Dir. The host/ subdirectories are
// bind-mounted over the host's paths of the same name inside the node's
// mount namespace.
const (
	hostVarLib = "host/var-lib"
	hostVarLog = "host/var-log"
	hostRun    = "host/run"
	hostSysctl = "host/sysctl"
	// kubeletRoot is the kubelet's --root-dir as the node's processes see
	// it: the default, under the node's own /var/lib, so that paths the
	// kubelet hard-codes below it (device-plugins) land there too.
	kubeletRoot = "/var/lib/kubelet"
	// cniBridge is the bridge the CNI bridge plugin creates in the node's
	// network namespace; nstest's own bridge there is br0.
	cniBridge = "cni0"
	// cniBinDir is where Debian's containernetworking-plugins installs.
	cniBinDir = "/usr/lib/cni"
)

// sysctls are the global sysctls the kubelet sets at start
// (pkg/kubelet/cm's setupKernelTunables), with the value it wants: the
// node's stand-in files hold these, so it has nothing to write.
var sysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// containerdConfig renders containerd 1.6's configuration (version 2).
// Each setting beyond the paths is one kernel-facts.md found necessary on
// this machine kind, or keeps containerd off the host's paths.
func containerdConfig(dir, pauseImage string) string {
	d := filepath.Join(dir, "containerd")
	return fmt.Sprintf(`version = 2
root = %q
state = %q
# The opt plugin would create /opt/containerd on the host; the others need
# kernel features or tools this machine lacks, and only log errors.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  # No registry is reachable: the pause image is built here and imported.
  sandbox_image = %q
  # Root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj cannot be
  # written and runc dies with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  disable_apparmor = true
  # Pod network namespaces under state, inside the node's mount namespace,
  # not in the host's /run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # No systemd here: cgroupfs, as the kubelet's cgroupDriver.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, filepath.Join(d, "root"), filepath.Join(d, "state"), socketPath(dir), pauseImage,
		cniBinDir, filepath.Join(dir, "cni"))
}

// socketPath is containerd's socket, outside the bind mounts so that the
// test process (ctr, in the host's mount namespace) reaches it too.
func socketPath(dir string) string { return filepath.Join(dir, "containerd", "containerd.sock") }

// cniConfig renders the node's CNI network: a bridge with host-local
// addresses from podCIDR, and portmap for hostPort. containerd adds the
// loopback plugin itself. No IP masquerade: the box's traffic never
// leaves its namespaces, and it would add iptables rules of its own.
func cniConfig(podCIDR, gateway string) (string, error) {
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "proxyplane-e2e",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      cniBridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": podCIDR, "gateway": gateway}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": "/var/lib/cni/networks",
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding CNI configuration: %w", err)
	}
	return string(b), nil
}

// kubeletConfig renders the KubeletConfiguration. Settings with a reason
// beyond the obvious say it.
func kubeletConfig(cfg Config, cgroupRoot string) string {
	x509 := ""
	if len(cfg.ClientCA) > 0 {
		x509 = "  x509:\n    clientCAFile: " + filepath.Join(cfg.Dir, "kubelet", "client-ca.crt") + "\n"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroups are v1 here; without this: "kubelet is configured to not run on a
# host using cgroup v1".
failCgroupV1: false
# No systemd.
cgroupDriver: cgroupfs
# Its own root, so its kubepods cgroups are confined and removable.
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
address: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# Bearer tokens reviewed by the API server, and client certificates of
# Config.ClientCA (none when it is empty): the API server's own, for
# logs and exec.
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
%sauthorization:
  mode: Webhook
# No cluster DNS runs in the box, and the host's resolv.conf is not the
# pods' business.
resolvConf: ""
clusterDomain: cluster.local
# Images are imported, never pulled: the kubelet must not collect them, and
# a nearly full shared disk must not taint the node.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
# Default would be /usr/libexec/kubernetes/..., created on the host.
volumePluginDir: %s/volume-plugins
# The node's containers stop within the box's waits.
shutdownGracePeriod: 0s
`, cgroupRoot, socketPath(cfg.Dir), cfg.NodeIP, x509, kubeletRoot)
}

// labelsFlag renders labels as --node-labels wants them, sorted.
func labelsFlag(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for k, v := range labels {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
