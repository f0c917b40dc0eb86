"""Backup archives: build, read, analyse; every corruption is named and changes nothing."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.routers import base_document
from trueup.backup.analysis import analyze
from trueup.backup.create import BackupError, create_backup
from trueup.backup.format import LEASES, MANIFEST
from trueup.backup.leasecsv import HEADER4
from trueup.backup.reader import ArchiveError, EntryCorrupt, open_component, read_manifest
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.engine import Engine
from trueup.system.fake import FakeNetlink

LINKS = ["lo", "mgmt0", "lan0"]


def _router(root: Path, device: str = "edge-01", leases: str | None = None) -> StateDir:
    """A state directory with two applied revisions, an audit log and a stopped Kea's memfile."""
    state = StateDir(root)
    state.ensure()
    engine = Engine(state, netlink_factory=lambda: FakeNetlink({"mgmt0": 1500, "lan0": 1500}))
    document = base_document()
    document["metadata"]["device"] = device
    assert engine.apply_document(parse_document(document)).ok
    document["spec"]["interfaces"][0]["mtu"] = 1300
    assert engine.apply_document(parse_document(document)).ok
    run = root / "run" / "kea-dhcp4"
    run.mkdir(parents=True)
    if leases is not None:
        (run / "kea-leases4.csv").write_text(leases)
    return state


def _lease_rows(count: int) -> str:
    rows = [HEADER4]
    for i in range(count):
        rows.append(
            f"203.0.113.{10 + i},00:00:5e:00:53:{i:02x},,3600,2000000000,1,0,0,host{i},0,,0"
        )
    return "\n".join(rows) + "\n"


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    return _router(tmp_path / "state", leases=_lease_rows(3))


@pytest.fixture
def archive(tmp_path: Path, state: StateDir) -> Path:
    out = tmp_path / "edge-01.tar"
    create_backup(state.root, out, with_leases=True)
    return out


def _repack(
    path: Path,
    edit: Callable[[dict[str, Any]], None] | None = None,
    extra: list[tarfile.TarInfo] | None = None,
    drop_manifest: bool = False,
) -> None:
    """Rewrite the archive: the manifest edited (hashes stay right), members added."""
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        for member, data in members:
            if member.name == MANIFEST:
                if drop_manifest:
                    continue
                manifest = json.loads(data)
                if edit is not None:
                    edit(manifest)
                data = json.dumps(manifest).encode()
                member.size = len(data)
            out.addfile(member, io.BytesIO(data))
        for info in extra or []:
            out.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    path.write_bytes(buffer.getvalue())


def _codes(result: Any) -> dict[str, str]:
    return {p.code: p.entry for p in result.problems}


def test_archive_holds_manifest_first_every_revision_and_is_private(
    archive: Path, state: StateDir
) -> None:
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[0] == MANIFEST
    assert "config/revisions/00000001.json" in names and "config/revisions/00000002.json" in names
    assert names[-1] == f"{LEASES}/kea-leases4.csv"
    assert archive.stat().st_mode & 0o777 == 0o600
    manifest = read_manifest(archive)
    assert manifest.revision["version"] == 2 and manifest.device == "edge-01"
    assert manifest.components[LEASES]["counts"] == {"4": 3}
    assert not list(archive.parent.glob(".edge-01.tar.*")), "staging left behind"


def test_good_archive_is_eligible_for_both_modes_with_a_plan(
    archive: Path, state: StateDir
) -> None:
    result = analyze(archive, state, LINKS)
    assert result.problems == []
    assert result.eligible == {"config-only": True, "full": True}
    assert result.plans["full"]["leases"]["restore"] == 3
    assert result.plans["config-only"]["changes"]["identical"] is True
    assert result.plans["config-only"]["revision"]["version"] == 2
    body = result.to_json()
    assert json.loads(json.dumps(body)) == body


def test_plan_diffs_against_what_is_applied_now(archive: Path, state: StateDir) -> None:
    engine = Engine(state, netlink_factory=lambda: FakeNetlink({"mgmt0": 1500, "lan0": 1500}))
    document = base_document()
    document["spec"]["interfaces"][0]["mtu"] = 1500
    assert engine.apply_document(parse_document(document)).ok
    changes = analyze(archive, state, LINKS).plans["config-only"]["changes"]
    assert changes["sections"] == {"interfaces": "changed"}
    assert changes["paths"] == ["spec.interfaces[0].mtu"]


@pytest.mark.parametrize("target", [b'"mtu": 1300', b"kea-leases4"])
def test_flipped_byte_names_the_entry_and_changes_nothing(
    archive: Path, state: StateDir, target: bytes
) -> None:
    data = bytearray(archive.read_bytes())
    manifest_end = data.find(b"config/applied.json", data.find(b"}\n"))
    at = data.rfind(b"host1") if target == b"kea-leases4" else data.find(target, manifest_end)
    assert at > 0
    data[at] ^= 0x01
    archive.write_bytes(bytes(data))
    before = _tree(state.root)
    result = analyze(archive, state, LINKS)
    assert _tree(state.root) == before
    assert "hash_mismatch" in _codes(result)
    if target == b"kea-leases4":
        assert _codes(result)["hash_mismatch"] == f"{LEASES}/kea-leases4.csv"
        assert result.eligible == {"config-only": True, "full": False}
    else:
        assert _codes(result)["hash_mismatch"].startswith("config/revisions/")
        assert result.eligible == {"config-only": False, "full": False}


def test_truncation_is_named(archive: Path, state: StateDir) -> None:
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    result = analyze(archive, state, LINKS)
    assert "truncated" in _codes(result) or "entry_missing" in _codes(result)
    assert result.eligible["full"] is False
    assert any(p.code == "truncated" for p in result.problems)


def test_truncated_inside_the_lease_member_still_restores_config_only(
    archive: Path, state: StateDir
) -> None:
    """A copy cut short inside the lease member (the last): every config entry before it
    verified, so config-only is eligible; full is refused naming the lease member."""
    data = archive.read_bytes()
    at = data.rfind(b"host1")
    assert at > data.find(b"kea-leases4.csv", data.find(b"}\n"))
    archive.write_bytes(data[:at])
    result = analyze(archive, state, LINKS)
    assert result.eligible == {"config-only": True, "full": False}, result.problems
    lease = f"{LEASES}/kea-leases4.csv"
    assert [(p.entry, p.code) for p in result.problems] == [(lease, "truncated")]
    assert [p.entry for p in result.refusals("full")] == [lease]
    assert result.refusals("config-only") == []
    assert result.to_json()["components"]["config"]["eligible"] is True


def test_truncated_inside_the_lease_member_header_still_restores_config_only(
    archive: Path, state: StateDir
) -> None:
    """Cut short inside the lease member's tar header (before its data): the lease member
    is truncated, named; config-only stays eligible."""
    import tarfile

    with tarfile.open(archive) as tar:
        lease_member = tar.getmembers()[-1]
    lease = f"{LEASES}/kea-leases4.csv"
    assert lease_member.name == lease
    data = archive.read_bytes()
    archive.write_bytes(data[: lease_member.offset + 100])
    result = analyze(archive, state, LINKS)
    assert result.eligible == {"config-only": True, "full": False}, result.problems
    assert [(p.entry, p.code) for p in result.problems] == [(lease, "truncated")]


def test_truncated_end_marker_refuses_everything(archive: Path, state: StateDir) -> None:
    data = archive.read_bytes()
    end = data.rstrip(b"\0")
    archive.write_bytes(end + b"\0" * (512 - len(end) % 512))  # member whole, marker gone
    result = analyze(archive, state, LINKS)
    assert _codes(result).get("truncated") == "(archive)"
    assert result.eligible == {"config-only": False, "full": False}


def test_missing_manifest(archive: Path, state: StateDir) -> None:
    _repack(archive, drop_manifest=True)
    result = analyze(archive, state, LINKS)
    assert _codes(result) == {"manifest_missing": MANIFEST}
    assert result.eligible == {"config-only": False, "full": False}


def test_wrong_device_is_refused(archive: Path, tmp_path: Path) -> None:
    other = _router(tmp_path / "other", device="edge-02")
    result = analyze(archive, other, LINKS)
    assert _codes(result)["device_mismatch"] == MANIFEST
    assert result.eligible == {"config-only": False, "full": False}


def test_newer_format_version_is_refused(archive: Path, state: StateDir) -> None:
    _repack(archive, edit=lambda m: m.update(format_version=2))
    result = analyze(archive, state, LINKS)
    assert _codes(result) == {"format_newer": MANIFEST}
    assert "newer trueup" in result.problems[0].message
    assert result.eligible["config-only"] is False


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = 4 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    ("member", "code"),
    [
        (_member("config/extra.json"), "entry_not_in_manifest"),
        (_member("../../etc/cron.d/evil"), "unsafe_path"),
        (_member("/etc/passwd"), "unsafe_path"),
        (_member("config/link", tarfile.SYMTYPE, "/etc/shadow"), "not_regular_file"),
        (_member("config/hard", tarfile.LNKTYPE, "config/applied.json"), "not_regular_file"),
        (_member("config/dev", tarfile.CHRTYPE), "not_regular_file"),
    ],
)
def test_unsafe_or_undeclared_members_refuse_every_mode(
    archive: Path, state: StateDir, member: tarfile.TarInfo, code: str
) -> None:
    _repack(archive, extra=[member])
    before = _tree(state.root)
    result = analyze(archive, state, LINKS)
    assert _tree(state.root) == before
    assert _codes(result).get(code) == member.name
    assert result.eligible == {"config-only": False, "full": False}


def test_manifest_entry_missing_from_the_archive(archive: Path, state: StateDir) -> None:
    def add(manifest: dict[str, Any]) -> None:
        manifest["entries"].append(
            {"path": "native/dns/lost.zone", "sha256": "0" * 64, "size": 1, "generation": "g"}
        )

    _repack(archive, edit=add)
    result = analyze(archive, state, LINKS)
    assert _codes(result) == {"entry_missing": "native/dns/lost.zone"}
    assert result.eligible == {"config-only": True, "full": False}


def test_lease_generation_mismatch_leaves_config_only_eligible(
    archive: Path, state: StateDir
) -> None:
    def other_generation(manifest: dict[str, Any]) -> None:
        for entry in manifest["entries"]:
            if entry["path"].startswith(LEASES):
                entry["generation"] = "sha256:" + "1" * 64

    _repack(archive, edit=other_generation)
    result = analyze(archive, state, LINKS)
    assert _codes(result) == {"generation_mismatch": f"{LEASES}/kea-leases4.csv"}
    assert result.eligible == {"config-only": True, "full": False}
    assert result.component_eligible("config") and not result.component_eligible(LEASES)
    assert [p.code for p in result.refusals("full")] == ["generation_mismatch"]
    assert result.refusals("config-only") == []


@pytest.mark.parametrize("content", [None, ""])
def test_zero_byte_or_missing_lease_file_is_a_valid_empty_source(
    tmp_path: Path, content: str | None
) -> None:
    state = _router(tmp_path / "state", leases=content)
    out = tmp_path / "empty.tar"
    manifest = create_backup(state.root, out, with_leases=True)
    entry = manifest.entry(f"{LEASES}/kea-leases4.csv")
    assert entry is not None and entry.size == 0
    result = analyze(out, state, LINKS)
    assert result.problems == []
    assert result.eligible == {"config-only": True, "full": True}
    assert result.plans["full"]["leases"]["restore"] == 0


def test_interfaces_missing_here_need_an_explicit_map(archive: Path, state: StateDir) -> None:
    here = ["lo", "eth0", "eth1"]
    refused = analyze(archive, state, here)
    missing = sorted(p.message.split(": ")[1] for p in refused.problems)
    assert {p.code for p in refused.problems} == {"interface_missing"}
    assert any("lan0" in m for m in missing) and any("mgmt0" in m for m in missing)
    assert refused.eligible["config-only"] is False
    wrong = analyze(archive, state, here, {"lan0": "eth9", "mgmt0": "eth0"})
    assert _codes(wrong) == {"interface_map_invalid": "config/revisions/00000002.json"}
    mapped = analyze(archive, state, here, {"lan0": "eth1", "mgmt0": "eth0"})
    assert mapped.problems == [] and mapped.eligible["config-only"] is True
    assert mapped.document is not None
    assert mapped.document["spec"]["management"]["interface"] == "eth0"
    assert mapped.document["spec"]["interfaces"][0]["name"] == "eth1"


def test_open_component_verifies_while_streaming(archive: Path) -> None:
    with open_component(archive, f"{LEASES}/kea-leases4.csv") as stream:
        data = stream.read()
    assert data.startswith(b"address,") and data.count(b"\n") == 4
    raw = bytearray(archive.read_bytes())
    raw[raw.rfind(b"host2")] ^= 0x02
    archive.write_bytes(bytes(raw))
    with (
        pytest.raises(EntryCorrupt) as caught,
        open_component(archive, f"{LEASES}/kea-leases4.csv") as stream,
    ):
        while stream.read(7):
            pass
    assert caught.value.problem.entry == f"{LEASES}/kea-leases4.csv"
    with pytest.raises(ArchiveError), open_component(archive, "config/nothing.json"):
        pass


def test_audit_excerpt_chains_to_the_anchor(archive: Path, state: StateDir) -> None:
    result = analyze(archive, state, LINKS)
    assert result.components["audit"]["lines"] >= 2
    assert result.component_eligible("audit")


def test_secret_in_clear_refuses_the_backup(tmp_path: Path, state: StateDir) -> None:
    path = state.revision_file(1)
    record = json.loads(path.read_text())
    record["document"]["spec"]["wireguard"] = {"private_key": "cGxhaW4="}
    path.write_text(json.dumps(record))
    with pytest.raises(BackupError, match="secret in clear"):
        create_backup(state.root, tmp_path / "s.tar")
    assert not (tmp_path / "s.tar").exists()


def test_cli_exit_codes_and_json(
    archive: Path, state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trueup.cli import backup as cli_backup
    from trueup.cli.main import app

    monkeypatch.setattr(cli_backup, "_links", lambda: LINKS)
    runner = CliRunner()
    ok = runner.invoke(app, ["restore", "analyze", str(archive), "--state-dir", str(state.root),
                             "-o", "json", "--map", "lo=lo"])  # fmt: skip
    assert ok.exit_code == 0, ok.stdout
    body = json.loads(ok.stdout)
    assert body["eligible"] == {"config-only": True, "full": True}
    assert body["warnings"] == ["--map lo=lo: the archive does not use lo"]
    assert set(body) >= {"eligible", "components", "problems", "refusals", "plans", "warnings"}
    _repack(archive, drop_manifest=True)
    bad = runner.invoke(app, ["restore", "analyze", str(archive), "--state-dir", str(state.root)])
    assert bad.exit_code == 1
    assert "manifest_missing" in bad.stdout and "REFUSED" in bad.stdout


def test_out_that_cannot_be_written_names_the_file_and_what_to_do(
    tmp_path: Path, state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nowhere" / "edge-01.tar"
    with pytest.raises(BackupError, match=r"nowhere does not exist; create it \(mkdir -p"):
        create_backup(state.root, missing)
    with pytest.raises(BackupError, match=r"is a directory; --out names the archive file"):
        create_backup(state.root, tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(BackupError, match=r"file is not a directory"):
        create_backup(state.root, tmp_path / "file" / "edge-01.tar")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if Path(p) == readonly else real_access(p, m)
    )
    with pytest.raises(BackupError, match=r"ro is not writable.*choose another --out"):
        create_backup(state.root, readonly / "edge-01.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "ro", "state"]
    assert list(readonly.iterdir()) == []
    from trueup.cli.main import app

    result = CliRunner().invoke(
        app, ["backup", "create", "--out", str(missing), "--state-dir", str(state.root)]
    )
    assert result.exit_code == 1
    assert "does not exist; create it" in result.output
    assert "Errno" not in result.output


def test_restore_apply_without_or_with_a_wrong_mode_says_which_and_changes_nothing(
    archive: Path, state: StateDir
) -> None:
    from trueup.cli.main import app

    before = _tree(state.root)
    runner = CliRunner()
    base = ["restore", "apply", str(archive), "--state-dir", str(state.root)]
    missing = runner.invoke(app, base)
    assert missing.exit_code == 2
    text = " ".join(missing.output.replace("│", " ").split())
    assert "--mode is required: config-only" in text
    assert "or full (also the leases; needs an archive made with --with-leases)" in text
    assert "restore analyze" in text
    wrong = runner.invoke(app, [*base, "--mode", "fulll"])
    assert wrong.exit_code == 2
    assert "'fulll': expected config-only or full" in wrong.output
    assert _tree(state.root) == before
    assert not (state.root / "restore").exists()
