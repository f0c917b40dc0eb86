#!/usr/bin/env bash
# `make demo`: a real trueup agent in a network namespace, reachable from an
# operator namespace over a veth, plus a control plane on SQLite with a
# simulated fleet. The router runs trueup's firewall, Kea DHCP, Knot DNS and an
# HAProxy reverse proxy; a DHCP client in a LAN namespace gets a lease and its
# name resolves, and the operator reaches a LAN web server through the proxy.
# Then a fleet change: a profile rolled out over the router (the canary wave)
# and the simulated fleet (scripts/demo-fleet-change.sh).
# `make demo-stop` (or `scripts/demo.sh stop`) removes it all.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DEMO="$ROOT/demo-state"
NS=trueup-demo
OPNS=trueup-demo-op
LANNS=trueup-demo-lan
PY="$ROOT/.venv/bin/python"
TRUEUP="$ROOT/.venv/bin/trueup"
CP_PORT=8780

stop_agent() {
  # The agent that holds the demo's state directory, whoever started it (make demo,
  # or the user restarting it as the tour shows): found by the state directory's
  # agent lock record, never by name (scripts/stop_agent.py).
  [ -d "$DEMO/agent" ] && [ -x "$PY" ] || return 0
  (cd "$ROOT" && PYTHONPATH="$ROOT" "$PY" -m scripts.stop_agent "$DEMO/agent") || true
  # The pid make demo recorded may be stale (the user stopped that agent): never signalled.
  rm -f "$DEMO/agent.pid"
}

stop() {
  stop_agent
  # Kea and Knot outlive the agent by design (DHCP goes on serving): stop them
  # by the verified pids of their supervisor records, never by name.
  if [ -d "$DEMO/agent/run" ] && [ -x "$PY" ]; then
    PYTHONPATH="$ROOT" "$PY" - "$DEMO/agent/run" <<'PY' || true
import hashlib, json, os, shutil, signal, sys, time
from pathlib import Path
from trueup.system.daemon import verified_pid
from trueup.system.kea import kea_paths
run = Path(sys.argv[1])
for record in sorted(run.glob("*/*.pid")):
    try:
        recorded = json.loads(record.read_text())
        pid = verified_pid(recorded)
    except (OSError, ValueError):
        continue
    if pid is not None:
        os.kill(pid, signal.SIGTERM)  # HAProxy's master stops its workers
        deadline = time.monotonic() + 5
        while verified_pid(recorded) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if verified_pid(recorded) is not None:
            os.kill(pid, signal.SIGKILL)
for family in (4, 6):
    socket_dir = kea_paths(run / f"kea-dhcp{family}", family).socket.parent
    if socket_dir != run / f"kea-dhcp{family}":  # a long path's socket lives under /run/trueup
        shutil.rmtree(socket_dir, ignore_errors=True)
knot = run / "knot"
if len(str(knot / "knot.sock")) > 100:  # as trueup.system.knot.knot_paths places it
    digest = hashlib.sha256(str(knot).encode()).hexdigest()[:12]
    shutil.rmtree(Path("/run/trueup") / f"knot-{digest}", ignore_errors=True)
PY
  fi
  for pidfile in "$DEMO"/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  ip netns del "$NS" 2>/dev/null || true
  ip netns del "$OPNS" 2>/dev/null || true
  ip netns del "$LANNS" 2>/dev/null || true
}

if [ "${1:-}" = "stop" ]; then
  stop
  echo "trueup demo stopped and removed (namespaces $NS, $OPNS, $LANNS; Kea, Knot and HAProxy; state kept in $DEMO)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "make demo needs root: it creates network namespaces" >&2
  exit 1
fi

stop
rm -rf "$DEMO"
mkdir -p "$DEMO"

# The router: mgmt0 towards the operator, lan0 towards a LAN namespace with a DHCP client.
ip netns add "$NS"
ip netns add "$OPNS"
ip netns add "$LANNS"
ip -n "$NS" link set lo up
ip -n "$NS" link add mgmt0 type veth peer name op0
ip -n "$NS" link set op0 netns "$OPNS"
ip -n "$OPNS" link set lo up
ip -n "$OPNS" addr add 198.51.100.1/24 dev op0
ip -n "$OPNS" link set op0 up
ip -n "$NS" link add lan0 type veth peer name lan0p
ip -n "$NS" link set lan0p netns "$LANNS"
ip -n "$LANNS" link set lo up
ip -n "$LANNS" link set lan0p up
# A web server on the LAN (203.0.113.10), published to the operator by the router's HAProxy.
ip -n "$LANNS" addr add 203.0.113.10/24 dev lan0p
mkdir -p "$DEMO/www"
echo "hello from the LAN, through trueup's reverse proxy" > "$DEMO/www/index.html"
ip netns exec "$LANNS" "$PY" -m http.server 8000 --bind 203.0.113.10 --directory "$DEMO/www" \
  > "$DEMO/www.log" 2>&1 &
echo $! > "$DEMO/www.pid"

cat > "$DEMO/desired.yaml" <<'YAML'
apiVersion: trueup/v1
kind: DeviceState
metadata: {device: edge-01}
spec:
  management:
    interface: mgmt0
    addresses: [198.51.100.2/24]
    gateway: 198.51.100.1
    api: {port: 7443}
  interfaces:
    - {name: lan0, state: up, mtu: 1500, addresses: [203.0.113.1/24, "2001:db8:1::1/64"]}
  tables: {wan2: 100}
  routes:
    - {to: 192.0.2.0/24, via: 203.0.113.254}
    - {to: 192.0.2.0/25, via: 203.0.113.253, table: wan2}
  firewall:
    chains:
      - name: input
        type: filter
        hook: input
        priority: 0
        policy: drop
        rules:
          - ct state established,related accept
          - iifname "lo" accept
          - iifname "mgmt0" tcp dport 7443 accept
          - iifname "mgmt0" tcp dport 8080 accept
          - meta l4proto { icmp, ipv6-icmp } accept
          - iifname "lan0" udp dport 67 accept
          - iifname "lan0" meta l4proto { tcp, udp } th dport 53 accept
  dhcp:
    interfaces: [lan0]
    lifetimes: {valid: 3600, renew: 900, rebind: 1800}
    options: {domain-name-servers: [203.0.113.1], domain-name: lan.test}
    subnets:
      - id: 1
        subnet: 203.0.113.0/24
        pools: [203.0.113.100-203.0.113.150]
        options: {routers: 203.0.113.1}
        reservations:
          - {hw-address: "02:00:00:00:00:aa", ip-address: 203.0.113.20, hostname: printer}
  dns:
    zone: lan.test
    listen: [203.0.113.1]
    records:
      - {name: router, type: A, value: 203.0.113.1}
      - {name: router, type: AAAA, value: "2001:db8:1::1"}
      - {name: printer, type: A, value: 203.0.113.20}
    reverse: [203.0.113.0/24]
    leases: {ttl: 60}
  proxies:
    - name: intranet
      bind: 198.51.100.2:8080
      mode: http
      backend:
        servers:
          - {name: web1, address: "203.0.113.10:8000", check: true}
  convergence:
    default: auto
YAML

mkdir -p -m 700 "$DEMO/agent"

CP_ARGS=()
if bash "$ROOT/scripts/demo-control-plane.sh" "$DEMO" "$CP_PORT"; then
  CP_ARGS=(--control-plane "http://198.51.100.1:$CP_PORT" --token-file "$DEMO/device-token")
else
  echo "(control plane not started; the agent runs standalone)"
fi

if [ ${#CP_ARGS[@]} -gt 0 ]; then
  # Enrolled: the control plane holds the revisions; the document is only the
  # installer's management fallback.
  SOURCE=(--management-fallback "$DEMO/desired.yaml")
else
  SOURCE=(--config "$DEMO/desired.yaml")
fi
ip netns exec "$NS" env PYTHONPATH="$ROOT" "$TRUEUP" agent run "${SOURCE[@]}" \
  --state-dir "$DEMO/agent" "${CP_ARGS[@]}" > "$DEMO/agent.log" 2>&1 &
echo $! > "$DEMO/agent.pid"
# The same agent, restarted by hand (tour step 4): `bash demo-state/agent-run.sh &`.
# `make demo-stop` stops whichever agent holds the state directory.
printf 'exec ip netns exec %q env PYTHONPATH=%q %q agent run' "$NS" "$ROOT" "$TRUEUP" \
  > "$DEMO/agent-run.sh"
printf ' %q' "${SOURCE[@]}" --state-dir "$DEMO/agent" "${CP_ARGS[@]}" >> "$DEMO/agent-run.sh"
printf ' >> %q 2>&1\n' "$DEMO/agent.log" >> "$DEMO/agent-run.sh"

for _ in $(seq 150); do
  if ip netns exec "$NS" "$TRUEUP" status --state-dir "$DEMO/agent" -o json 2>/dev/null \
       | grep -q '"applied": [1-9]'; then break; fi
  sleep 0.1
done
# After the agent's first start: `agent run` made $DEMO/agent a state directory.
TOKEN=$("$TRUEUP" agent token --name demo --state-dir "$DEMO/agent")
(umask 077; echo "$TOKEN" > "$DEMO/api-token"
 echo "Authorization: Bearer $TOKEN" > "$DEMO/api-auth.header")
unset TOKEN

R="ip netns exec $NS $TRUEUP"
S="--state-dir $DEMO/agent"
KNOTSOCK=$(PYTHONPATH="$ROOT" "$PY" -c 'import sys; from pathlib import Path; from trueup.system.knot import knot_paths; print(knot_paths(Path(sys.argv[1])).socket)' "$DEMO/agent/run/knot")
KDIG="ip netns exec $LANNS kdig +short +time=2 +retry=0 @203.0.113.1"

# A DHCP client on the LAN: udhcpc asks the router's Kea for a lease as "laptop",
# and the router's Knot answers for that name once the lease shows up (5 s look).
for _ in $(seq 300); do
  [ -s "$DEMO/agent/run/kea-dhcp4/kea-dhcp4.pid" ] && break
  sleep 0.1
done
LEASE=$(ip netns exec "$LANNS" udhcpc -i lan0p -n -q -f -t 5 -T 2 -s /bin/true \
          -x hostname:laptop 2>&1 | sed -n 's/.*lease of \([0-9.]*\) obtained.*/\1/p' | head -1 || true)
ANSWER=""
if [ -n "$LEASE" ]; then
  ip -n "$LANNS" addr add "$LEASE/24" dev lan0p
  for _ in $(seq 150); do
    ANSWER=$($KDIG laptop.lan.test A 2>/dev/null | grep -v '^;;' || true)
    [ -n "$ANSWER" ] && break
    sleep 0.1
  done
fi

echo
echo "=== trueup demo: an agent runs in namespace $NS ==="
$R status $S || true
echo
echo "--- firewall: table inet trueup, from spec.firewall (ip netns exec $NS nft list table inet trueup)"
ip netns exec "$NS" nft list table inet trueup 2>&1 | sed 's/^/  /' || true
echo "--- DHCP: udhcpc in namespace $LANNS asked for a lease as \"laptop\""
if [ -n "$LEASE" ]; then echo "  got $LEASE"; else echo "  no lease (see $DEMO/agent.log)"; fi
$R dhcp leases $S 2>&1 | sed 's/^/  /' || true
echo "--- DNS: kdig @203.0.113.1 laptop.lan.test (from $LANNS)"
if [ -n "$ANSWER" ]; then echo "  $ANSWER"; else echo "  no answer yet (records follow leases every 5 s)"; fi
echo "--- reverse proxy: curl http://198.51.100.2:8080/ (from $OPNS, through HAProxy to 203.0.113.10:8000)"
PAGE=""
for _ in $(seq 100); do
  PAGE=$(ip netns exec "$OPNS" curl -s --max-time 2 http://198.51.100.2:8080/ 2>/dev/null || true)
  [ -n "$PAGE" ] && break
  sleep 0.1
done
if [ -n "$PAGE" ]; then echo "  $PAGE"; else echo "  no answer yet (see $R status $S)"; fi
if [ -f "$DEMO/control-plane.txt" ]; then
  bash "$ROOT/scripts/demo-fleet-change.sh" "$DEMO" "$CP_PORT" \
    || echo "(the fleet change did not complete: see $DEMO/control-plane.log)"
fi
cat <<TXT

Try next (as root):
  export PATH=$ROOT/.venv/bin:\$PATH                # then: ip netns exec $NS trueup status $S
  $R status $S
  $R drift $S
  kill \$(cat $DEMO/agent.pid); $R status $S          # WARNING: no agent is running (healing off)
  bash $DEMO/agent-run.sh &                            # start it again (make demo-stop stops it too)
  ip -n $NS addr del 203.0.113.1/24 dev lan0      # drift out of band: healed in milliseconds
  $R status $S -o json | less
  ip -n $NS link set lan0 down; $R drift $S
  $R ack addresses --for 10m --reason "maintenance" $S   # stop healing, never detection
  $R ack addresses --clear $S                          # withdraw it
  $R plan $DEMO/desired.yaml $S
  $R apply $DEMO/desired.yaml --expect-version 99 $S   # refused: STATE_CONCURRENT_MODIFICATION, exit 3
  $R apply $DEMO/desired.yaml $S                       # managed by the control plane: exit 4, needs --override
  $R apply $DEMO/desired.yaml --override "lab test" $S # a reported local override until the next revision
  $R rollback $S                                       # same checks as apply (management guard, override)

Firewall (table inet trueup; every other table is left alone):
  ip netns exec $NS nft add rule inet trueup input tcp dport 23 accept   # drift: healed at once (auto)
  ip netns exec $NS nft list chain inet trueup input   # the rule is gone again
  $R status $S -o json | grep -A12 '"last_drift"'      # what changed and who (nft monitor)
  $R ack firewall --for 10m --reason "lab" $S          # now add the rule again: reported, not healed
  $R drift $S                                          # STATE_DRIFT_DETECTED spec.firewall.chains[input].rules[6], exit 2
  $R reconcile --subsystem firewall $S                 # heal it now
  ip netns exec $NS nft add table inet mine            # not trueup's: listed as unmanaged, never touched
  sed 's/ accept$/ acept/' $DEMO/desired.yaml > /tmp/typo.yaml; $R plan /tmp/typo.yaml $S   # nft names the rule's path, exit 1

DHCP (Kea, run by the agent) and DNS (Knot, records from the leases):
  $R dhcp leases $S                                    # read-only, even with Kea or the agent stopped
  $R dhcp fence hold --reason "restore running" $S     # Kea hands out no lease; status shows dhcp fenced
  ip netns exec $LANNS udhcpc -i lan0p -n -q -f -t 2 -T 2 -s /bin/true -x hostname:tablet   # no lease
  $R dhcp fence show $S
  $R dhcp fence lift --reason "restore verified" $S    # the same udhcpc now gets a lease
  $KDIG laptop.lan.test                 # a lease's name
  $KDIG -x ${LEASE:-203.0.113.100}                 # and its PTR
  $KDIG printer.lan.test                # a static record
  ip netns exec $NS knotc -s $KNOTSOCK zone-read lan.test   # edits here are drift

Reverse proxy (HAProxy, run by the agent; docs/proxy.md):
  ip netns exec $OPNS curl -s http://198.51.100.2:8080/     # through HAProxy to the LAN web server
  $R status $S -o json | grep -A20 '"proxy"'           # frontends bound, backend server states
  echo "# hand edit" >> $DEMO/agent/run/haproxy/haproxy.cfg   # drift: rewritten and reloaded
  sed 's/8080/8081/' $DEMO/desired.yaml > /tmp/port.yaml; $R plan /tmp/port.yaml $S   # what a change does
  (HA virtual addresses and WireGuard need a second router: docs/ha.md, docs/wireguard.md.)

Backup and restore (docs/backup-restore.md):
  $R backup create --out /tmp/edge-01.tar --with-leases $S
  sed 's/mtu: 1500/mtu: 1400/' $DEMO/desired.yaml > /tmp/mtu.yaml; $R apply /tmp/mtu.yaml --override "lab test" $S
  $R restore analyze /tmp/edge-01.tar $S               # per mode: eligible, what it changes; exit 1 when nothing is
  $R restore apply /tmp/edge-01.tar --mode config-only $S   # MTU back to 1500; the lease file byte-identical
  $R restore status $S                                 # completed; the dhcp fence lifted
  $R restore apply /tmp/edge-01.tar --mode full $S     # also the leases (the old file kept as kea-leases4.csv.pre-restore-…)
  ip netns exec $LANNS udhcpc -i lan0p -n -q -f -t 5 -T 2 -s /bin/true -x hostname:laptop   # the restored lease
  $R backup create --out /tmp/edge-01-cfg.tar $S; $R restore apply /tmp/edge-01-cfg.tar --mode full $S   # refused: no leases, exit 1

  $R evidence --out /tmp/trueup-evidence.tar.gz $S
  $R doctor $S
  $R audit verify $S
  ip netns exec $OPNS curl -s -H @$DEMO/api-auth.header http://198.51.100.2:7443/v1/status
TXT
if [ -f "$DEMO/control-plane.txt" ]; then cat "$DEMO/control-plane.txt"; fi
cat <<TXT

Logs: $DEMO/agent.log   Stop and clean up: make demo-stop
TXT
