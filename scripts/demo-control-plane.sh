#!/usr/bin/env bash
# Part of `make demo`: a control plane on SQLite in the operator namespace,
# the demo router enrolled in it, and a simulated fleet reporting to it.
set -euo pipefail
DEMO="$1"
PORT="$2"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TRUEUP="$ROOT/.venv/bin/trueup"
OPNS=trueup-demo-op
NS=trueup-demo
URL="http://198.51.100.1:$PORT"
DB="sqlite:///$DEMO/control-plane.db"
op() { ip netns exec "$OPNS" env PYTHONPATH="$ROOT" "$@"; }

"$TRUEUP" server tenant create demo --db "$DB" >/dev/null
ADMIN=$("$TRUEUP" server token create --tenant demo --user admin --role admin --db "$DB" | tail -1 | awk '{print $NF}')
# Kept in files (0600), never in a command line that `ps` would show.
(umask 077; echo "$ADMIN" > "$DEMO/admin-token"
 echo "Authorization: Bearer $ADMIN" > "$DEMO/admin-auth.header")
unset ADMIN
"$TRUEUP" server device enroll --tenant demo --device edge-01 --url "$URL" \
  --out "$DEMO/edge-01.bundle" --db "$DB" >/dev/null

# Started directly (not through a shell function) so that $! is the server's own PID.
ip netns exec "$OPNS" env PYTHONPATH="$ROOT" "$TRUEUP" server run --db "$DB" \
  --listen "198.51.100.1:$PORT" > "$DEMO/control-plane.log" 2>&1 &
echo $! > "$DEMO/control-plane.pid"
for _ in $(seq 100); do
  op curl -sf "$URL/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

# Revision 1 of the demo router is the demo document.
op "$ROOT/.venv/bin/python" - "$URL" "$DEMO/admin-token" "$DEMO/desired.yaml" <<'PY'
import sys, httpx, yaml
url, token_file, path = sys.argv[1:4]
token = open(token_file).read().strip()
doc = yaml.safe_load(open(path))
h = {"Authorization": f"Bearer {token}"}
httpx.post(url + "/api/v1/devices", json={"name": "edge-01"}, headers=h)
r = httpx.put(url + "/api/v1/devices/edge-01/desired", json=doc, headers={**h, "If-Match": "0"})
r.raise_for_status()
PY

# The installer's part: the management address, so the router can enroll.
ip -n "$NS" link set mgmt0 up
ip -n "$NS" addr add 198.51.100.2/24 dev mgmt0 2>/dev/null || true
ip netns exec "$NS" "$TRUEUP" agent enroll --bundle "$DEMO/edge-01.bundle" \
  --token-file "$DEMO/device-token" >/dev/null

ip netns exec "$OPNS" env PYTHONPATH="$ROOT" "$ROOT/.venv/bin/python" -m scripts.simulate_fleet \
  "$URL" "$DEMO/admin-token" --devices 40 --interval 10 > "$DEMO/fleet.log" 2>&1 &
echo $! > "$DEMO/fleet.pid"

cat > "$DEMO/control-plane.txt" <<TXT

Control plane (SQLite, $DB) at $URL in namespace $OPNS, with 40 simulated devices:
  export TRUEUP_SERVER=$URL TRUEUP_TOKEN_FILE=$DEMO/admin-token
  ip netns exec $OPNS $TRUEUP fleet                          # every device: status, versions, last report
  ip netns exec $OPNS $TRUEUP fleet list --status drift -o json
  ip netns exec $OPNS $TRUEUP fleet show edge-01
  ip netns exec $OPNS curl -s -H @$DEMO/admin-auth.header $URL/api/v1/devices | python3 -m json.tool | less
  ip netns exec $OPNS curl -s -H @$DEMO/admin-auth.header "$URL/api/v1/devices?status=drift"
  ip netns exec $OPNS curl -s -H @$DEMO/admin-auth.header $URL/api/v1/devices/edge-01
  # a new revision for the real router (If-Match: the current version, 2 after the fleet change):
  ip netns exec $OPNS curl -s -X PUT -H @$DEMO/admin-auth.header -H "If-Match: 2" \\
       -H "Content-Type: application/yaml" --data-binary @$DEMO/desired.yaml $URL/api/v1/devices/edge-01/desired
  $TRUEUP server audit verify --db $DB
  $TRUEUP server notify --help                 # webhooks for drift, failures, escalation (docs/notifications.md)

Dashboard: $URL/ — sign in with the token in $DEMO/admin-token (docs/dashboard.md).
It listens inside namespace $OPNS; with a display, open it there:
  ip netns exec $OPNS chromium --no-sandbox --user-data-dir=\$(mktemp -d) $URL/
TXT
