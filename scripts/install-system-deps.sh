#!/usr/bin/env bash
# Installs the Debian packages trueup's tests and demo drive, when missing.
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "trueup: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
  exit 1
fi
echo "trueup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
# Kea's packaged services must not run outside the namespaces trueup manages.
for svc in kea-dhcp4-server kea-dhcp6-server kea-dhcp-ddns-server kea-ctrl-agent; do
  if command -v systemctl >/dev/null && systemctl is-enabled "$svc" >/dev/null 2>&1; then
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
done
