"""A simulated fleet for the demo: devices that enroll, receive revisions and report.

Most devices are in sync; a few drift, lag a version behind or fail to
reconcile, so the fleet view has something to show. Each device is labelled
(`site=ams` or `site=fra`, `role=edge`), looks for a newer desired revision every
second, as an agent does, and reports it applied (its digest, management ready),
so a rollout over the simulated fleet passes its gates. Runs until killed.

    python -m scripts.simulate_fleet URL ADMIN_TOKEN_FILE [--devices 40] [--interval 10]

The admin token is read from a file (never an argument: `ps` shows arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from typing import Any

import httpx


def _document(device: str, n: int) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": device},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": [f"198.51.100.{10 + n}/24"]},
            "interfaces": [{"name": "lan0", "addresses": [f"203.0.113.{10 + n}/24"]}],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("admin_token_file", help="file holding an admin API token")
    parser.add_argument("--devices", type=int, default=40)
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args()
    with open(args.admin_token_file) as stream:
        admin = {"Authorization": f"Bearer {stream.read().strip()}"}
    client = httpx.Client(base_url=args.url, timeout=30)
    credentials: dict[str, str] = {}
    roles: dict[str, str] = {}
    applied: dict[str, tuple[int, str | None]] = {}
    for n in range(args.devices):
        device = f"sim-{n:03d}"
        labels = {"site": "ams" if n % 2 == 0 else "fra", "role": "edge"}
        client.post("/api/v1/devices", json={"name": device, "labels": labels}, headers=admin)
        client.put(
            f"/api/v1/devices/{device}/desired",
            json=_document(device, n),
            headers={**admin, "If-Match": "0"},
        )
        bundle = client.post(f"/api/v1/devices/{device}/enrollment", headers=admin).json()
        exchanged = client.post(
            "/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
        )
        credentials[device] = exchanged.json()["credential"]
        roles[device] = random.choices(
            ["in_sync", "drift", "skew", "failed"], weights=[34, 3, 2, 1]
        )[0]
        applied[device] = (0, None)

    def take(device: str) -> bool:
        """Apply the device's newer desired revision if there is one (True when one came);
        a lagging device applies its first one never, any later one at once."""
        version, _digest = applied[device]
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            answer = client.get(
                "/api/v1/agent/desired",
                params={"after": version, "wait": 0},
                headers={"Authorization": f"Bearer {credentials[device]}"},
            )
            if answer.status_code == 200:
                revision = answer.json()
                newest = int(revision["version"])
                if roles[device] == "skew" and newest == 1:
                    return False
                roles[device] = "in_sync" if roles[device] == "skew" else roles[device]
                applied[device] = (newest, str(revision["content_hash"]))
                return True
        return False

    def report(device: str) -> None:
        role = roles[device]
        version, digest = applied[device]
        payload: dict[str, Any] = {
            "applied_version": version,
            "applied_digest": digest,
            "applied_origin": "control-plane" if version else None,
            "management_ready": True,
            "heartbeat_interval": args.interval,
            "reason_codes": {
                "drift": ["STATE_DRIFT_DETECTED"],
                "failed": ["STATE_RECONCILIATION_FAILED"],
            }.get(role, []),
            "subsystems": {"addresses": {"health": "degraded" if role == "drift" else "ok"}},
        }
        if role == "drift":
            payload["diff_summary"] = {"paths": ["spec.interfaces[lan0].addresses"]}
        with contextlib.suppress(httpx.HTTPError):
            client.post(
                "/api/v1/agent/report",
                json=payload,
                headers={"Authorization": f"Bearer {credentials[device]}"},
            )

    last_heartbeat = 0.0
    while True:
        heartbeat = time.monotonic() - last_heartbeat >= args.interval
        for device in credentials:
            if take(device) or heartbeat:
                report(device)
        if heartbeat:
            last_heartbeat = time.monotonic()
        time.sleep(1.0)


if __name__ == "__main__":
    main()
