"""The evidence bundle: what the runbook asks to collect, with or without a live agent.

Who calls this: the agent (`GET /v1/evidence`, with its live status) and
`trueup evidence` when no agent answers in time (stopped or hung): then the
CLI reads the state directory directly and observes the system itself (as
far as its permissions allow). Each part that cannot be collected is named in
the manifest with the reason; nothing is silently left out.

```
evidence/manifest.json        created_at, source, trueup version, entries{NAME: {sha256, bytes}},
                              missing{NAME: why}, redactions
evidence/status.json          the status document (versions, health, reason codes, journal …)
evidence/desired.json         the applied revision's document
evidence/observed.json        every subsystem's observed facts (the full snapshot)
evidence/diff.json            desired vs observed: differences, accepted differences
evidence/versions.json        applied, desired (newest accepted revision), control plane
evidence/reason-codes.json    findings with their corrective actions; the runbook's table
evidence/agent.log            the agent's last 200 log lines (journald or STATE_DIR/agent.log)
evidence/history.json         journal transactions and the reconcile history (breaker, back-off)
evidence/audit-excerpt.jsonl  the last audit records, as written (hash-chained)
evidence/audit-proof.json     chain proof: verify() result, anchor, the excerpt's first prev hash
evidence/concurrency.json     writer lock holder, agent holder, open transaction, refused writes
evidence/environment.json     trueup/python versions, kernel, daemon versions, systemd unit
evidence/limitations.json     known limitations (in force and withdrawn)
evidence/state/…              state files as they are (applied.json, reconcile.json, revisions …)
```

Secrets are redacted in every entry: the secret store's values wherever they
appear, any value under a secret-sounding key that is not a reference
(`trueup.backup.secrets`), and bearer tokens in log text.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import re
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trueup import __version__
from trueup.backup.evidenceparts import Concurrency, Environment, History, Observed, Versions
from trueup.backup.secrets import is_reference, is_secret_key
from trueup.journal.agentlock import agent_holder
from trueup.journal.atomic import read_json
from trueup.journal.audit import now_iso
from trueup.journal.limitations import list_limitations
from trueup.journal.lock import lock_holder
from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import CORRECTIVE_ACTIONS
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine import observe as observing
from trueup.reconcile.status import drift_report, gather, refusals_since_last_write
from trueup.subsystems.registry import scope_for
from trueup.system.hostinfo import agent_log_lines, daemon_versions, kernel, systemd_unit
from trueup.system.safefile import read_file
from trueup.system.secretstore import list_secrets, read_secret

__all__ = ["REDACTED", "collect_evidence", "recorded_control_plane_version"]

log = logging.getLogger("trueup.evidence")

REDACTED = "[REDACTED]"
LOG_LINES = 200
AUDIT_EXCERPT = 200
JOURNAL_TRANSACTIONS = 50
_STATE_FILES = (
    "applied.json",
    "reconcile.json",
    "state.json",
    "config.json",
    "pending-confirm.json",
    "confirmation.json",
    "control-plane.json",
    "management.json",
    "management-override.json",
    "restore/restore.json",
    "audit.head",
    "audit.torn",
    "limitations.json",
)
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")


def _secret_value(key: object, item: Any) -> bool:
    """A value held in clear under a secret-sounding key (references and empties are not)."""
    if not is_secret_key(key) or item is None or isinstance(item, bool):
        return False
    return item not in ("", [], {}) and not is_reference(item)


class _Redactor:
    def __init__(self, state_dir: Path) -> None:
        values: list[str] = []
        try:
            for name in list_secrets(state_dir):
                value = read_secret(state_dir, name)
                if value and len(value) >= 4:
                    values.append(value)
        except OSError as exc:
            log.warning("evidence: secret store unreadable (%s); key-based redaction only", exc)
        self.values = sorted(values, key=len, reverse=True)
        self.count = 0

    def text(self, text: str) -> str:
        for value in self.values:
            if value in text:
                self.count += text.count(value)
                text = text.replace(value, REDACTED)
        text, n = _BEARER.subn(lambda m: m.group(1) + REDACTED, text)
        self.count += n
        return text

    def value(self, node: Any) -> Any:
        if isinstance(node, dict):
            out: JSONObject = {}  # any JSON object the bundle holds, redacted key by key
            for key, item in node.items():
                if _secret_value(key, item):
                    self.count += 1
                    out[key] = REDACTED
                    continue
                out[key] = self.value(item)
            return out
        if isinstance(node, list):
            return [self.value(item) for item in node]
        if isinstance(node, str):
            return self.text(node)
        return node


class _Bundle:
    def __init__(self, redactor: _Redactor) -> None:
        self.redactor = redactor
        self.entries: dict[str, bytes] = {}
        self.missing: dict[str, str] = {}

    def json(self, name: str, value: Any) -> None:
        text = json.dumps(self.redactor.value(value), indent=2, sort_keys=True, default=str)
        self.entries[name] = text.encode() + b"\n"

    def text(self, name: str, text: str) -> None:
        self.entries[name] = self.redactor.text(text).encode()

    def part(self, name: str, make: Callable[[], None]) -> None:
        """Collect one part; its failure is recorded as missing, never fatal."""
        try:
            make()
        except Exception as exc:
            log.debug("evidence: %s not collected: %s", name, exc)
            self.missing[name] = f"{type(exc).__name__}: {exc}"


def _audit_parts(bundle: _Bundle, engine: Engine) -> None:
    audit = engine.state.audit
    records = audit.tail()[-AUDIT_EXCERPT:]
    bundle.text(
        "audit-excerpt.jsonl",
        "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records),
    )
    problems = [str(p) for p in audit.verify()]
    bundle.json(
        "audit-proof.json",
        {
            "verified_at": now_iso(),
            "chain_intact": not problems,
            "problems": problems,
            "anchor": read_json(audit.head_path, None),
            "excerpt": {
                "records": len(records),
                "first_seq": records[0].get("seq") if records else None,
                "first_prev": records[0].get("prev") if records else None,
                "last_seq": records[-1].get("seq") if records else None,
                "last_hash": records[-1].get("hash") if records else None,
            },
            "how_to_check": (
                "each record's hash is sha256 over its canonical JSON without `hash`; each "
                "record's `prev` is the hash of the one before; the last hash matches the "
                "anchor (audit.head) unless the log grew after it. `trueup audit verify` "
                "checks the whole log on the device."
            ),
        },
    )


def _history(engine: Engine) -> History:
    transactions = engine.state.journal.transactions()[-JOURNAL_TRANSACTIONS:]
    return {
        "transactions": [t.summary() for t in transactions],
        "reconcile": read_json(engine.state.root / "reconcile.json", None),
    }


def _concurrency(engine: Engine, status: JSONObject) -> Concurrency:
    root = engine.state.root
    refused = [r for r in engine.state.audit.tail() if r.get("event") == "refused"]
    return {
        "writer_lock": lock_holder(root / "lock"),
        "agent": holder.to_json() if (holder := agent_holder(root)) is not None else None,
        "open_transaction": status.get("journal", {}).get("open"),
        "refusals_since_last_write": refusals_since_last_write(engine),
        "refused_writes": refused[-50:],
    }


def recorded_control_plane_version(engine: Engine) -> int | None:
    """The control plane's revision the agent last fetched (`control-plane.json`), if any."""
    try:
        record = read_json(engine.state.root / "control-plane.json", None)
    except Exception:
        return None
    version = record.get("version") if isinstance(record, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def _versions(engine: Engine, status: JSONObject) -> Versions:
    versions = status.get("versions", {})
    accepted = engine.state.revision_versions()
    return {
        "control_plane_last_fetched": recorded_control_plane_version(engine),
        "applied": versions.get("applied"),
        "applied_digest": versions.get("applied_digest"),
        "desired": accepted[-1] if accepted else None,
        "control_plane": versions.get("control_plane"),
        "control_plane_applied": versions.get("control_plane_applied"),
        "aligned": (
            versions.get("control_plane") in (None, versions.get("applied"))
            and (not accepted or accepted[-1] == versions.get("applied"))
        ),
    }


def _observed(engine: Engine) -> Observed:
    document = engine.applied_document()
    if document is None:
        raise LookupError("nothing applied: no scope to observe")
    errors: dict[str, str] = {}
    with engine.sources() as net:
        facts = observing.observe(engine, net, scope_for(document), errors=errors)
    return {"observed_at": now_iso(), "facts": facts, "unobservable": errors}


def _environment(agent_pid: int | None) -> Environment:
    return {
        "trueup": __version__,
        "python": platform.python_version(),
        "executable": sys.executable,
        "kernel": kernel(),
        "daemons": daemon_versions(),
        "agent_pid": agent_pid,
        "systemd_unit": systemd_unit(agent_pid),
        "collector_uid": os.getuid(),
    }


def collect_evidence(
    engine: Engine,
    *,
    status: JSONObject | None = None,
    source: str = "agent",
    missing: dict[str, str] | None = None,
) -> bytes:
    """The bundle as a tar.gz. `status` from a live agent; else gathered here (say why in `source`).

    `missing` lets the caller name parts it already knows are absent (the
    agent's live view when it did not answer).
    """
    state = engine.state
    bundle = _Bundle(_Redactor(state.root))
    bundle.missing.update(missing or {})
    holder = agent_holder(state.root)
    agent_pid = holder.pid if holder and holder.pid else None
    if status is None:
        try:
            status = gather(engine, control_plane_version=recorded_control_plane_version(engine))
        except Exception as exc:
            bundle.missing["status.json"] = f"{type(exc).__name__}: {exc}"
            status = {}
    if status:
        bundle.json("status.json", status)
        bundle.part("diff.json", lambda: _diff(bundle, status))
    bundle.part("desired.json", lambda: _desired(bundle, engine))
    bundle.part("observed.json", lambda: bundle.json("observed.json", _observed(engine)))
    bundle.part("versions.json", lambda: bundle.json("versions.json", _versions(engine, status)))
    bundle.json(
        "reason-codes.json",
        {
            "findings": status.get("reason_codes", []) if status else None,
            "runbook": {code.value: action for code, action in CORRECTIVE_ACTIONS.items()},
        },
    )
    bundle.part("agent.log", lambda: _log(bundle, state.root, agent_pid))
    bundle.part("history.json", lambda: bundle.json("history.json", _history(engine)))
    bundle.part("audit-excerpt.jsonl", lambda: _audit_parts(bundle, engine))
    bundle.part(
        "concurrency.json", lambda: bundle.json("concurrency.json", _concurrency(engine, status))
    )
    bundle.part(
        "environment.json", lambda: bundle.json("environment.json", _environment(agent_pid))
    )
    bundle.part(
        "limitations.json",
        lambda: bundle.json(
            "limitations.json",
            [r.to_json() for r in list_limitations(state.root, include_withdrawn=True)],
        ),
    )
    bundle.part("state/", lambda: _state_files(bundle, engine))
    return _archive(bundle, source)


def _diff(bundle: _Bundle, status: JSONObject) -> None:
    report = drift_report(status)
    report["accepted"] = [
        d for sub in status.get("subsystems", {}).values() for d in sub.get("accepted", [])
    ]
    bundle.json("diff.json", report)


def _desired(bundle: _Bundle, engine: Engine) -> None:
    document = engine.applied_document()
    if document is None:
        bundle.missing["desired.json"] = "nothing applied yet"
        return
    bundle.json("desired.json", document.canonical())


def _log(bundle: _Bundle, root: Path, agent_pid: int | None) -> None:
    lines, where = agent_log_lines(root, agent_pid, LOG_LINES)
    if not lines:
        bundle.missing["agent.log"] = where.get("missing") or "the log is empty"
        return
    bundle.text("agent.log", "\n".join(lines) + "\n")
    bundle.json("agent.log.source.json", where)


def _state_files(bundle: _Bundle, engine: Engine) -> None:
    root = engine.state.root
    names = list(_STATE_FILES) + sorted(
        str(p.relative_to(root)) for p in (root / "fences").glob("*.json")
    )
    names += [f"revisions/{v:08d}.json" for v in engine.state.revision_versions()[-5:]]
    for name in names:
        path = root / name
        try:
            data = read_file(path)  # never through a link: a host file stays out of the bundle
        except FileNotFoundError:
            continue
        except OSError as exc:  # a link, a directory, …: named, never followed
            bundle.text(f"state/{name}", f"not included: {exc}\n")
            continue
        try:
            bundle.json(f"state/{name}", json.loads(data))
        except ValueError:
            bundle.text(f"state/{name}", data.decode("utf-8", "replace"))


def _archive(bundle: _Bundle, source: str) -> bytes:
    manifest = {
        "created_at": now_iso(),
        "source": source,
        "trueup": __version__,
        "entries": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            for name, data in sorted(bundle.entries.items())
        },
        "missing": dict(sorted(bundle.missing.items())),
        "redactions": bundle.redactor.count,
        "how_to_check": "sha256 of each file under evidence/ equals entries[NAME].sha256",
    }
    buffer = io.BytesIO()
    mtime = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in [
            ("manifest.json", json.dumps(manifest, indent=2).encode() + b"\n"),
            *sorted(bundle.entries.items()),
        ]:
            info = tarfile.TarInfo(f"evidence/{name}")
            info.size, info.mtime, info.mode = len(data), mtime, 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
