"""SIGKILL at every journal step: restart restores exactly the old state and says so."""

from __future__ import annotations

import json

import pytest

from tests.routers import Router, base_document

pytestmark = pytest.mark.root

FAULT_POINTS = [
    "begin",
    "step:management",
    "applied:management",
    "step:links",
    "applied:links",
    "step:addresses",
    "applied:addresses",
    "step:routes",
    "applied:routes",
    "before-commit",
]


def _v2() -> dict:
    return base_document(
        management={
            "interface": "mgmt0",
            "addresses": ["198.51.100.2/24", "198.51.100.3/24"],
            "gateway": "198.51.100.1",
        },
        interfaces=[
            {
                "name": "lan0",
                "mtu": 1300,
                "state": "up",
                "addresses": ["203.0.113.2/24", "2001:db8:1::2/64"],
            }
        ],
        routes=[
            {"to": "192.0.2.0/24", "via": "203.0.113.250"},
            {"to": "192.0.2.128/25", "via": "203.0.113.251", "table": "wan2"},
        ],
    )


def _codes(router: Router) -> list[str]:
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    return [f["code"] for f in status["reason_codes"]]


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_sigkill_at_each_journal_step_rolls_back_on_restart(router: Router, point: str) -> None:
    v1 = router.write("v1.yaml", base_document())
    assert router.trueup("apply", str(v1)).returncode == 0
    old = router.snapshot()

    v2 = router.write("v2.yaml", _v2())
    killed = router.trueup("apply", str(v2), env={"TRUEUP_FAULT": point})
    assert killed.returncode in (-9, 137), (killed.returncode, killed.stderr)
    # Before any restart: an open transaction with no writer is reported.
    assert "STATE_APPLY_NOT_COMPLETED" in _codes(router)

    router.start_agent()
    assert router.snapshot() == old
    status = router.api("/v1/status")
    codes = [f["code"] for f in status["reason_codes"]]
    assert codes == ["STATE_APPLY_NOT_COMPLETED"], status["reason_codes"]
    finding = status["reason_codes"][0]
    assert "rolled back" in finding["detail"]
    history = [r["type"] for r in finding["evidence"]["transaction"]["history"]]
    assert history[0] == "begin" and history[-1] == "rolled_back"
    assert status["versions"]["applied"] == 1
    # Still reported after a second restart: it comes from the journal.
    router.stop_agents()
    router.start_agent()
    assert "STATE_APPLY_NOT_COMPLETED" in _codes(router)

    # The next successful apply clears it, and v2 is applied exactly once.
    applied = router.trueup("apply", str(v2))
    assert applied.returncode == 0, applied.stderr
    assert _codes(router) == []
    assert router.addresses("lan0") == ["2001:db8:1::2/64", "203.0.113.2/24"]
    assert router.addresses("mgmt0") == ["198.51.100.2/24", "198.51.100.3/24"]
    assert json.loads(router.trueup("status", "-o", "json").stdout)["versions"]["applied"] == 2


def test_an_interrupted_apply_is_cleared_by_applying_the_same_document_again(
    router: Router,
) -> None:
    v1 = router.write("v1.yaml", base_document())
    assert router.trueup("apply", str(v1)).returncode == 0
    old = router.snapshot()
    router.ip("addr", "del", "203.0.113.1/24", "dev", "lan0")  # drift, then its re-apply dies
    killed = router.trueup("apply", str(v1), env={"TRUEUP_FAULT": "step:addresses"})
    assert killed.returncode in (-9, 137), (killed.returncode, killed.stderr)

    # Before recovery has run: nothing says it was rolled back.
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    (finding,) = [f for f in status["reason_codes"] if f["code"] == "STATE_APPLY_NOT_COMPLETED"]
    assert "was not completed" in finding["detail"], finding
    assert "rolled back" not in finding["detail"] + finding["action"], finding
    assert "Recovery will roll it back to version 1" in finding["action"], finding
    assert "was not completed" in router.trueup("status").stdout

    # The corrective action it prints: apply the same document. Recovery runs first, then
    # the apply finds nothing to change — and says the code is cleared.
    again = router.trueup("apply", str(v1))
    assert again.returncode == 0, again.stderr
    assert "version 1: unchanged" in again.stdout, again.stdout
    assert "STATE_APPLY_NOT_COMPLETED cleared" in again.stdout, again.stdout
    assert "STATE_APPLY_NOT_COMPLETED" not in _codes(router)
    assert router.snapshot() == old
    router.start_agent()
    assert "STATE_APPLY_NOT_COMPLETED" not in [
        f["code"] for f in router.api("/v1/status")["reason_codes"]
    ]
