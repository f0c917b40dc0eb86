#!/usr/bin/env bash
# `make demo`: a real trueup agent in a network namespace, reachable from an
# operator namespace over a veth, plus a control plane on SQLite with a
# simulated fleet. `make demo-stop` (or `scripts/demo.sh stop`) removes it all.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DEMO="$ROOT/demo-state"
NS=trueup-demo
OPNS=trueup-demo-op
PY="$ROOT/.venv/bin/python"
TRUEUP="$ROOT/.venv/bin/trueup"
CP_PORT=8780

stop() {
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
}

if [ "${1:-}" = "stop" ]; then
  stop
  echo "trueup demo stopped and removed (namespaces $NS, $OPNS; state kept in $DEMO)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "make demo needs root: it creates network namespaces" >&2
  exit 1
fi

stop
rm -rf "$DEMO"
mkdir -p "$DEMO"

# The router: mgmt0 towards the operator, lan0 towards a LAN (its peer up in place).
ip netns add "$NS"
ip netns add "$OPNS"
ip -n "$NS" link set lo up
ip -n "$NS" link add mgmt0 type veth peer name op0
ip -n "$NS" link set op0 netns "$OPNS"
ip -n "$OPNS" link set lo up
ip -n "$OPNS" addr add 198.51.100.1/24 dev op0
ip -n "$OPNS" link set op0 up
ip -n "$NS" link add lan0 type veth peer name lan0p
ip -n "$NS" link set lan0p up

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
  convergence:
    default: auto
YAML

TOKEN=$("$TRUEUP" agent token --name demo --state-dir "$DEMO/agent")
echo "$TOKEN" > "$DEMO/api-token"
chmod 600 "$DEMO/api-token"

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

for _ in $(seq 150); do
  if ip netns exec "$NS" "$TRUEUP" status --state-dir "$DEMO/agent" -o json 2>/dev/null \
       | grep -q '"applied": [1-9]'; then break; fi
  sleep 0.1
done

R="ip netns exec $NS $TRUEUP"
S="--state-dir $DEMO/agent"
echo
echo "=== trueup demo: an agent runs in namespace $NS ==="
$R status $S || true
cat <<TXT

Try next (as root):
  $R status $S
  $R drift $S
  ip -n $NS addr del 203.0.113.1/24 dev lan0      # drift out of band: healed in milliseconds
  $R status $S -o json | less
  ip -n $NS link set lan0 down; $R drift $S
  $R ack addresses --for 10m --reason "maintenance" $S   # stop healing, never detection
  $R plan $DEMO/desired.yaml $S
  $R apply $DEMO/desired.yaml --expect-version 99 $S   # refused: STATE_CONCURRENT_MODIFICATION, exit 3
  $R apply $DEMO/desired.yaml $S                       # managed by the control plane: exit 4, needs --override
  $R apply $DEMO/desired.yaml --override "lab test" $S # a reported local override until the next revision
  $R rollback $S                                       # same checks as apply (management guard, override)
  $R evidence --out /tmp/trueup-evidence.tar.gz $S
  $R doctor $S
  $R audit verify $S
  ip netns exec $OPNS curl -s -H "Authorization: Bearer \$(cat $DEMO/api-token)" http://198.51.100.2:7443/v1/status
TXT
if [ -f "$DEMO/control-plane.txt" ]; then cat "$DEMO/control-plane.txt"; fi
cat <<TXT

Logs: $DEMO/agent.log   Stop and clean up: make demo-stop
TXT
