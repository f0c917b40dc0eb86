"""Simulated devices for the fleet end-to-end tests, run inside the operator namespace.

    python -m tests.integration.fleetsim URL ADMIN_TOKEN_FILE WORKDIR --devices N [--old NAME]

Creates each device with its labels (site, role) and its stored inputs (an own layer:
management and a LAN interface), enrolls it, and writes WORKDIR/fleetsim.ready. Then,
as an agent does, each device polls its desired revision and reports it: the applied
digest the revision's, the transaction committed, management ready, and the revision
confirmed when it came with a confirmation window. `--old NAME` is a device whose
agent reports an older version that supports only the management, interfaces and
routes sections. Runs until killed; WORKDIR/fleetsim.json holds the versions each
device received.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx

SITES = ("ams", "fra", "lhr", "cdg")
OLD_SECTIONS = ["management", "interfaces", "routes"]


def own_layer(n: int) -> dict[str, Any]:
    return {
        "management": {
            "interface": "mgmt0",
            "addresses": [f"198.51.100.{10 + n % 200}/24"],
        },
        "interfaces": [{"name": "lan0", "addresses": [f"203.0.113.{10 + n % 200}/24"]}],
    }


def _ok(response: httpx.Response, what: str) -> Any:
    if response.status_code >= 300:
        raise SystemExit(f"fleetsim: {what}: {response.status_code} {response.text[:300]}")
    return response.json() if response.content else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("token_file")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--old", default="")
    args = parser.parse_args()
    admin = {"Authorization": f"Bearer {Path(args.token_file).read_text().strip()}"}
    client = httpx.Client(base_url=args.url, timeout=60)
    credentials: dict[str, str] = {}
    for n in range(args.devices):
        device = f"sim-{n:03d}"
        labels = {"site": SITES[n % len(SITES)], "role": "edge"}
        _ok(
            client.post("/api/v1/devices", json={"name": device, "labels": labels}, headers=admin),
            f"create {device}",
        )
        _ok(
            client.put(
                f"/api/v1/devices/{device}/variables",
                json={"variables": {}, "own": own_layer(n)},
                headers={**admin, "If-Match": "0"},
            ),
            f"inputs of {device}",
        )
        bundle = _ok(
            client.post(f"/api/v1/devices/{device}/enrollment", headers=admin),
            f"enrollment of {device}",
        )
        exchanged = _ok(
            client.post(
                "/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
            ),
            f"enroll {device}",
        )
        credentials[device] = exchanged["credential"]
    applied = dict.fromkeys(credentials, 0)
    received: dict[str, list[int]] = {d: [] for d in credentials}
    for device, credential in credentials.items():
        _report(client, device, credential, args.old, 0, None, None)
    (args.workdir / "fleetsim.ready").write_text("ready\n")
    while True:
        changed = False
        for device, credential in credentials.items():
            auth = {"Authorization": f"Bearer {credential}"}
            with contextlib.suppress(httpx.HTTPError):
                response = client.get(
                    "/api/v1/agent/desired",
                    params={"after": applied[device], "wait": 0},
                    headers=auth,
                )
                if response.status_code != 200:
                    continue
                revision = response.json()
                version = int(revision["version"])
                applied[device] = version
                received[device].append(version)
                window = revision.get("confirm_within")
                _report(
                    client, device, credential, args.old, version, revision["content_hash"], window
                )
                changed = True
        if changed:
            state = args.workdir / "fleetsim.json"
            state.with_suffix(".tmp").write_text(json.dumps(received))
            state.with_suffix(".tmp").replace(state)
        time.sleep(0.5)


def _report(
    client: httpx.Client,
    device: str,
    credential: str,
    old: str,
    version: int,
    digest: str | None,
    window: int | None,
) -> None:
    body: dict[str, Any] = {
        "applied_version": version or None,
        "applied_digest": digest,
        "applied_origin": "control-plane" if version else None,
        "management_ready": True,
        "reason_codes": [],
        "heartbeat_interval": 600.0,
        "journal": {"last": {"version": version, "state": "commit", "outcome": "committed"}},
    }
    if device == old:
        body["agent_version"] = "0.0.9"
        body["supported_sections"] = OLD_SECTIONS
    if window and version:
        body["confirmation"] = {
            "version": version,
            "state": "confirmed",
            "reason": "management ready and the control plane reached after the apply",
        }
    with contextlib.suppress(httpx.HTTPError):
        client.post(
            "/api/v1/agent/report", json=body, headers={"Authorization": f"Bearer {credential}"}
        )


if __name__ == "__main__":
    main()
