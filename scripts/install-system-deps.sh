#!/usr/bin/env bash
# Installs the Debian packages trueup's tests and demo drive, when missing.
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "trueup: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "trueup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
# Kea's, Knot's, HAProxy's and keepalived's packaged services must not run outside the namespaces trueup
# manages: the agent runs its own instances inside the router's namespace.
if [ "$(id -u)" -eq 0 ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  for svc in kea-dhcp4-server kea-dhcp6-server kea-dhcp-ddns-server kea-ctrl-agent knot haproxy keepalived; do
    if systemctl is-enabled "$svc" >/dev/null 2>&1; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    fi
  done
fi
