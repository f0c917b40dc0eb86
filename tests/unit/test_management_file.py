"""`management.json`: written at every commit, read by the fast path — never trusted when damaged."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.journal.management import (
    MANAGEMENT_FILE,
    api_bind_address,
    management_facts,
    read_management,
    write_management,
)
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.engine import Engine
from trueup.system.fake import FakeNetlink

FACTS: dict[str, Any] = {
    "interface": "mgmt0",
    "addresses": ["198.51.100.2/24", "2001:db8::2/64"],
    "gateway": "198.51.100.1",
    "api": {"port": 7443, "bind": None},
    "version": 3,
    "digest": "sha256:abc",
}


def test_round_trip_atomic_and_private(tmp_path: Path) -> None:
    write_management(tmp_path, FACTS)
    assert read_management(tmp_path) == FACTS
    assert stat.S_IMODE((tmp_path / MANAGEMENT_FILE).stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [MANAGEMENT_FILE]  # no temp file left


def _damaged(original: bytes) -> dict[str, bytes]:
    text = original.decode()
    return {
        "empty": b"",
        "truncated": original[: len(original) // 2],
        "garbled": original.replace(b'"addresses"', b'"addr\x00sses"'),
        "non-utf8": original.replace(b"mgmt0", b"mgm\xff0"),
        "not json": b"interface: mgmt0\n",
        "a list": b"[]",
        # Still valid JSON, still a valid address: only the checksum tells.
        "one digit off": text.replace("198.51.100.2/24", "198.51.100.3/24").encode(),
        "other schema": text.replace('"schema": 1', '"schema": 2').encode(),
        "no checksum": json.dumps({**FACTS, "schema": 1}).encode(),
    }


@pytest.mark.parametrize(
    "damage",
    [
        "empty",
        "truncated",
        "garbled",
        "non-utf8",
        "not json",
        "a list",
        "one digit off",
        "other schema",
        "no checksum",
    ],
)
def test_damaged_file_reads_as_none(tmp_path: Path, damage: str) -> None:
    write_management(tmp_path, FACTS)
    path = tmp_path / MANAGEMENT_FILE
    path.write_bytes(_damaged(path.read_bytes())[damage])
    assert read_management(tmp_path) is None


def test_missing_unreadable_or_not_a_file_reads_as_none(tmp_path: Path) -> None:
    assert read_management(tmp_path) is None
    assert read_management(tmp_path / "no-such-dir") is None
    (tmp_path / MANAGEMENT_FILE).mkdir()
    assert read_management(tmp_path) is None


def test_oversized_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / MANAGEMENT_FILE).write_bytes(b" " * (1 << 20))
    assert read_management(tmp_path) is None
    (tmp_path / MANAGEMENT_FILE).write_bytes(b" " * (5 << 20))
    assert read_management(tmp_path) is None


def test_management_of_thousands_of_addresses_is_read_back(tmp_path: Path) -> None:
    addresses = [f"2001:db8:{i // 256:x}:{i % 256:x}::2/64" for i in range(3000)]
    facts = {**FACTS, "addresses": addresses}
    write_management(tmp_path, facts)
    assert (tmp_path / MANAGEMENT_FILE).stat().st_size > 64 * 1024
    assert read_management(tmp_path) == facts
    # What could not be read back is never written.
    with pytest.raises(ValueError, match="reads back"):
        write_management(tmp_path, {**FACTS, "addresses": addresses * 120})
    assert read_management(tmp_path) == facts


@pytest.mark.parametrize(
    "change",
    [
        {"interface": ""},
        {"interface": "a/b"},
        {"interface": "x" * 16},
        {"addresses": []},
        {"addresses": ["198.51.100.2"]},
        {"addresses": ["not-an-address/24"]},
        {"gateway": "gw"},
        {"api": {"port": 0, "bind": None}},
        {"api": {"port": 7443, "bind": "somewhere"}},
        {"version": "3"},
    ],
)
def test_invalid_facts_are_refused_at_write(tmp_path: Path, change: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="management facts"):
        write_management(tmp_path, {**FACTS, **change})
    assert not (tmp_path / MANAGEMENT_FILE).exists()


def test_bind_address() -> None:
    assert api_bind_address(FACTS) is None
    assert api_bind_address({**FACTS, "api": {"port": 1, "bind": "management"}}) == "198.51.100.2"
    assert api_bind_address({**FACTS, "api": {"port": 1, "bind": "2001:db8::9"}}) == "2001:db8::9"


def test_facts_of_a_document_section() -> None:
    document = parse_document(base_document())
    section = document.spec.management.model_dump(mode="json")
    assert management_facts(section, version=4, digest="sha256:d") == {
        "interface": "mgmt0",
        "addresses": ["198.51.100.2/24"],
        "gateway": "198.51.100.1",
        "api": {"port": 7443, "bind": None},
        "version": 4,
        "digest": "sha256:d",
    }


def test_every_commit_writes_the_committed_management(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    engine = Engine(state, netlink_factory=lambda: kernel)
    assert engine.apply_document(parse_document(base_document())).ok
    first = read_management(state.root)
    assert first is not None and first["version"] == 1
    assert first["digest"] == state.applied().digest
    moved = base_document()
    moved["spec"]["management"]["addresses"] = ["198.51.100.2/24", "198.51.100.7/24"]
    result = engine.apply_document(parse_document(moved))
    assert result.ok, result.failed
    second = read_management(state.root)
    assert second is not None and second["version"] == 2
    assert second["addresses"] == ["198.51.100.2/24", "198.51.100.7/24"]
    assert second["digest"] == state.applied().digest
