#!/usr/bin/env bash
# Installs the OS packages proxyplane's kernel tests, e2e tests and demo
# need, when missing: make, git and diff for the build; iptables (legacy
# and nft), nftables, ipset, conntrack and iproute2 for the dataplanes and
# the network namespaces. Debian's apt; run as root.
set -euo pipefail

need=(make:make git:git diff:diffutils iptables-restore:iptables iptables-legacy-restore:iptables
      conntrack:conntrack nft:nftables ipset:ipset ip:iproute2)
missing=()
for pair in "${need[@]}"; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "missing OS packages: ${pkgs}(install them, e.g. apt-get install -y ${pkgs})" >&2
  exit 1
fi
echo "installing OS packages: ${pkgs}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${pkgs}
