#!/usr/bin/env bash
# Part of `make demo`, after the tour: a fleet change. A profile (a route to the sites'
# time servers) shared by the demo router and the simulated fleet, the devices labelled,
# the fleet plan, then a rollout in three waves: the real demo router as the canary, then
# 50 % of the rest, then the rest, each wave gated by the agents' own reports.
set -uo pipefail
DEMO="$1"
PORT="$2"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OPNS=trueup-demo-op
NS=trueup-demo
URL="http://198.51.100.1:$PORT"
fleet() {
  ip netns exec "$OPNS" env PYTHONPATH="$ROOT" TRUEUP_SERVER="$URL" \
    TRUEUP_TOKEN_FILE="$DEMO/admin-token" "$ROOT/.venv/bin/trueup" fleet "$@"
}
# One value of the JSON on stdin: `field 'd["state"]'`.
field() { "$ROOT/.venv/bin/python" -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

cat > "$DEMO/time-servers.yaml" <<'YAML'
apiVersion: trueup/v1
kind: Profile
metadata:
  name: time-servers
  priority: 50
  description: the route to the sites' NTP servers, through the LAN gateway
spec:
  selector: "site in (ams,fra)"
  variables:
    ntp_net: {type: ipv4-prefix, default: 192.0.2.128/25, description: the NTP servers' network}
    gateway: {type: ipv4, default: 203.0.113.254, description: the LAN gateway towards them}
  document:
    routes:
      - {to: "${ntp_net}", via: "${gateway}"}
YAML

# The simulated fleet creates its 40 labelled devices in the background: wait for them.
for _ in $(seq 600); do
  count=$(fleet list -l role=edge -o json 2>/dev/null | field 'len(d["devices"])' 2>/dev/null || echo 0)
  [ "$count" -ge 40 ] 2>/dev/null && break
  sleep 0.1
done

echo
echo "=== a fleet change: profile time-servers over the demo router and 40 simulated devices ==="
echo "--- trueup fleet label edge-01 site=ams role=canary   (the simulated devices: site=ams|fra, role=edge)"
fleet label edge-01 site=ams role=canary | sed 's/^/  /'
echo "--- trueup fleet plan --profile $DEMO/time-servers.yaml   (nothing stored yet; exit 2: changes)"
fleet plan --profile "$DEMO/time-servers.yaml" > "$DEMO/plan.txt"
echo "  exit $? (0 no change, 2 changes, 1 refusals)"
sed -n '1,4p' "$DEMO/plan.txt" | sed 's/^/  /'
echo "  …"
tail -1 "$DEMO/plan.txt" | sed 's/^/  /'
fleet profile create "$DEMO/time-servers.yaml" --comment "route to the time servers" > /dev/null
echo "--- trueup fleet rollout start --plan --canary edge-01 --wave 50 --wave 100 --max-unavailable 50%"
fleet rollout start --plan --canary edge-01 --wave 50 --wave 100 --max-unavailable 50% \
  --comment "route to the time servers" -o json > "$DEMO/rollout.json"
ID=$(field 'd["rollout"]["id"]' < "$DEMO/rollout.json" 2>/dev/null || true)
if [ -z "$ID" ]; then
  echo "  no rollout started:"; sed 's/^/  /' "$DEMO/rollout.json"
  exit 1
fi
echo "  rollout $ID: waves of $(field '[w["members"] for w in d["rollout"]["waves"]]' < "$DEMO/rollout.json") devices"
last=""
for _ in $(seq 1800); do  # up to 3 min: each wave waits for its devices' reports
  now=$(fleet rollout status "$ID" -o json 2>/dev/null | field 'd["state"] + " wave " + str(d["current_wave"] + 1)' 2>/dev/null || true)
  if [ -n "$now" ] && [ "$now" != "$last" ]; then echo "  $now"; last="$now"; fi
  case "$now" in completed*|paused*|aborted*|failed*) break ;; esac
  sleep 0.1
done
echo "--- trueup fleet rollout status $ID"
fleet rollout status "$ID" > "$DEMO/rollout-status.txt"
sed -n '1,9p' "$DEMO/rollout-status.txt" | sed 's/^/  /'
echo "  … ($(($(wc -l < "$DEMO/rollout-status.txt") - 9)) more devices)"
echo "--- the demo router's kernel: ip -n $NS route show 192.0.2.128/25"
ip -n "$NS" route show 192.0.2.128/25 | sed 's/^/  /'

cat >> "$DEMO/control-plane.txt" <<TXT

Fleet change (profile time-servers, rollout $ID; docs/fleet.md):
  ip netns exec $OPNS $ROOT/.venv/bin/trueup fleet rollout status $ID
  ip netns exec $OPNS $ROOT/.venv/bin/trueup fleet plan -l site=fra
  Dashboard: $URL/ui/rollouts/$ID   and   $URL/ui/profiles/time-servers
TXT
