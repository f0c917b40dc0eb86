"""The journal's typed records read and write their files as before: same keys, same order."""

from __future__ import annotations

import json
from pathlib import Path

from trueup.journal.limitations import add_limitation
from trueup.journal.management import (
    MANAGEMENT_FILE,
    BootFacts,
    read_management,
    write_management,
)
from trueup.journal.restore import read_record, record_path, restore_status, write_record


def test_a_restore_record_from_before_reads_back_and_reports_its_status(tmp_path: Path) -> None:
    path = record_path(tmp_path)
    path.parent.mkdir(parents=True)
    older = {"id": "abc", "state": "staged", "mode": "config-only", "archive": "/a.tar"}
    path.write_text(json.dumps(older))  # no history, no boot ID, no next step
    record = read_record(tmp_path)
    assert record == older
    status = restore_status(tmp_path)
    assert status is not None
    assert list(status) == [
        *("id", "state", "since", "mode", "archive", "reboot", "problem", "next", "waiting"),
        *("retry", "fence_held", "pending"),
    ]
    assert status["pending"] is True and status["since"] is None
    assert record is not None
    write_record(tmp_path, record, "awaiting_restart", "resumed")
    again = read_record(tmp_path)
    assert again is not None and again["state"] == "awaiting_restart"
    assert [step["state"] for step in again["history"]] == ["awaiting_restart"]
    assert set(json.loads(path.read_text())) == {*older, "boot_id", "history", "next", "since"}


def test_management_facts_without_virtual_addresses_are_written_as_before(tmp_path: Path) -> None:
    facts: BootFacts = {
        "interface": "mgmt0",
        "addresses": ["198.51.100.2/24"],
        "gateway": None,
        "api": {"port": 7443, "bind": None},
        "version": 3,
        "digest": "sha256:00",
    }
    write_management(tmp_path, facts)
    on_disk = json.loads((tmp_path / MANAGEMENT_FILE).read_text())
    assert sorted(on_disk) == sorted([*facts, "schema", "checksum"])
    assert read_management(tmp_path) == facts


def test_a_new_limitation_is_written_with_every_key(tmp_path: Path) -> None:
    add_limitation(tmp_path, "links", "links.lan0.mtu", reason="NIC", reviewed_by="alice")
    entry = json.loads((tmp_path / "limitations.json").read_text())["limitations"][0]
    assert list(entry) == sorted(  # the file holds its keys sorted
        [
            *("id", "subsystem", "path", "reason", "reviewed_by", "ticket", "added_at"),
            *("added_by", "withdrawn_at", "withdrawn_by", "withdraw_reason"),
        ]
    )
    assert entry["id"] == "L1" and entry["ticket"] is None and entry["withdrawn_at"] is None
