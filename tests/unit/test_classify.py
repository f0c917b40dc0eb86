"""Every reason code from facts, and only from facts."""

from __future__ import annotations

from trueup.model.reasons import ReasonCode
from trueup.model.records import Applied
from trueup.reconcile.classify import ClassifierInput, classify
from trueup.subsystems.base import Difference

APPLIED = Applied(version=3, outcome="committed", applied_at="2026-11-30T00:00:00Z")
DIFF = Difference(
    "addresses",
    "spec.interfaces[lan0].addresses",
    ["203.0.113.1/24"],
    [],
    missing=["203.0.113.1/24"],
)


def _codes(facts: ClassifierInput) -> list[str]:
    return [f.code.value for f in classify(facts)]


def test_in_sync_has_no_codes() -> None:
    assert _codes(ClassifierInput(applied=APPLIED)) == []


def test_drift_only_when_no_transaction_runs() -> None:
    facts = ClassifierInput(applied=APPLIED, differences={"addresses": [DIFF]})
    finding = classify(facts)[0]
    assert finding.code is ReasonCode.DRIFT_DETECTED
    assert finding.paths == ["spec.interfaces[lan0].addresses"]
    assert "missing 203.0.113.1/24" in finding.detail and finding.action
    running = ClassifierInput(
        applied=APPLIED,
        differences={"addresses": [DIFF]},
        open_transaction={"txn": "t", "version": 4, "applied": []},
        open_transaction_live=True,
    )
    assert _codes(running) == []


def test_open_transaction_without_writer_or_overdue() -> None:
    txn = {"txn": "t", "version": 4, "applied": ["links"], "failed": {}}
    assert _codes(ClassifierInput(applied=APPLIED, open_transaction=txn)) == [
        "STATE_APPLY_NOT_COMPLETED"
    ]
    assert _codes(
        ClassifierInput(
            applied=APPLIED,
            open_transaction=txn,
            open_transaction_live=True,
            open_transaction_overdue=True,
        )
    ) == ["STATE_APPLY_NOT_COMPLETED"]


def test_an_open_transaction_is_told_in_the_tense_of_what_has_happened() -> None:
    txn = {"txn": "t", "version": 4, "applied": ["links"], "failed": {}}
    texts = {}
    for name, extra in {
        "gone": {},
        "recovering": {"open_transaction_recovering": True},
        "running": {"open_transaction_live": True, "open_transaction_overdue": True},
    }.items():
        (finding,) = classify(ClassifierInput(applied=APPLIED, open_transaction=txn, **extra))
        texts[name] = finding.detail + " " + finding.action
        # Nothing is rolled back yet: never "was rolled back", "rolled back at recovery".
        assert "was rolled back" not in texts[name] and "back at recovery" not in texts[name]
    assert "was not completed" in texts["gone"]
    assert "Recovery will roll it back to version 3" in texts["gone"]
    assert "recovery is rolling it back to version 3 now" in texts["recovering"]
    assert "still running past its deadline" in texts["running"]
    assert "not rolled back while it runs" in texts["running"]


def test_recovered_transaction_is_reported_with_rollback_errors() -> None:
    last = {
        "txn": "t",
        "version": 4,
        "recovered": True,
        "applied": ["links"],
        "history": [{"type": "begin"}, {"type": "rolled_back", "errors": ["lan0 gone"]}],
    }
    finding = classify(ClassifierInput(applied=APPLIED, last_transaction=last))[0]
    assert finding.code is ReasonCode.APPLY_NOT_COMPLETED
    assert "rollback was incomplete: lan0 gone" in finding.detail


def test_partial_update_explains_its_own_differences() -> None:
    applied = APPLIED.model_copy(update={"outcome": "partial", "failed": {"addresses": "EPERM"}})
    codes = _codes(ClassifierInput(applied=applied, differences={"addresses": [DIFF]}))
    assert codes == ["STATE_PARTIAL_UPDATE"]


def test_refusals_reconcile_failures_and_skew() -> None:
    facts = ClassifierInput(
        applied=APPLIED,
        refusals=[
            {
                "at": "2026-11-30T00:00:00Z",
                "actor": "cli:0",
                "details": {"message": "another writer holds the device"},
            }
        ],
        reconcile_failures={"routes": {"detail": "breaker open", "since": "x"}},
        control_plane_version=5,
        unsupported_schema="schema trueup/v2",
    )
    assert sorted(_codes(facts)) == sorted(
        [
            "STATE_CONCURRENT_MODIFICATION",
            "STATE_RECONCILIATION_FAILED",
            "STATE_VERSION_SKEW",
            "STATE_VERSION_SKEW",
        ]
    )


def test_running_transaction_hides_drift_only_in_its_own_subsystems() -> None:
    running_links = {"txn": "t", "version": 3, "applied": [], "subsystems": ["links"]}
    facts = ClassifierInput(
        applied=APPLIED,
        differences={"addresses": [DIFF], "links": [DIFF]},
        open_transaction=running_links,
        open_transaction_live=True,
    )
    assert [(f.code.value, f.subsystem) for f in classify(facts)] == [
        ("STATE_DRIFT_DETECTED", "addresses")
    ]
