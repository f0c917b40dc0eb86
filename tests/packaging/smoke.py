"""The smoke test every packaged control plane passes (Kubernetes manifests, compose file).

    from tests.packaging.smoke import ControlPlane, first_revision, next_revision

A `ControlPlane` is whatever runs the image: it has the URL the agent reaches it at
and runs `trueup server …` inside its container. `first_revision` creates a tenant,
an operator token and a device, enrolls an agent in a network namespace wired to
the host (the `agent_router` fixture in conftest.py), starts it and puts revision 1,
which must reach the namespace's kernel and be reported in sync. `next_revision`
puts the next one after a restart and waits for the kernel and the agent's report.
"""

from __future__ import annotations

import json
import random
import socket
from typing import Any, Protocol

import httpx

from tests.routers import Router, sh

__all__ = [
    "ControlPlane",
    "api",
    "device",
    "document",
    "first_revision",
    "free_port",
    "free_slash30",
    "next_revision",
    "put",
    "ready",
]

DEVICE = "edge-01"


class ControlPlane(Protocol):
    url: str

    def cli(self, *args: str, shell: str | None = None) -> str:
        """`trueup server …` (or a shell command) in the control plane's container; its stdout."""
        ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def free_slash30() -> tuple[str, str]:
    """A /30 of 192.0.2.0/24 no host interface uses: (host address, agent address)."""
    used = {
        info["local"]
        for link in json.loads(sh("ip", "-j", "-4", "addr").stdout or "[]")
        for info in link.get("addr_info", [])
    }
    blocks = list(range(1, 63))
    random.shuffle(blocks)
    for block in blocks:
        host, agent = f"192.0.2.{4 * block + 1}", f"192.0.2.{4 * block + 2}"
        if not {host, agent} & used:
            return host, agent
    raise AssertionError("no free /30 left in 192.0.2.0/24 on this host")


def document(lan: str, mgmt: str) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": DEVICE},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": [f"{mgmt}/30"]},
            "interfaces": [{"name": "lan0", "mtu": 1400, "addresses": [lan]}],
        },
    }


def ready(url: str) -> int:
    """/readyz's status code; 0 while nothing answers."""
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def api(url: str, token: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
    return httpx.request(
        kwargs.pop("method", "GET"), f"{url}{path}", headers=headers, timeout=30, **kwargs
    )


def device(url: str, token: str) -> dict[str, Any]:
    response = api(url, token, "/api/v1/devices")
    assert response.status_code == 200, response.text
    devices = {d["device"]: d for d in response.json()["devices"]}
    return dict(devices.get(DEVICE, {}))


def put(url: str, token: str, expected: int, doc: dict[str, Any]) -> int:
    response = api(
        url,
        token,
        f"/api/v1/devices/{DEVICE}/desired",
        method="PUT",
        json=doc,
        headers={"If-Match": str(expected)},
    )
    assert response.status_code == 201, response.text
    return int(response.json()["version"])


def first_revision(cp: ControlPlane, router: Router, agent_ip: str) -> str:
    """Tenant, token, device, an enrolled agent, revision 1 on its kernel; the operator token."""
    assert "tenant acme created" in cp.cli("tenant", "create", "acme")
    token = cp.cli(
        "token", "create", "--tenant", "acme", "--user", "ops", "--role", "operator"
    ).split()[-1]
    bundle = router.workdir / "bundle.json"
    bundle.write_text(
        cp.cli(
            shell=f"trueup server device enroll --tenant acme --device {DEVICE} "
            f"--url {cp.url} --out /tmp/bundle.json >&2 && cat /tmp/bundle.json"
        )
    )
    token_file = router.workdir / "device.token"
    fallback = router.write(
        "fallback.yaml",
        {
            **document("203.0.113.9/24", agent_ip),
            "spec": {"management": {"interface": "mgmt0", "addresses": [f"{agent_ip}/30"]}},
        },
    )
    enrolled = router.trueup(
        "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file), state=False
    )
    assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
    router.start_agent(
        "--management-fallback",
        str(fallback),
        "--control-plane",
        cp.url,
        "--token-file",
        str(token_file),
        env={"TRUEUP_HEARTBEAT_SECONDS": "0.5"},
    )

    assert put(cp.url, token, 0, document("203.0.113.1/24", agent_ip)) == 1
    router.wait_for(
        lambda: router.addresses("lan0") == ["203.0.113.1/24"],
        what="revision 1 on the kernel",
        timeout=120,
    )
    assert router.link("lan0")["mtu"] == 1400
    router.wait_for(
        lambda: device(cp.url, token).get("status") == "in_sync", what="in sync", timeout=120
    )
    return token


def next_revision(
    cp: ControlPlane, router: Router, agent_ip: str, token: str, version: int
) -> None:
    """Revision `version` (203.0.113.<version>/24 on lan0) reaches the kernel and is reported."""
    lan = f"203.0.113.{version}/24"
    assert put(cp.url, token, version - 1, document(lan, agent_ip)) == version
    router.wait_for(
        lambda: router.addresses("lan0") == [lan],
        what=f"revision {version} on the kernel",
        timeout=120,
    )
    router.wait_for(
        lambda: device(cp.url, token).get("applied_version") == version,
        what=f"the agent reports revision {version}",
        timeout=120,
    )
