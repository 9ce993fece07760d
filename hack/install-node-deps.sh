#!/usr/bin/env bash
# Installs what the box's real nodes (e2e/box/node, `make e2e-node`) need,
# when missing: containerd and runc (the container runtime the kubelet
# talks CRI to) and containernetworking-plugins (bridge, host-local,
# loopback and portmap, in /usr/lib/cni). Debian 12's packages: containerd
# 1.6.20, runc 1.1.5, plugins 1.1.1, the versions kernel-facts.md
# records as working here. Debian's apt; run as root. The package's
# containerd service is never started: no systemd here, and each node
# runs its own containerd.
set -euo pipefail

have() {
  command -v containerd >/dev/null && command -v ctr >/dev/null && command -v runc >/dev/null &&
    for p in bridge host-local loopback portmap; do [ -x "/usr/lib/cni/$p" ] || return 1; done
}
have && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "the box's nodes need containerd, runc and containernetworking-plugins (apt-get install -y containerd runc containernetworking-plugins) and root" >&2
  exit 1
fi
echo "installing OS packages: containerd runc containernetworking-plugins" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd runc containernetworking-plugins
have
