"""`trueup preflight`: can an agent start from this state directory, on this machine?

Run before an agent is replaced (upgrade, reinstall, restore). Reads only;
changes nothing. Every finding is printed; any blocker fails the check.

What the machine must have is checked against the document the new agent
will run: `--config` when given (a document that adds HA needs keepalived
before the agent that applies it starts), else the accepted revision. Each
configured subsystem declares its needs (`Subsystem.requirements`); every
binary is run in a harmless mode and every hook library must be a readable
ELF shared object (`trueup.system.requirements`), so a binary that is present
but broken is a blocker too. A blocker names the binary or file, the
subsystem and the Debian package to install.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from trueup.journal.atomic import StateFileError
from trueup.journal.damage import StateCheck
from trueup.journal.lock import lock_holder
from trueup.journal.state import STATE_SCHEMA, StateDir, StateDirError
from trueup.model.document import DeviceState, DocumentError, load_document, parse_document
from trueup.startup.sources import management_source
from trueup.subsystems.base import Requirement, Subsystem
from trueup.system.requirements import RequirementResult, RequirementResultJSON, check
from trueup.system.runner import Runner, SubprocessRunner

__all__ = ["Finding", "preflight"]

Severity = Literal["ok", "warning", "blocker"]


class FindingJSON(TypedDict):
    """One preflight finding as `trueup preflight -o json` and evidence show it."""

    severity: Severity
    check: str
    message: str
    subsystem: NotRequired[str]
    requirement: NotRequired[RequirementResultJSON]


@dataclass(frozen=True)
class Finding:
    severity: Severity
    check: str
    message: str
    # A requirement's finding: the subsystem that declared it and what was checked.
    subsystem: str = ""
    requirement: RequirementResult | None = None

    def to_json(self) -> FindingJSON:
        out: FindingJSON = {
            "severity": self.severity,
            "check": self.check,
            "message": self.message,
        }
        if self.subsystem:
            out["subsystem"] = self.subsystem
        if self.requirement is not None:
            out["requirement"] = self.requirement.to_json()
        return out


def _requirement_findings(
    document: DeviceState, subsystems: list[Subsystem], runner: Runner
) -> list[Finding]:
    wanted: list[tuple[Subsystem, Requirement]] = []
    for sub in subsystems:
        if not sub.configured(document):
            continue
        needs: dict[tuple[str, str], Requirement] = {}  # one check each (Kea's hooks, per family)
        for need in sub.requirements(document):
            needs.setdefault((need.kind, need.name), need)
        wanted.extend((sub, need) for need in needs.values())
    # The probes run the binaries: side by side, so preflight costs the slowest, not the sum.
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(wanted)))) as pool:
        results = list(pool.map(lambda item: check(item[1], runner), wanted))
    findings: list[Finding] = []
    for (sub, need), result in zip(wanted, results, strict=True):
        for_what = f"{sub.name}: {need.why}" if need.why else sub.name
        findings.append(
            Finding(
                "ok" if result.ok else "blocker",
                f"{sub.name} prerequisites",
                result.message
                if result.ok
                else f"{result.message} (needed by {for_what}): {result.remedy}",
                subsystem=sub.name,
                requirement=result,
            )
        )
    return findings


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
    runner: Runner | None = None,
) -> list[Finding]:
    state = StateDir(state_dir)
    findings = _state_dir_findings(state)
    findings += _journal_findings(state)
    found, document = _applied_revision(state)
    findings += found
    new_document: DeviceState | None = None
    for label, doc_path in (("config", config), ("fallback", fallback)):
        if doc_path is None:
            continue
        try:
            loaded = load_document(doc_path)
            findings.append(Finding("ok", f"{label} document", f"{doc_path} is valid"))
            document = document or loaded
            if label == "config":
                new_document = loaded
        except DocumentError as exc:
            findings.append(
                Finding("blocker", f"{label} document", f"{doc_path}: {'; '.join(exc.problems)}")
            )
    if state_dir.is_dir():
        found, facts_document = _management_facts(state, config, fallback)
        findings += found
        document = document or facts_document
    if document is None and not any(f.check == "management configuration" for f in findings):
        findings.append(
            Finding(
                "blocker",
                "management configuration",
                "no accepted revision, no --config and no --management-fallback: the agent would "
                "have no management address to bring up",
            )
        )

    # What the machine must have for the document the new agent will run: the new
    # document when --config names one (valid), else the one it would start from.
    needs_document = new_document or document
    if needs_document is not None:
        whose = f"--config {config}" if new_document is not None else "the document it starts from"
        configured = [s.name for s in subsystems if s.configured(needs_document)]
        findings.append(
            Finding(
                "ok",
                "requirements",
                f"checking what {whose} needs: {', '.join(configured) or 'no subsystem'}",
            )
        )
        findings += _requirement_findings(
            needs_document, subsystems, runner if runner is not None else SubprocessRunner()
        )

    # The management port.
    if document is not None:
        findings.append(_port_state(document.spec.management.api.port, agent_pid))
    return findings


def _state_dir_findings(state: StateDir) -> list[Finding]:
    """The state directory and its schema; every damaged file in it."""
    state_dir = state.root
    findings: list[Finding] = []
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
    return findings


def _journal_findings(state: StateDir) -> list[Finding]:
    """An open transaction (rolled back at start); a writer holding the lock now."""
    state_dir = state.root
    findings: list[Finding] = []
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
    return findings


def _applied_revision(state: StateDir) -> tuple[list[Finding], DeviceState | None]:
    """Whether the applied revision is there and this agent can read it (and then it)."""
    version = state.applied().version if state.exists() else 0
    if not version:
        return [], None
    try:
        record = state.revision(version)
    except StateFileError:
        return [], None  # reported as damaged
    if record is None:
        return [
            Finding(
                "blocker",
                "management configuration",
                f"applied revision {version} is missing from revisions/",
            )
        ], None
    try:
        document = parse_document(record["document"], f"revision {version}")
    except DocumentError as exc:
        return [
            Finding(
                "blocker",
                "management configuration",
                f"revision {version} uses a schema this agent does not support "
                f"(STATE_VERSION_SKEW): {'; '.join(exc.problems)}",
            )
        ], None
    return [
        Finding("ok", "management configuration", f"from accepted revision {version}")
    ], document


def _management_facts(
    state: StateDir, config: Path | None, fallback: Path | None
) -> tuple[list[Finding], DeviceState | None]:
    """Where phase 1 would take the management facts from, and what it would skip."""
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
    findings = [
        Finding("warning", "management facts", f"not used: {why}") for why in source.skipped
    ]
    if source.document is not None:
        findings.append(
            Finding("ok", "management facts", f"phase 1 brings management up from {source.source}")
        )
    return findings, source.document
