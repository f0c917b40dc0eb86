"""The agent answers an operator's evidence request by uploading a fresh bundle (FakeNetlink)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from tests.routers import base_document
from trueup.agent.cpclient import ControlPlaneRefused
from trueup.agent.cpsync import SyncLoop
from trueup.backup.evidence import collect_evidence
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.changes import Change
from trueup.reconcile.engine import Engine
from trueup.system.fake import FakeNetlink


class FakeClient:
    """Only what the evidence path of SyncLoop calls; keeps each uploaded bundle's bytes."""

    url = "https://cp.example"

    def __init__(self, pending: dict[str, Any] | None, refuse: bool = False) -> None:
        self.pending = pending
        self.refuse = refuse
        self.uploads: list[tuple[bytes, dict[str, Any] | None]] = []

    def evidence_request(self) -> dict[str, Any] | None:
        return self.pending

    def upload_evidence(
        self, path: str | Path, metadata: dict[str, Any] | None = None, **_: Any
    ) -> dict[str, Any]:
        if self.refuse:
            raise ControlPlaneRefused(413, "too large")
        self.uploads.append((Path(path).read_bytes(), metadata))
        self.pending = None
        return {"id": len(self.uploads)}


def _engine(tmp_path: Path) -> Engine:
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    state = StateDir(tmp_path / "state")
    state.ensure()
    engine = Engine(state, netlink_factory=lambda: kernel)
    assert engine.transact(Change(parse_document(base_document()), actor="test")).ok
    return engine


def _loop(client: FakeClient, engine: Engine) -> SyncLoop:
    def build(path: Path) -> None:
        path.write_bytes(collect_evidence(engine, source="test agent"))

    return SyncLoop(
        client,  # type: ignore[arg-type]
        lambda document, version: None,
        dict,
        build_evidence=build,
    )


def test_a_pending_request_is_answered_with_a_bundle_whose_manifest_hashes_check(
    tmp_path: Path,
) -> None:
    client = FakeClient({"id": 7, "requested_at": 1.0})
    answered = _loop(client, _engine(tmp_path)).answer_evidence_request()
    assert answered == {"id": 1}
    [(data, metadata)] = client.uploads
    assert metadata == {"source": "agent", "request_id": 7}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        files = {
            m.name.removeprefix("evidence/"): tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }
    manifest = json.loads(files.pop("manifest.json"))
    assert set(manifest["entries"]) == set(files)
    assert "desired.json" in files
    for name, content in files.items():
        assert hashlib.sha256(content).hexdigest() == manifest["entries"][name]["sha256"], name


def test_no_request_uploads_nothing_and_a_refusal_leaves_the_loop_running(
    tmp_path: Path,
) -> None:
    engine = _engine(tmp_path)
    idle = FakeClient(None)
    assert _loop(idle, engine).answer_evidence_request() is None
    assert idle.uploads == []
    refusing = FakeClient({"id": 3}, refuse=True)
    assert _loop(refusing, engine).answer_evidence_request() is None
    assert refusing.pending == {"id": 3}  # still pending: answered after a later report
