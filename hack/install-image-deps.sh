#!/usr/bin/env bash
# Installs what `make images` needs, when missing: mmdebstrap, which builds
# the node agent's root filesystem from Debian's packages (it brings apt's
# keyrings and tools). Debian's apt; run as root.
set -euo pipefail

command -v mmdebstrap >/dev/null && [ -d /usr/share/mmdebstrap/hooks/merged-usr ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "make images needs mmdebstrap (apt-get install -y mmdebstrap) and root" >&2
  exit 1
fi
echo "installing OS packages: mmdebstrap" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap
