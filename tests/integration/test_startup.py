"""Management first: the agent stays reachable whatever else fails at startup."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.routers import Router, base_document

pytestmark = pytest.mark.root

PLUGINS = ("--plugin", "tests.plugins:ResolverProbe", "--plugin", "tests.plugins:FailingService")
MGMT_URL = "http://198.51.100.2:7443"


def _token(router: Router) -> str:
    result = router.trueup("agent", "token", "--name", "test")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _silent_resolver(router: Router) -> None:
    """A DNS server that never answers, and the namespace's resolv.conf pointing at it."""
    etc = Path("/etc/netns") / router.name
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "resolv.conf").write_text("nameserver 127.0.0.53\noptions timeout:30 attempts:3\n")
    router.spawn(
        sys.executable,
        "-c",
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        "s.bind(('127.0.0.53',53))\nwhile True: s.recvfrom(512)\n",
    )


def test_a_cold_start_adds_missing_management_address(router_with_client: Router) -> None:
    router = router_with_client
    assert router.addresses("mgmt0") == []
    token = _token(router)
    config = router.write("desired.yaml", base_document())
    router.start_agent("--config", str(config))
    assert router.addresses("mgmt0") == ["198.51.100.2/24"]
    status, body = router.from_client(f"{MGMT_URL}/v1/health/management")
    assert status == 200 and body["ready"] is True
    status, body = router.from_client(f"{MGMT_URL}/v1/status", token)
    assert status == 200 and body["management"]["ready"] is True
    status, _ = router.from_client(f"{MGMT_URL}/v1/status")
    assert status == 401  # the management port needs a token
    phases = [p["name"] for p in body["agent"]["startup"]]
    assert phases == ["load", "management", "recovery", "subsystems", "steady"]


def test_b_absent_named_bind_never_stops_the_agent(router_with_client: Router) -> None:
    router = router_with_client
    token = _token(router)
    document = base_document()
    document["spec"]["management"]["api"] = {"port": 7443, "bind": "198.51.100.9"}
    assert router.trueup("apply", str(router.write("desired.yaml", document))).returncode == 0
    proc = router.start_agent()  # from the saved revision, whose bind address is absent
    health = router.api("/v1/health/management")
    assert health["ready"] is True
    assert health["listeners"]["bind"]["state"] == "waiting"
    assert health["listeners"]["tcp"]["state"] == "serving"
    status, _ = router.from_client(f"{MGMT_URL}/v1/status", token)
    assert status == 200  # the wildcard serves meanwhile
    router.ip("addr", "add", "198.51.100.9/24", "dev", "mgmt0")
    router.wait_for(
        lambda: router.api("/v1/health/management")["listeners"]["bind"]["state"] == "serving",
        what="named bind serving",
    )
    status, _ = router.from_client("http://198.51.100.9:7443/v1/status", token)
    assert status == 200
    router.wait_for(
        lambda: router.from_client(f"{MGMT_URL}/v1/status", token)[0] == 0,
        what="wildcard fallback closed",
    )
    # The named address disappears after it was bound: the wildcard comes back ...
    router.ip("addr", "del", "198.51.100.9/24", "dev", "mgmt0")
    router.wait_for(
        lambda: router.from_client(f"{MGMT_URL}/v1/status", token)[0] == 200,
        what="wildcard fallback back",
    )
    assert router.api("/v1/health/management")["listeners"]["bind"]["address_present"] is False
    # ... and closes again once the address returns and the named bind serves it.
    router.ip("addr", "add", "198.51.100.9/24", "dev", "mgmt0")
    router.wait_for(
        lambda: (
            router.from_client("http://198.51.100.9:7443/v1/status", token)[0] == 200
            and router.from_client(f"{MGMT_URL}/v1/status", token)[0] == 0
        ),
        what="named bind took over again",
    )
    assert proc.poll() is None


def test_c_hanging_preparation_fails_at_its_deadline_others_proceed(router: Router) -> None:
    _silent_resolver(router)
    document = base_document(convergence={"deadlines": {"resolver-probe": 2}})
    config = router.write("desired.yaml", document)
    router.start_agent("--config", str(config), *PLUGINS, wait_started=False)
    # Management is ready while the resolver still hangs.
    status = router.api("/v1/status")
    assert status["management"]["ready"] is True
    router.wait_for(
        lambda: router.api("/v1/status")["subsystems"]["resolver-probe"]["health"] == "failed",
        what="resolver-probe failed at its deadline",
    )
    status = router.api("/v1/status")
    probe = status["subsystems"]["resolver-probe"]
    assert "deadline of 2s exceeded while preparing" in probe["reason"]
    assert status["subsystems"]["addresses"]["health"] == "ok"
    assert router.addresses("lan0") == ["2001:db8:1::1/64", "203.0.113.1/24"]
    assert router.routes("100") == ["192.0.2.0/25 via 203.0.113.253"]
    services = router.api("/v1/health/services")["subsystems"]
    assert services["resolver-probe"]["health"] == "failed"
    assert services["links"]["health"] == "ok"


def test_d_failing_pending_rollback_keeps_management_reachable(
    router_with_client: Router,
) -> None:
    router = router_with_client
    token = _token(router)
    assert router.trueup("apply", str(router.write("v1.yaml", base_document()))).returncode == 0
    v2 = base_document(interfaces=[{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.2/24"]}])
    killed = router.trueup(
        "apply", str(router.write("v2.yaml", v2)), env={"TRUEUP_FAULT": "applied:addresses"}
    )
    assert killed.returncode in (-9, 137)
    router.ip("link", "del", "lan0")  # the rollback can no longer restore lan0
    router.start_agent()
    status, body = router.from_client(f"{MGMT_URL}/v1/status", token)
    assert status == 200
    assert body["management"]["ready"] is True
    findings = [f for f in body["reason_codes"] if f["code"] == "STATE_APPLY_NOT_COMPLETED"]
    assert findings, body["reason_codes"]
    assert "rollback was incomplete" in findings[0]["detail"]
    assert "lan0" in findings[0]["detail"]


def test_e_failing_optional_service_leaves_every_endpoint_served(router: Router) -> None:
    config = router.write("desired.yaml", base_document())
    router.start_agent("--config", str(config), "--plugin", "tests.plugins:FailingService")
    router.wait_for(
        lambda: (
            router.api("/v1/health/services")["subsystems"]["failing-service"]["health"] == "failed"
        ),
        what="failing-service reported failed",
    )
    import httpx

    transport = httpx.HTTPTransport(uds=str(router.state_dir / "agent.sock"))
    with httpx.Client(transport=transport, base_url="http://agent", timeout=30) as client:
        answers = {
            "health": client.get("/v1/health/management").status_code,
            "status": client.get("/v1/status").status_code,
            "drift": client.get("/v1/drift").status_code,
            "reconcile": client.post("/v1/reconcile").status_code,
            "rollback": client.post("/v1/rollback", params={"to": 1}).status_code,
            "evidence": client.get("/v1/evidence").status_code,
            "apply": client.post("/v1/apply", json=base_document()).status_code,
            "metrics": client.get("/metrics").status_code,
        }
    assert answers["health"] == 200
    assert 503 not in answers.values(), answers
    assert answers["status"] == answers["drift"] == answers["evidence"] == 200
    assert all(code < 503 or code == 500 for code in answers.values()), answers
    status = router.api("/v1/status")
    assert status["management"]["ready"] is True
    assert "daemon exited" in status["subsystems"]["failing-service"]["reason"]


def test_f_former_virtual_address_left_over_is_removed_and_reported(router: Router) -> None:
    assert router.trueup("apply", str(router.write("v1.yaml", base_document()))).returncode == 0
    router.ip("addr", "add", "203.0.113.100/24", "dev", "lan0")  # a former virtual address
    router.start_agent()
    assert "203.0.113.100/24" not in router.addresses("lan0")
    status = router.api("/v1/status")
    drift = status["agent"]["startup_drift"]
    assert any(
        d["path"] == "spec.interfaces[lan0].addresses" and "203.0.113.100/24" in d["step"]
        for d in drift
    ), drift
    audit = [
        json.loads(line) for line in (router.state_dir / "audit.jsonl").read_text().splitlines()
    ]
    assert any(r["event"] == "drift_healed" for r in audit)


def test_f_leftover_under_notify_is_healed_at_start_later_drift_only_reported(
    router: Router,
) -> None:
    document = base_document(convergence={"default": "auto", "subsystems": {"addresses": "notify"}})
    assert router.trueup("apply", str(router.write("v1.yaml", document))).returncode == 0
    router.ip("addr", "add", "203.0.113.100/24", "dev", "lan0")
    router.start_agent()
    # A start is not drift: the committed revision is restored under notify too.
    assert "203.0.113.100/24" not in router.addresses("lan0")
    # After the start, notify governs: a new leftover is reported, not removed.
    router.ip("addr", "add", "203.0.113.101/24", "dev", "lan0")
    router.wait_for(
        lambda: router.api("/v1/status")["subsystems"]["addresses"].get("drift") is not None,
        what="the later leftover seen as drift",
    )
    assert "203.0.113.101/24" in router.addresses("lan0")
    findings = router.api("/v1/drift")["reason_codes"]
    assert any(
        f["code"] == "STATE_DRIFT_DETECTED" and f["subsystem"] == "addresses" for f in findings
    )


def test_g_late_link_recovers_without_restart(router: Router) -> None:
    document = base_document(
        interfaces=[
            {"name": "lan0", "addresses": ["203.0.113.1/24"]},
            {"name": "lan1", "addresses": ["192.0.2.1/24"]},
        ],
        routes=[],
    )
    config = router.write("desired.yaml", document)
    proc = router.start_agent("--config", str(config))
    router.wait_for(
        lambda: router.api("/v1/status")["subsystems"]["links"]["health"] == "pending",
        what="links pending while lan1 is missing",
    )
    status = router.api("/v1/status")
    assert status["management"]["ready"] is True
    assert "waiting on link lan1" in status["subsystems"]["links"]["reason"]
    assert status["subsystems"]["links"]["breaker"] == "closed"
    router.ip("link", "add", "lan1", "type", "veth", "peer", "name", "lan1p")
    router.wait_for(
        lambda: router.addresses("lan1") == ["192.0.2.1/24"], what="lan1 configured", timeout=30
    )
    router.wait_for(
        lambda: router.api("/v1/status")["subsystems"]["links"]["health"] == "ok",
        what="links ok",
        timeout=30,
    )
    assert proc.poll() is None
    assert router.agents == [proc]


def test_systemd_notify_ready_status_and_watchdog(router: Router, tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    try:
        config = router.write("desired.yaml", base_document())
        router.start_agent(
            "--config",
            str(config),
            "--plugin",
            "tests.plugins:FailingService",
            env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"},
        )
        messages: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                messages.append(sock.recv(4096).decode())
            text = "\n".join(messages)
            if "failing-service failed" in text and text.count("WATCHDOG=1") >= 3:
                break
        text = "\n".join(messages)
        assert messages[0].startswith("READY=1"), messages[:3]
        assert "STATUS=management ready" in text
        assert "failing-service failed" in text, [m for m in messages if "STATUS" in m]
        assert text.count("WATCHDOG=1") >= 3
    finally:
        sock.close()


def test_preflight_reports_every_finding_and_changes_nothing(router: Router) -> None:
    assert router.trueup("apply", str(router.write("v1.yaml", base_document()))).returncode == 0
    ok = router.trueup("preflight")
    assert ok.returncode == 0, ok.stdout
    assert "management configuration: from accepted revision 1" in ok.stdout
    assert "port 7443 is free" in ok.stdout

    before = {p: p.stat().st_mtime_ns for p in router.state_dir.rglob("*")}
    missing = router.trueup("preflight", "--plugin", "tests.plugins:NeedsMissingBinary")
    assert missing.returncode == 1
    assert "trueup-test-no-such-binary not found" in missing.stdout
    assert "/nonexistent/trueup-test/hook.so missing" in missing.stdout

    router.start_agent()
    held = router.trueup("preflight")
    assert held.returncode == 0, held.stdout
    assert "held by the running agent" in held.stdout
    router.stop_agents()

    state_json = router.state_dir / "state.json"
    state_json.write_text(json.dumps({"schema": 99}))
    newer = router.trueup("preflight", "-o", "json")
    assert newer.returncode == 1
    report = json.loads(newer.stdout)
    assert any(
        f["severity"] == "blocker" and "newer trueup" in f["message"] for f in report["findings"]
    )
    after = {
        p: p.stat().st_mtime_ns
        for p in router.state_dir.rglob("*")
        if p.name
        not in (
            "state.json",
            "agent.sock",
            "lock",
            "audit.jsonl",
            "audit.head",
            "journal.jsonl",
            "applied.json",
            "api-tokens.json",
        )
    }
    assert all(before.get(p) == m for p, m in after.items() if p in before)
