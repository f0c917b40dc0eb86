"""Convergence on the real kernel: drift seen and healed within bounds, acks, confirm-or-rollback."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest

from tests.routers import Router, base_document

pytestmark = pytest.mark.root

LAN = "203.0.113.1/24"
FAST = {"TRUEUP_RESYNC_SECONDS": "1"}

# (change by hand, subsystem, path, netlink message, kernel shows the change)
CHANGES: list[tuple[tuple[str, ...], str, str, str, Any]] = [
    (
        ("addr", "del", LAN, "dev", "lan0"),
        "addresses",
        "spec.interfaces[lan0].addresses",
        "RTM_DELADDR",
        lambda r: LAN not in r.addresses("lan0"),
    ),
    (
        ("link", "set", "lan0", "down"),
        "links",
        "spec.interfaces[lan0].state",
        "RTM_NEWLINK",
        lambda r: not r.link("lan0")["up"],
    ),
    (
        ("route", "del", "192.0.2.0/25", "table", "100"),
        "routes",
        "spec.routes[table=100,to=192.0.2.0/25,metric=0]",
        "RTM_DELROUTE",
        lambda r: r.routes("100") == [],
    ),
    (
        ("route", "add", "198.51.100.128/25", "via", "203.0.113.250", "table", "100"),
        "routes",
        "spec.routes[table=100,to=198.51.100.128/25,metric=0]",
        "RTM_NEWROUTE",
        lambda r: "198.51.100.128/25 via 203.0.113.250" in r.routes("100"),
    ),
]


def _start(router: Router, document: dict[str, Any], **env: str) -> None:
    path = router.write("desired.yaml", document)
    applied = router.trueup("apply", str(path))
    assert applied.returncode == 0, applied.stderr
    router.start_agent(env={**FAST, **env})


def _audit(router: Router, event: str) -> list[dict[str, Any]]:
    lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def _status(router: Router) -> dict[str, Any]:
    status: dict[str, Any] = router.api("/v1/status")
    return status


def _passes(router: Router) -> int:
    return int(_status(router).get("reconcile_loop", {}).get("passes", 0))


def _wait_passes(router: Router, count: int) -> None:
    """Let the loop run `count` more full passes (the resync is 1 s here)."""
    target = _passes(router) + count
    router.wait_for(lambda: _passes(router) >= target, what=f"{count} more passes")


def _drift_finding(router: Router, subsystem: str, path: str) -> dict[str, Any] | None:
    for finding in _status(router).get("reason_codes", []):
        if (
            finding["code"] == "STATE_DRIFT_DETECTED"
            and finding["subsystem"] == subsystem
            and path in finding["paths"]
        ):
            return dict(finding)
    return None


def test_drift_is_healed_under_auto_with_attribution(router: Router) -> None:
    _start(router, base_document())
    healthy = router.snapshot()
    for change, subsystem, path, message, _changed in CHANGES:
        heals_before = len(_audit(router, "reconcile"))
        router.ip(*change)
        router.wait_for(lambda: router.snapshot() == healthy, what=f"heal after {change}")

        def audited(s: str = subsystem, before: int = heals_before) -> list[dict[str, Any]]:
            heals = _audit(router, "reconcile")[before:]
            return [h for h in heals if h["details"]["subsystem"] == s]

        # The heal's audit lines are written with its commit, just after the kernel changed.
        router.wait_for(lambda: bool(audited()), what=f"heal of {subsystem} audited")
        mine = audited()
        assert mine[0]["details"]["outcome"] == "healed"
        assert path in mine[0]["details"]["paths"]
        messages = [a.get("message") for h in mine for a in h["details"]["attribution"]]
        assert message in messages, mine
    router.wait_for(lambda: router.trueup("drift").returncode == 0, what="in sync")


def test_drift_is_reported_and_left_alone_under_notify(router: Router) -> None:
    _start(router, base_document(convergence={"default": "notify"}))
    healthy = router.snapshot()
    for change, subsystem, path, message, changed in CHANGES:
        heals_before = len(_audit(router, "reconcile"))
        router.ip(*change)
        router.wait_for(
            lambda s=subsystem, p=path: (
                _drift_finding(router, s, p) is not None
                and s in _status(router)["subsystems"]
                and "drift" in _status(router)["subsystems"][s]
            ),
            what=f"drift reported after {change}",
        )
        finding = _drift_finding(router, subsystem, path)
        assert finding is not None
        attribution = finding["evidence"]["attribution"]
        assert any(a.get("message") == message for a in attribution), attribution
        assert _status(router)["subsystems"][subsystem]["policy"] == "notify"
        _wait_passes(router, 2)
        assert changed(router), f"{change} was healed under notify"
        assert len(_audit(router, "reconcile")) == heals_before
        # an explicit reconcile still converges, whatever the policy
        healed = router.trueup("reconcile")
        assert healed.returncode == 0, healed.stderr
        assert router.snapshot() == healthy


def test_unhealable_drift_backs_off_opens_the_breaker_and_a_new_apply_closes_it(
    router: Router,
) -> None:
    _start(
        router,
        base_document(),
        TRUEUP_BACKOFF_BASE="0.05",
        TRUEUP_BREAKER_THRESHOLD="3",
        TRUEUP_BREAKER_COOLDOWN="3600",
    )
    # IPv6 switched off on lan0 flushes its IPv6 address and refuses it back: this cannot
    # heal. (A deleted link would not do: a missing link is waited for, never failed.)
    done = router.run("sysctl", "-w", "net.ipv6.conf.lan0.disable_ipv6=1")
    assert done.returncode == 0, done.stderr
    router.wait_for(
        lambda: _status(router)["subsystems"]["addresses"].get("breaker") == "open",
        what="addresses breaker open",
    )
    status = _status(router)
    addresses = status["subsystems"]["addresses"]
    assert addresses["health"] == "failed"
    assert addresses["consecutive_failures"] >= 3
    failed = [
        f
        for f in status["reason_codes"]
        if f["code"] == "STATE_RECONCILIATION_FAILED" and f["subsystem"] == "addresses"
    ]
    assert failed and "breaker open" in failed[0]["detail"], status["reason_codes"]
    attempts = [
        r["details"]["backoff_seconds"]
        for r in _audit(router, "reconcile")
        if r["details"]["subsystem"] == "addresses"
    ]
    assert attempts[:3] == [0.05, 0.1, 0.2], attempts
    opened = [r["details"]["subsystem"] for r in _audit(router, "breaker_opened")]
    assert opened.count("addresses") == 1
    # Drift detection goes on while the breaker is open.
    assert _drift_finding(router, "addresses", "spec.interfaces[lan0].addresses") is not None

    new = router.write(
        "v2.yaml", base_document(interfaces=[{"name": "lan0", "mtu": 1450, "addresses": [LAN]}])
    )
    applied = router.trueup("apply", str(new))
    assert applied.returncode == 0, applied.stderr
    status = _status(router)
    assert status["subsystems"]["addresses"]["breaker"] == "closed"
    assert not [f for f in status["reason_codes"] if f["code"] == "STATE_RECONCILIATION_FAILED"]
    assert router.link("lan0") == {"up": True, "mtu": 1450}
    assert LAN in router.addresses("lan0")


def test_competing_writer_is_contested_healing_stops_detection_continues(router: Router) -> None:
    _start(router, base_document(routes=[]), TRUEUP_FLAP_THRESHOLD="3")
    path = f"spec.interfaces[lan0].addresses[{LAN}]"  # the address, not the interface's list
    writer = router.spawn(
        "sh", "-c", f"while true; do ip addr del {LAN} dev lan0 2>/dev/null; sleep 0.2; done"
    )
    router.wait_for(
        lambda: path in _status(router)["subsystems"]["addresses"].get("contested", []),
        what="contested path",
    )
    writer.kill()
    writer.wait()
    contested = _audit(router, "contested")
    assert contested and "someone else is writing" in contested[0]["details"]["reason"]
    _wait_passes(router, 2)
    assert LAN not in router.addresses("lan0")  # no longer healed
    status = _status(router)
    assert "someone else is writing" in status["subsystems"]["addresses"]["reason"]
    assert _drift_finding(router, "addresses", "spec.interfaces[lan0].addresses") is not None
    # an explicit reconcile of the subsystem clears the mark and heals
    healed = router.trueup("reconcile", "--subsystem", "addresses")
    assert healed.returncode == 0, healed.stderr
    assert LAN in router.addresses("lan0")
    assert _status(router)["subsystems"]["addresses"]["contested"] == []


def test_ack_suppresses_healing_until_expiry_then_healing_resumes(router: Router) -> None:
    _start(router, base_document(routes=[]))
    acked = router.trueup("ack", "addresses", "--for", "4s", "--reason", "lab maintenance")
    assert acked.returncode == 0, acked.stderr
    assert "healing paused" in acked.stdout
    router.ip("addr", "del", LAN, "dev", "lan0")
    # A drift record under a live acknowledgement proves the pass saw it and did not heal.
    router.wait_for(
        lambda: "drift" in _status(router)["subsystems"]["addresses"],
        what="drift recorded",
    )
    entry = _status(router)["subsystems"]["addresses"]
    assert entry["acknowledged_until"], entry
    assert entry["acknowledgement"]["reason"] == "lab maintenance"
    assert LAN not in router.addresses("lan0")
    router.wait_for(lambda: LAN in router.addresses("lan0"), what="healed after expiry")

    def audited() -> list[str]:
        return [r["event"] for r in map(json.loads, (router.state_dir / "audit.jsonl").open())]

    def healed_after_expiry() -> bool:
        seen = audited()
        return "ack_expired" in seen and "reconcile" in seen[seen.index("ack_expired") :]

    # The heal's audit line is written with its commit, just after the kernel changed.
    router.wait_for(healed_after_expiry, what="the heal audited")
    events = audited()
    assert events.index("acknowledged") < events.index("ack_expired") < len(events) - 1
    assert "reconcile" in events[events.index("ack_expired") :]
    assert _status(router)["subsystems"]["addresses"]["acknowledged_until"] is None


def _v2() -> dict[str, Any]:
    return base_document(
        interfaces=[{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.2/24"]}],
        routes=[{"to": "192.0.2.0/24", "via": "203.0.113.250"}],
    )


def test_unsafe_apply_is_refused_and_confirm_within_the_window_keeps_it(router: Router) -> None:
    _start(router, base_document())
    before = router.snapshot()
    no_gateway = base_document()
    del no_gateway["spec"]["management"]["gateway"]
    path = router.write("v2.yaml", no_gateway)
    refused = router.trueup("apply", str(path))
    assert refused.returncode == 1
    assert "management default route via 198.51.100.1" in refused.stderr
    assert "--confirm-within" in refused.stderr
    assert router.snapshot() == before

    guarded = router.trueup("apply", str(router.write("v3.yaml", _v2())), "--confirm-within", "60")
    assert guarded.returncode == 0, guarded.stderr
    assert "pending confirmation" in guarded.stdout
    pending = _status(router)["pending_confirmation"]
    assert pending["version"] == 2 and pending["deadline"]
    assert (router.state_dir / "pending-confirm.json").exists()
    confirmed = router.trueup("confirm")
    assert confirmed.returncode == 0, confirmed.stderr
    assert _status(router)["pending_confirmation"] is None
    assert router.addresses("lan0") == ["203.0.113.2/24"]
    assert [r["details"]["version"] for r in _audit(router, "confirmed")] == [2]
    assert router.trueup("confirm").returncode == 1  # nothing left to confirm


def test_missing_confirmation_rolls_back_to_the_last_confirmed_state(router: Router) -> None:
    _start(router, base_document())
    before = router.snapshot()
    guarded = router.trueup("apply", str(router.write("v2.yaml", _v2())), "--confirm-within", "1")
    assert guarded.returncode == 0, guarded.stderr
    router.wait_for(lambda: _audit(router, "confirm_timeout") != [], what="rollback")
    assert router.snapshot() == before
    status = _status(router)
    assert status["versions"]["applied"] == 3
    assert status["pending_confirmation"] is None
    assert _audit(router, "confirm_timeout")[0]["details"]["rolled_back_to_revision"] == 1


def test_pending_confirmation_survives_sigkill_and_rolls_back_at_start(router: Router) -> None:
    _start(router, base_document())
    before = router.snapshot()
    guarded = router.trueup("apply", str(router.write("v2.yaml", _v2())), "--confirm-within", "2")
    assert guarded.returncode == 0, guarded.stderr
    deadline = time.time() + 2
    router.stop_agents(signal.SIGKILL)
    assert router.addresses("lan0") == ["203.0.113.2/24"]  # still unconfirmed v2
    while time.time() < deadline + 0.2:
        time.sleep(0.1)

    missing: list[list[str]] = []
    stop = threading.Event()

    def watch_management() -> None:
        while not stop.is_set():
            have = router.addresses("mgmt0")
            if "198.51.100.2/24" not in have:
                missing.append(have)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_management)
    watcher.start()
    try:
        router.start_agent(env=FAST)
    finally:
        stop.set()
        watcher.join()
    assert missing == []
    assert router.snapshot() == before
    status = _status(router)
    recovery = next(p for p in status["agent"]["startup"] if p["name"] == "recovery")
    assert "expired" in recovery["detail"] and "rolled back to revision 1" in recovery["detail"]
    assert status["pending_confirmation"] is None
    assert router.api("/v1/health/management")["ready"] is True
    assert not (router.state_dir / "pending-confirm.json").exists()
