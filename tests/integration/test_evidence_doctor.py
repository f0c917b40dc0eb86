"""Evidence, doctor and known limitations against a real agent: running, hung, stopped."""

from __future__ import annotations

import hashlib
import json
import signal
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document
from trueup.system.secretstore import write_secret

pytestmark = pytest.mark.root

FAST = {"TRUEUP_RESYNC_SECONDS": "1"}
PLANTED = "Planted-s3cret-value-9f8e7d6c5b4a"


def _bundle(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    with tarfile.open(path) as tar:
        files = {
            m.name.removeprefix("evidence/"): tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }
    manifest = json.loads(files.pop("manifest.json"))
    for name, data in files.items():
        assert hashlib.sha256(data).hexdigest() == manifest["entries"][name]["sha256"], name
        assert PLANTED.encode() not in data, f"the planted secret is in {name}"
    assert set(files) == set(manifest["entries"])
    return manifest, files


def _evidence(router: Router, name: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    out = router.workdir / name
    done = router.trueup("evidence", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    return _bundle(out)


def test_evidence_and_doctor_with_the_agent_running_hung_and_stopped(router: Router) -> None:
    document = router.write("v1.yaml", base_document())
    router.start_agent("--config", str(document), env=FAST)
    write_secret(router.state_dir, "planted", PLANTED)
    with (router.state_dir / "agent.log").open("a") as log:  # a leak the bundle must redact
        log.write(f"2026-11-30T17:02:52Z INFO test: key is {PLANTED}\n")

    stable = router.trueup("doctor", "--until-stable", "2s", "--timeout", "60s")
    assert stable.returncode == 0, stable.stdout + stable.stderr
    assert "stable: every stop condition held for 2s" in stable.stdout
    healthy = router.trueup("doctor")
    assert healthy.returncode == 0, healthy.stdout
    assert "running and answering" in healthy.stdout

    manifest, files = _evidence(router, "live.tar.gz")
    assert manifest["source"].startswith("agent pid")
    assert "live agent view" not in manifest["missing"]
    assert b"trueup.startup" in files["agent.log"] and b"[REDACTED]" in files["agent.log"]
    assert json.loads(files["audit-proof.json"])["chain_intact"] is True
    assert json.loads(files["desired.json"])["metadata"]["device"] == "edge-01"

    # Hung: the process holds the state directory but does not answer.
    agent = router.agents[0]
    agent.send_signal(signal.SIGSTOP)
    try:
        manifest, files = _evidence(router, "hung.tar.gz")
        assert "live agent view" in manifest["missing"]
        assert "status.json" in files and "observed.json" in files
        hung = router.trueup("doctor")
        assert hung.returncode == 1
        assert "AGENT_NOT_ANSWERING" in hung.stdout
    finally:
        agent.send_signal(signal.SIGCONT)

    # Stopped, then changed behind trueup's back.
    router.stop_agents()
    router.ip("link", "set", "lan0", "mtu", "1500")
    manifest, files = _evidence(router, "stopped.tar.gz")
    assert "live agent view" in manifest["missing"]
    diff = json.loads(files["diff.json"])
    assert any(d["path"].endswith("mtu") for d in diff["differences"])
    assert b"INFO" in files["agent.log"]  # the log file the stopped agent left
    stopped = router.trueup("doctor")
    assert stopped.returncode == 1
    assert "AGENT_NOT_RUNNING" in stopped.stdout and "trueup agent run" in stopped.stdout
    assert "STATE_DRIFT_DETECTED" in stopped.stdout
    waited = router.trueup("doctor", "--until-stable", "1s", "--timeout", "2s")
    assert waited.returncode == 1
    assert "NOT MET agent running" in waited.stderr
    assert "NOT MET desired equals observed" in waited.stderr

    # A reviewed limitation accepts the MTU difference: no longer drift, still visible.
    path = next(d["path"] for d in diff["differences"] if d["path"].endswith("mtu"))
    subsystem = next(d["subsystem"] for d in diff["differences"] if d["path"] == path)
    added = router.trueup(
        "limitation", "add", subsystem, path, "--reason", "switch port caps the MTU",
        "--reviewed-by", "alice", "--ticket", "CHG-7",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert [d["path"] for d in status["subsystems"][subsystem]["accepted"]] == [path]
    assert "STATE_DRIFT_DETECTED" not in {f["code"] for f in status["reason_codes"]}
    table = router.trueup("status").stdout
    assert "known limitations" in table and "alice" in table
    listed = router.trueup("limitation", "list")
    assert "L1" in listed.stdout and "CHG-7" in listed.stdout
    manifest, files = _evidence(router, "limited.tar.gz")
    assert json.loads(files["limitations.json"])[0]["reviewed_by"] == "alice"
    withdrawn = router.trueup("limitation", "withdraw", "L1", "--reason", "port replaced")
    assert withdrawn.returncode == 0, withdrawn.stderr
    assert router.trueup("drift").returncode == 2


def test_limitations_through_the_agent_api_are_audited_and_reported(router: Router) -> None:
    document = router.write("v1.yaml", base_document())
    router.start_agent("--config", str(document), env=FAST)
    missing = router.trueup(
        "limitation", "add", "links", "x", "--reason", "r", "--reviewed-by", " "
    )
    assert missing.returncode == 1 and "--reviewed-by" in missing.stderr
    unknown = router.trueup("limitation", "add", "nope", "x", "--reason", "r", "--reviewed-by", "b")
    assert unknown.returncode == 1 and "'nope' is not a subsystem" in unknown.stderr
    added = router.trueup(
        "limitation", "add", "links", "spec.interfaces[lan0].mtu", "--reason", "capped",
        "--reviewed-by", "bob",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    status = router.api("/v1/status")
    assert status["limitations"][0]["added_by"].startswith("cli:")
    audit = (router.state_dir / "audit.jsonl").read_text()
    assert '"limitation_added"' in audit
    assert router.trueup("limitation", "withdraw", "L9", "--reason", "x").returncode == 1
    assert router.trueup("audit", "verify").returncode == 0
