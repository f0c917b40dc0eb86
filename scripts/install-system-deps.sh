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
  # No packaged daemon starts while it is installed (FRR's, Kea's, … would run
  # outside any namespace): policy-rc.d answers 101, "action forbidden".
  policy=/usr/sbin/policy-rc.d
  if [ -e "$policy" ]; then
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  else
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    trap 'rm -f "$policy"' EXIT
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    rm -f "$policy"
    trap - EXIT
  fi
fi
# Kea's, Knot's, HAProxy's, keepalived's and FRR's packaged services must not run outside the namespaces trueup
# manages: the agent runs its own instances inside the router's namespace.
if [ "$(id -u)" -eq 0 ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  for svc in kea-dhcp4-server kea-dhcp6-server kea-dhcp-ddns-server kea-ctrl-agent knot haproxy keepalived frr; do
    if systemctl is-enabled "$svc" >/dev/null 2>&1; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    fi
  done
fi
