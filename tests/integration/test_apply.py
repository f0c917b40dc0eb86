"""The agent core on the real kernel: apply, re-plan, idempotence, drift, failures."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.routers import REPO, TRUEUP, Router, base_document

pytestmark = pytest.mark.root


def _apply(router: Router, document: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return router.trueup("apply", str(router.write("desired.yaml", document)), *args)


def test_apply_from_empty_then_replan_is_noop_and_apply_is_idempotent(router: Router) -> None:
    document = base_document()
    path = router.write("desired.yaml", document)
    plan = router.trueup("plan", str(path))
    assert plan.returncode == 2, plan.stderr
    assert "add-address ifname=lan0 prefix=203.0.113.1/24" in plan.stdout

    first = router.trueup("apply", str(path))
    assert first.returncode == 0, first.stderr
    assert "version 1: committed" in first.stdout
    assert router.addresses("mgmt0") == ["198.51.100.2/24"]
    assert router.addresses("lan0") == ["2001:db8:1::1/64", "203.0.113.1/24"]
    assert router.link("lan0") == {"up": True, "mtu": 1400}
    assert "default via 198.51.100.1" in router.routes("main")
    assert "192.0.2.0/24 via 203.0.113.254" in router.routes("main")
    assert router.routes("100") == ["192.0.2.0/25 via 203.0.113.253"]

    replan = router.trueup("plan", str(path))
    assert replan.returncode == 0, replan.stdout
    assert "no changes" in replan.stdout

    before = router.snapshot()
    again = router.trueup("apply", str(path))
    assert again.returncode == 0
    assert "version 1: unchanged" in again.stdout
    assert router.snapshot() == before
    drift = router.trueup("drift")
    assert drift.returncode == 0, drift.stdout
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert status["versions"]["applied"] == 1
    assert status["management"]["ready"] is True
    assert status["reason_codes"] == []


@pytest.mark.parametrize(
    ("change", "subsystem", "path"),
    [
        (
            ("addr", "del", "203.0.113.1/24", "dev", "lan0"),
            "addresses",
            "spec.interfaces[lan0].addresses",
        ),
        (("link", "set", "lan0", "down"), "links", "spec.interfaces[lan0].state"),
        (
            ("route", "del", "192.0.2.0/25", "table", "100"),
            "routes",
            "spec.routes[table=100,to=192.0.2.0/25,metric=0]",
        ),
        (
            ("addr", "add", "203.0.113.77/24", "dev", "lan0"),
            "addresses",
            "spec.interfaces[lan0].addresses",
        ),
    ],
    ids=["addr-del", "link-down", "route-del", "addr-added-by-hand"],
)
def test_out_of_band_change_is_drift_naming_the_path(
    router: Router, change: tuple[str, ...], subsystem: str, path: str
) -> None:
    assert _apply(router, base_document()).returncode == 0
    router.ip(*change)
    drift = router.trueup("drift", "-o", "json")
    assert drift.returncode == 2, drift.stdout
    report = json.loads(drift.stdout)
    findings = [f for f in report["reason_codes"] if f["code"] == "STATE_DRIFT_DETECTED"]
    assert any(f["subsystem"] == subsystem and path in f["paths"] for f in findings), findings
    assert all(f["action"] for f in findings)
    # reconcile heals it, and drift is gone
    healed = router.trueup("reconcile")
    assert healed.returncode == 0, healed.stderr
    assert router.trueup("drift").returncode == 0


def test_failing_step_atomic_rolls_back_everything(router: Router) -> None:
    assert _apply(router, base_document()).returncode == 0
    before = router.snapshot()
    bad = base_document(
        interfaces=[{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.1/24"]}],
        routes=[{"to": "192.0.2.0/24", "via": "192.0.2.99", "dev": "lan0"}],  # not on-link
    )
    result = _apply(router, bad)
    assert result.returncode == 1
    assert "version 2 was not applied; version 1 remains (rolled back: routes:" in result.stdout
    assert "failed routes" in result.stderr
    assert router.snapshot() == before
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert status["versions"]["applied"] == 1
    assert status["journal"]["last"]["state"] == "rolled_back"


def test_failing_step_best_effort_reports_partial_update(router: Router) -> None:
    assert _apply(router, base_document()).returncode == 0
    bad = base_document(
        interfaces=[{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.1/24"]}],
        routes=[{"to": "192.0.2.0/24", "via": "192.0.2.99", "dev": "lan0"}],
    )
    result = _apply(router, bad, "--mode", "best-effort")
    assert result.returncode == 1
    assert "STATE_PARTIAL_UPDATE" in result.stderr
    assert router.link("lan0")["mtu"] == 1300  # kept what succeeded
    assert router.addresses("lan0") == ["203.0.113.1/24"]
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    partial = [f for f in status["reason_codes"] if f["code"] == "STATE_PARTIAL_UPDATE"]
    assert [f["subsystem"] for f in partial] == ["routes"]
    assert status["subsystems"]["routes"]["health"] == "failed"
    # a good apply clears it
    assert _apply(router, base_document()).returncode == 0
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert status["reason_codes"] == []


def test_two_applies_at_once_exactly_one_wins(router: Router) -> None:
    first_doc = router.write("a.yaml", base_document())
    second_doc = router.write("b.yaml", base_document(interfaces=[{"name": "lan0"}]))
    # The first writer holds the lock for 5 s at `begin` (a test-only fault point).
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRUEUP_FAULT": "begin:sleep=5"}
    holder = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            router.name,
            *TRUEUP,
            "apply",
            str(first_doc),
            "--state-dir",
            str(router.state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            lock = router.state_dir / "lock"
            if lock.exists() and lock.read_text():
                break
            time.sleep(0.05)
        loser = router.trueup("apply", str(second_doc))
        _out, err = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert holder.returncode == 0, err
    assert loser.returncode == 3, (loser.stdout, loser.stderr)
    assert "STATE_CONCURRENT_MODIFICATION" in loser.stderr
    assert router.addresses("lan0") == ["2001:db8:1::1/64", "203.0.113.1/24"]  # the winner's
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert any(f["code"] == "STATE_CONCURRENT_MODIFICATION" for f in status["reason_codes"])


def test_stale_expected_version_and_older_document_are_refused(router: Router) -> None:
    assert _apply(router, base_document()).returncode == 0
    before = router.snapshot()
    stale = _apply(router, base_document(interfaces=[]), "--expect-version", "0")
    assert stale.returncode == 3
    assert "STATE_CONCURRENT_MODIFICATION" in stale.stderr
    older = base_document()
    older["metadata"]["version"] = 1
    newer = base_document(interfaces=[{"name": "lan0", "addresses": ["203.0.113.1/24"]}])
    newer["metadata"]["version"] = 5
    assert _apply(router, newer).returncode == 0
    refused = _apply(router, older)
    assert refused.returncode == 4
    assert "STATE_VERSION_SKEW" in refused.stderr
    assert router.addresses("lan0") == ["203.0.113.1/24"]
    assert before["mgmt0"] == router.addresses("mgmt0")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["spec"]["management"].update(addresses=[42]),
            "spec.management.addresses[0]: not an IPv4/IPv6 prefix",
        ),
        (
            lambda d: d["spec"]["interfaces"][0].update(addresses=["203.0.113.300/24"]),
            "spec.interfaces[0].addresses[0]: not an IPv4/IPv6 prefix",
        ),
        (
            lambda d: d["spec"]["interfaces"][0].update(colour="blue"),
            "spec.interfaces[0].colour: unknown field",
        ),
        (
            lambda d: d["spec"]["interfaces"].append({"name": "lan0"}),
            "spec.interfaces[1].name: duplicate interface name lan0",
        ),
        (
            lambda d: d["spec"]["routes"].append({"to": "192.0.2.128/25", "via": "2001:db8::1"}),
            "spec.routes[2].via: IPv6 gateway for an IPv4 destination",
        ),
        (lambda d: d["spec"]["interfaces"][0].update(mtu="big"), "spec.interfaces[0].mtu:"),
    ],
    ids=[
        "wrong-type",
        "bad-prefix",
        "unknown-field",
        "duplicate-interface",
        "family-mismatch",
        "mtu-type",
    ],
)
def test_invalid_documents_exit_1_with_paths_and_kernel_untouched(
    router: Router, mutate, expected: str
) -> None:
    document = base_document()
    mutate(document)
    path = router.write("bad.yaml", document)
    before = router.snapshot()
    for command in ("validate", "apply", "plan"):
        result = router.trueup(command, str(path), state=command != "validate")
        assert result.returncode == 1, (command, result.stdout)
        assert expected in result.stderr, result.stderr
        assert str(path) in result.stderr
    assert router.snapshot() == before
    assert not (router.state_dir / "applied.json").exists()


def test_edited_audit_line_is_found(router: Router) -> None:
    assert _apply(router, base_document()).returncode == 0
    assert _apply(router, base_document(routes=[])).returncode == 0
    ok = router.trueup("audit", "verify")
    assert ok.returncode == 0, ok.stderr
    audit = router.state_dir / "audit.jsonl"
    lines = audit.read_text().splitlines()
    assert len(lines) >= 2
    lines[0] = lines[0].replace('"cli:0"', '"someone-else"')
    audit.write_text("\n".join(lines) + "\n")
    broken = router.trueup("audit", "verify")
    assert broken.returncode == 1
    assert "line 1" in broken.stderr and "edited" in broken.stderr
