"""`trueup preflight`: can an agent start from this state directory, on this machine?

Run before an agent is replaced (upgrade, reinstall, restore). Reads only;
changes nothing. Every finding is printed; any blocker fails the check.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trueup.journal.atomic import StateFileError
from trueup.journal.damage import StateCheck
from trueup.journal.lock import lock_holder
from trueup.journal.state import STATE_SCHEMA, StateDir, StateDirError
from trueup.model.document import DeviceState, DocumentError, load_document, parse_document
from trueup.startup.sources import management_source
from trueup.subsystems.base import Subsystem

__all__ = ["Finding", "preflight"]

Severity = Literal["ok", "warning", "blocker"]


@dataclass(frozen=True)
class Finding:
    severity: Severity
    check: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "check": self.check, "message": self.message}


def _port_state(port: int, agent_pid: int | None) -> Finding:
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind((address, port))
            return Finding("ok", "management port", f"port {port} is free")
        except OSError as exc:
            if exc.errno == errno.EAFNOSUPPORT:
                continue
            if exc.errno == errno.EADDRINUSE:
                if agent_pid is not None:
                    return Finding(
                        "ok",
                        "management port",
                        f"port {port} is held by the running agent (pid {agent_pid})",
                    )
                return Finding(
                    "blocker",
                    "management port",
                    f"port {port} is in use by another process; free it or change "
                    "spec.management.api.port",
                )
            return Finding("warning", "management port", f"cannot probe port {port}: {exc}")
    return Finding("warning", "management port", f"cannot probe port {port}")


def preflight(
    state_dir: Path,
    subsystems: list[Subsystem],
    *,
    config: Path | None = None,
    fallback: Path | None = None,
    agent_pid: int | None = None,
) -> list[Finding]:
    findings: list[Finding] = []
    state = StateDir(state_dir)
    document: DeviceState | None = None

    # State directory and its schema.
    if not state_dir.exists():
        findings.append(
            Finding(
                "warning",
                "state directory",
                f"{state_dir} does not exist yet; the agent will create it",
            )
        )
    elif not state.exists():
        findings.append(
            Finding(
                "warning",
                "state directory",
                f"{state_dir}/state.json missing: a new state directory",
            )
        )
    else:
        try:
            schema = state.check_schema()
            findings.append(
                Finding(
                    "ok",
                    "state directory",
                    f"{state_dir} schema {schema} (supported: {STATE_SCHEMA})",
                )
            )
        except (StateDirError, json.JSONDecodeError, OSError) as exc:
            findings.append(Finding("blocker", "state directory", str(exc)))
    if state_dir.is_dir():
        # Every damaged file fails the check: an agent would start (management
        # needs none of them) but refuse writes or report them until repaired.
        # Torn journal lines are what a crash leaves; the journal ignores them.
        for damage in StateCheck(state).damaged(deep=True):
            severity: Severity = "warning" if damage.file == "journal.jsonl" else "blocker"
            findings.append(
                Finding(
                    severity,
                    "damaged state",
                    f"{damage.sentence()} — {damage.to_json()['consequence']}",
                )
            )

    # Journal.
    journal_path = state_dir / "journal.jsonl"
    if journal_path.exists():
        try:
            transactions = state.journal.transactions()
            open_txn = [t.txn for t in transactions if t.is_open]
            if open_txn:
                findings.append(
                    Finding(
                        "warning",
                        "journal",
                        f"open transaction {open_txn[-1]}: the agent will roll it back at start "
                        "(reported as STATE_APPLY_NOT_COMPLETED)",
                    )
                )
            else:
                findings.append(
                    Finding("ok", "journal", f"{len(transactions)} transaction(s), none open")
                )
        except OSError as exc:
            findings.append(Finding("blocker", "journal", f"{journal_path}: {exc}"))
    holder = lock_holder(state_dir / "lock") if state_dir.exists() else None
    if holder:
        findings.append(Finding("warning", "writer lock", f"held now by {holder}"))

    # Management configuration.
    version = int(state.applied().get("version", 0)) if state.exists() else 0
    if version:
        damaged = False
        try:
            record = state.revision(version)
        except StateFileError:
            record, damaged = None, True  # reported as damaged above
        if damaged:
            pass
        elif record is None:
            findings.append(
                Finding(
                    "blocker",
                    "management configuration",
                    f"applied revision {version} is missing from revisions/",
                )
            )
        else:
            try:
                document = parse_document(record["document"], f"revision {version}")
                findings.append(
                    Finding("ok", "management configuration", f"from accepted revision {version}")
                )
            except DocumentError as exc:
                findings.append(
                    Finding(
                        "blocker",
                        "management configuration",
                        f"revision {version} uses a schema this agent does not support "
                        f"(STATE_VERSION_SKEW): {'; '.join(exc.problems)}",
                    )
                )
    for label, doc_path in (("config", config), ("fallback", fallback)):
        if doc_path is None:
            continue
        try:
            loaded = load_document(doc_path)
            findings.append(Finding("ok", f"{label} document", f"{doc_path} is valid"))
            document = document or loaded
        except DocumentError as exc:
            findings.append(
                Finding("blocker", f"{label} document", f"{doc_path}: {'; '.join(exc.problems)}")
            )
    if state_dir.is_dir():
        config_document = None
        if config is not None:
            with contextlib.suppress(DocumentError):
                config_document = load_document(config)
        source = management_source(
            state,
            config=config_document,
            config_path=str(config) if config else None,
            fallback_path=fallback,
        )
        for why in source.skipped:
            findings.append(Finding("warning", "management facts", f"not used: {why}"))
        if source.document is not None:
            findings.append(
                Finding(
                    "ok", "management facts", f"phase 1 brings management up from {source.source}"
                )
            )
            document = document or source.document
    if document is None and not any(f.check == "management configuration" for f in findings):
        findings.append(
            Finding(
                "blocker",
                "management configuration",
                "no accepted revision, no --config and no --management-fallback: the agent would "
                "have no management address to bring up",
            )
        )

    # Binaries and packaged files the configured subsystems need.
    for sub in subsystems:
        if document is not None and not sub.configured(document):
            continue
        for binary in sub.required_binaries:
            found = shutil.which(binary)
            findings.append(
                Finding("ok", f"{sub.name} prerequisites", f"{binary} at {found}")
                if found
                else Finding(
                    "blocker",
                    f"{sub.name} prerequisites",
                    f"{binary} not found on PATH (needed by {sub.name})",
                )
            )
        for required_file in sub.required_files:
            findings.append(
                Finding("ok", f"{sub.name} prerequisites", f"{required_file} present")
                if Path(required_file).exists()
                else Finding(
                    "blocker",
                    f"{sub.name} prerequisites",
                    f"{required_file} missing (needed by {sub.name})",
                )
            )

    # The management port.
    if document is not None:
        findings.append(_port_state(document.spec.management.api.port, agent_pid))
    return findings
