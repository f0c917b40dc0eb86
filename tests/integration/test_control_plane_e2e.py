"""End to end: a control plane and a real agent in a namespace, over a veth.

The server runs in the operator namespace (198.51.100.1); the agent in the
router namespace reaches it over mgmt0. PUT a revision → applied on the
kernel → the fleet says in sync with matching versions; stop the agent and PUT
another → version skew and a stale heartbeat; restart → in sync again.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.routers import TRUEUP, Router, base_document

pytestmark = pytest.mark.root

PORT = 8790
URL = f"http://198.51.100.1:{PORT}"


def _server_cli(router: Router, db: str, *args: str) -> str:
    assert router.client is not None
    proc = subprocess.run(
        ["ip", "netns", "exec", router.client, *TRUEUP, "server", *args, "--db", db],
        capture_output=True,
        text=True,
        check=False,
        env=router_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def router_env() -> dict[str, str]:
    import os

    from tests.routers import REPO

    return {**os.environ, "PYTHONPATH": str(REPO)}


def _fleet(router: Router, token: str) -> dict:
    status, body = router.from_client(f"{URL}/api/v1/devices", token)
    assert status == 200, body
    return {d["device"]: d for d in body["devices"]}


def _put(router: Router, token: str, version: int, document: dict) -> int:
    status, body = router.from_client(
        f"{URL}/api/v1/devices/edge-01/desired",
        token,
        method="PUT",
        body=document,
        headers={"If-Match": str(version)},
    )
    assert status == 201, body
    return int(body["version"])


def test_revision_to_kernel_to_fleet_view_and_back(router_with_client: Router) -> None:
    router = router_with_client
    db = f"sqlite:///{router.workdir}/cp.db"
    _server_cli(router, db, "tenant", "create", "acme")
    token = (
        _server_cli(
            router, db, "token", "create", "--tenant", "acme", "--user", "ops", "--role", "operator"
        )
        .strip()
        .splitlines()[-1]
        .split()[-1]
    )
    bundle = router.workdir / "bundle.json"
    _server_cli(
        router,
        db,
        "device",
        "enroll",
        "--tenant",
        "acme",
        "--device",
        "edge-01",
        "--url",
        URL,
        "--out",
        str(bundle),
    )
    router.spawn_in_client(
        *TRUEUP,
        "server",
        "run",
        "--db",
        db,
        "--listen",
        f"198.51.100.1:{PORT}",
        log=router.workdir / "server.log",
    )
    router.wait_for(lambda: router.from_client(f"{URL}/healthz")[0] == 200, what="control plane up")

    # The installer put the management address on; the agent enrolls over it.
    router.ip("link", "set", "mgmt0", "up")
    router.ip("addr", "add", "198.51.100.2/24", "dev", "mgmt0")
    fallback = router.write("fallback.yaml", base_document(interfaces=[], routes=[]))
    token_file = router.workdir / "device.token"
    enrolled = router.trueup(
        "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file), state=False
    )
    assert enrolled.returncode == 0, enrolled.stderr
    agent_args = (
        "--management-fallback",
        str(fallback),
        "--control-plane",
        URL,
        "--token-file",
        str(token_file),
    )
    env = {"TRUEUP_HEARTBEAT_SECONDS": "0.5"}
    router.start_agent(*agent_args, env=env)

    assert _put(router, token, 0, base_document()) == 1
    router.wait_for(
        lambda: router.addresses("lan0") == ["2001:db8:1::1/64", "203.0.113.1/24"],
        what="revision 1 on the kernel",
    )
    router.wait_for(
        lambda: _fleet(router, token)["edge-01"]["status"] == "in_sync", what="fleet in sync"
    )
    view = _fleet(router, token)["edge-01"]
    assert view["applied_version"] == view["desired_version"] == 1
    assert router.api("/v1/status")["versions"]["control_plane"] == 1

    router.stop_agents()
    second = base_document(interfaces=[{"name": "lan0", "addresses": ["203.0.113.2/24"]}])
    assert _put(router, token, 1, second) == 2

    def skewed_and_stale() -> bool:
        entry = _fleet(router, token)["edge-01"]
        return {"version_skew", "heartbeat_stale"} <= set(entry["conditions"])

    router.wait_for(skewed_and_stale, what="version skew and stale heartbeat", timeout=15)
    view = _fleet(router, token)["edge-01"]
    assert "STATE_VERSION_SKEW" in view["reason_codes"]
    assert view["desired_version"] == 2 and view["applied_version"] == 1
    assert router.addresses("lan0") == ["2001:db8:1::1/64", "203.0.113.1/24"]  # still enforced

    router.start_agent(*agent_args, env=env)
    router.wait_for(
        lambda: router.addresses("lan0") == ["203.0.113.2/24"], what="revision 2 on the kernel"
    )
    router.wait_for(
        lambda: _fleet(router, token)["edge-01"]["status"] == "in_sync", what="fleet in sync again"
    )
    view = _fleet(router, token)["edge-01"]
    assert view["applied_version"] == view["desired_version"] == 2

    # A local apply on a managed device is refused without --override ...
    local = router.write("local.yaml", base_document(routes=[]))
    refused = router.trueup("apply", str(local))
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "--override" in refused.stderr and URL in refused.stderr
    assert router.routes("main") != []
    # ... and with it, it is applied and reported upstream as a local override.
    override = router.trueup("apply", str(local), "--override", "hotfix INC-7")
    assert override.returncode == 0, override.stderr
    assert router.api("/v1/status")["versions"]["applied"] == 3
    router.wait_for(
        lambda: _fleet(router, token)["edge-01"]["status"] == "local_override",
        what="fleet shows the local override",
    )
    view = _fleet(router, token)["edge-01"]
    assert view["override"]["reason"] == "hotfix INC-7"
    assert view["digest_match"] is False

    # The control plane's revision 3 — the number the local apply took — is applied.
    third = base_document(interfaces=[{"name": "lan0", "addresses": ["203.0.113.3/24"]}])
    assert _put(router, token, 2, third) == 3
    router.wait_for(
        lambda: router.addresses("lan0") == ["203.0.113.3/24"], what="revision 3 on the kernel"
    )
    router.wait_for(
        lambda: _fleet(router, token)["edge-01"]["status"] == "in_sync",
        what="in sync after the override",
    )
    view = _fleet(router, token)["edge-01"]
    assert view["applied_version"] == view["desired_version"] == 3
    assert view["digest_match"] is True and view["override"] is None
    assert view["applied_origin"] == "control-plane"
    versions = router.api("/v1/status")["versions"]
    assert versions["origin"] == "control-plane" and versions["override"] is None
