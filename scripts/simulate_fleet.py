"""A simulated fleet for the demo: devices that enroll, receive revisions and report.

Most devices are in sync; a few drift, lag a version behind or fail to
reconcile, so the fleet view has something to show. Runs until killed.

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
    for n in range(args.devices):
        device = f"sim-{n:03d}"
        client.post("/api/v1/devices", json={"name": device}, headers=admin)
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
    while True:
        for device, credential in credentials.items():
            role = roles[device]
            payload: dict[str, Any] = {
                "applied_version": 0 if role == "skew" else 1,
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
                    headers={"Authorization": f"Bearer {credential}"},
                )
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
