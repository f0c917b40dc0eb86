"""`trueup restore apply`: the restore as a journaled state machine.

Who calls this: the CLI (without a running agent), the agent's
`POST /v1/restore/apply`, and the agent at startup (`resume`, after the
management tier, in the services tier's time).

```
analyzed → fenced → staged → awaiting_restart → applying → verifying → completed
                                                    └──────────────────→ rolled_back
```

Each state is written to the restore record (`trueup.journal.restore`)
*before* its work starts, and every state's work is idempotent, so a
SIGKILL, a restart or a reboot resumes the restore where it was (test fault
points `restore:STATE` fire right after each state is written):

* `analyzed` — the analysis passed for the mode (it is re-run by every
  `restore apply`; a refused archive never gets a record);
* `fenced` — the `dhcp` allocator fence is held (owner `restore`): no Kea
  hands out a lease until the restore is done;
* `staged` — the components the mode needs are copied into
  `STATE_DIR/restore/staged/`, each verified while it streams;
* `awaiting_restart` — with `--reboot` the restore waits until the boot ID
  changes; without, it goes straight on;
* `applying` — full mode: Kea stopped through the daemon supervisor, the
  lease file replaced from the staged copy (the previous one kept as a dated
  copy); then the restored revision goes through the one transaction engine
  (origin `restore`, audited; the management guard holds);
* `verifying` — the applied record is the restored revision, the system
  matches it, and (full) Kea holds every archived lease;
* `completed` lifts the fence. `rolled_back` (the transaction failed or was
  refused) lifts it only once the system is back at its previous revision:
  the applied record is the previous one and nothing differs from it;
  otherwise the fence stays and the record says so.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from trueup.backup.analysis import analyze
from trueup.backup.format import CONFIG, DNS, LEASES
from trueup.backup.interfaces import map_interfaces
from trueup.backup.leaseswap import file_sha256, put_back_leases, replace_leases, stage_components
from trueup.backup.reader import ArchiveError, read_manifest
from trueup.backup.restorechecks import assert_allocator, differences, verify
from trueup.journal.restore import TERMINAL, boot_id, read_record, record_path, write_record
from trueup.model.document import DocumentError, parse_document
from trueup.reconcile import faults
from trueup.reconcile.transaction import Change, Engine, NeedsConfirmation, Refused
from trueup.system.atomicfile import write_atomic
from trueup.system.fence import hold_fence, lift_fence

__all__ = ["RestoreRefused", "resume", "start_restore"]

OWNER = "restore"
# How long `verifying` looks again before it records its problem (and waits for a resume).
VERIFY_SECONDS = 30.0
# The agent's startup resume and an API request never drive the record at once (the CLI
# hands a restore to a running agent, so one process drives it).
_ONE_AT_A_TIME = threading.Lock()


# How long a restore step waits for the writer lock (a heal pass holds it briefly).
WRITER_WAIT = 30.0


class RestoreRefused(Exception):
    """A restore that was not started (or resumed): nothing was changed. `problems` name entries."""

    def __init__(self, message: str, problems: list[dict[str, Any]] | None = None) -> None:
        self.problems = problems or []
        super().__init__(message)


def _staged_dir(engine: Engine) -> Path:
    return engine.state.root / "restore" / "staged"


def start_restore(
    engine: Engine,
    archive: Path,
    mode: str,
    mappings: dict[str, str],
    links: list[str],
    *,
    reboot: bool = False,
    actor: str = "local",
) -> dict[str, Any]:
    """Analyse `archive` for `mode`, record it, and run the restore as far as it goes now.

    A pending restore of the same archive and mode is resumed instead; another
    one pending refuses (RestoreRefused). Returns the record.
    """
    with _ONE_AT_A_TIME:
        return _start(engine, archive, mode, mappings, links, reboot=reboot, actor=actor)


def _start(
    engine: Engine,
    archive: Path,
    mode: str,
    mappings: dict[str, str],
    links: list[str],
    *,
    reboot: bool,
    actor: str,
) -> dict[str, Any]:
    root = engine.state.root
    archive = Path(archive).absolute()
    pending = read_record(root)
    if pending is not None and pending.get("state") not in TERMINAL:
        if pending.get("state") == "damaged":
            raise RestoreRefused(str(pending.get("problem")))
        same = pending.get("archive") == str(archive) and pending.get("mode") == mode
        if not same:
            raise RestoreRefused(
                f"a {pending.get('mode')} restore of {pending.get('archive')} is pending "
                f"({pending.get('state')}); it finishes first: {pending.get('next')}"
            )
        return run(engine, actor, resumed=True)
    analysis = analyze(archive, engine.state, links, mappings)
    if not analysis.eligible.get(mode):
        refusals = [p.to_json() for p in analysis.refusals(mode)]
        first = refusals[0] if refusals else {"entry": "?", "message": "not eligible"}
        raise RestoreRefused(
            f"{archive}: a {mode} restore is refused: {first['entry']}: {first['message']}"
            + (f" (+{len(refusals) - 1} more)" if len(refusals) > 1 else "")
            + "; nothing was changed (trueup restore analyze shows every problem)",
            refusals,
        )
    assert analysis.manifest is not None
    applied = engine.state.applied()
    if pending is not None:  # a finished restore: keep its record beside the new one
        done = record_path(root).with_name(f"restore-{pending.get('id', 'old')}.json")
        record_path(root).replace(done)
    shutil.rmtree(_staged_dir(engine), ignore_errors=True)
    record: dict[str, Any] = {
        "id": uuid.uuid4().hex[:12],
        "archive": str(archive),
        "archive_sha256": file_sha256(archive),
        "mode": mode,
        "mappings": mappings,
        "reboot": reboot,
        "actor": actor,
        "device": analysis.manifest.device,
        "revision": analysis.manifest.revision,
        "previous": {"version": applied.get("version"), "digest": applied.get("digest")},
    }
    _transition(engine, record, "analyzed", "analysis passed for " + mode)
    engine.state.audit.append(
        "restore_started", actor, archive=str(archive), mode=mode, restore=record["id"]
    )
    return run(engine, actor, resumed=False)


def resume(engine: Engine, actor: str = "agent") -> dict[str, Any] | None:
    """Resume a pending restore (the agent at startup); None when none was ever recorded."""
    with _ONE_AT_A_TIME:
        return _resume(engine, actor)


def _resume(engine: Engine, actor: str) -> dict[str, Any] | None:
    record = read_record(engine.state.root)
    if record is not None and record.get("state") == "completed" and record.get("fence_held"):
        _finish(engine, record, actor)  # killed between `completed` and lifting the fence
    if record is None or record.get("state") in (*TERMINAL, "damaged"):
        return record
    return run(engine, actor, resumed=True)


def _transition(engine: Engine, record: dict[str, Any], state: str, note: str = "") -> None:
    write_record(engine.state.root, record, state, note)
    faults.hit(f"restore:{state}")


def _save(engine: Engine, record: dict[str, Any]) -> None:
    """Write progress within a state (no transition, no history line)."""
    write_record(engine.state.root, record, record["state"], transition=False)


def run(engine: Engine, actor: str, *, resumed: bool) -> dict[str, Any]:
    """Drive the pending restore forward until it ends or waits for a reboot.

    A writer lock still busy after `WRITER_WAIT` (a heal or an apply running
    long) is a refusal with its next step, never an error: the record stays in
    its state and `trueup restore apply` (or the agent's next start) resumes it.
    """
    try:
        return _run(engine, actor, resumed=resumed)
    except Refused as exc:
        record = read_record(engine.state.root)
        if record is None:
            raise RestoreRefused(str(exc)) from exc
        record["problem"] = (
            f"waiting for the writer lock: {exc}; the restore stays {record['state']!r} — "
            "run trueup restore apply again to resume it"
        )
        _save(engine, record)
        raise RestoreRefused(record["problem"]) from exc


def _run(engine: Engine, actor: str, *, resumed: bool) -> dict[str, Any]:
    root = engine.state.root
    record = read_record(root)
    if record is None or record.get("state") in (*TERMINAL, "damaged"):
        raise RestoreRefused("no restore is pending")
    if record.get("boot_id") != boot_id():
        record["history"].append(
            {"state": record["state"], "note": "resumed after a reboot (the boot ID changed)"}
        )
    elif resumed:
        record["history"].append({"state": record["state"], "note": "resumed (same boot)"})
    while True:
        state = record["state"]
        if state == "analyzed":
            reason = f"restore of {record['archive']} ({record['mode']}) in progress"
            hold_fence(root, "dhcp", OWNER, reason)
            record["fence_held"] = True
            engine.state.audit.append("fence_held", actor, subsystem="dhcp", owner=OWNER)
            _transition(engine, record, "fenced")
            assert_allocator(engine)
        elif state == "fenced":
            _stage(engine, record)
            _transition(engine, record, "staged")
        elif state == "staged":
            record["awaiting_boot_id"] = boot_id()
            _transition(engine, record, "awaiting_restart")
        elif state == "awaiting_restart":
            if record.get("reboot") and boot_id() == record.get("awaiting_boot_id"):
                return record
            _transition(engine, record, "applying")
        elif state == "applying":
            _apply(engine, record, actor)
        elif state == "verifying":
            problem = verify(engine, record, _staged_dir(engine))
            deadline = time.monotonic() + VERIFY_SECONDS
            while problem and time.monotonic() < deadline:  # a daemon still starting
                time.sleep(0.5)
                problem = verify(engine, record, _staged_dir(engine))
            if problem:
                record["problem"] = problem
                _save(engine, record)
                return record
            record.pop("problem", None)
            # `completed` is written first, the fence lifted after it: the fence is never
            # seen lifted before the restore is complete (`resume` finishes a lift a kill
            # interrupted).
            _transition(engine, record, "completed")
            _finish(engine, record, actor)
            return record
        else:
            return record


def _finish(engine: Engine, record: dict[str, Any], actor: str) -> None:
    """After `completed`: lift the fence, tell Kea, drop the staged copies, audit."""
    lift_fence(engine.state.root, "dhcp")
    record["fence_held"] = False
    _save(engine, record)
    assert_allocator(engine)
    shutil.rmtree(_staged_dir(engine), ignore_errors=True)
    engine.state.audit.append(
        "restore_completed", actor, restore=record["id"], archive=record["archive"]
    )


def _stage(engine: Engine, record: dict[str, Any]) -> None:
    archive = Path(record["archive"])
    try:
        same = file_sha256(archive) == record["archive_sha256"]
        manifest = read_manifest(archive) if same else None
        why = "" if same else "its sha256 changed"
    except (OSError, ArchiveError) as exc:
        manifest, why = None, str(exc)
    if manifest is None:
        record["problem"] = (
            f"{archive}: the archive changed or vanished since it was analysed ({why}); put the "
            "analysed copy back and run trueup restore apply again"
        )
        _save(engine, record)
        raise RestoreRefused(record["problem"])
    wanted = {CONFIG, LEASES, DNS} if record["mode"] == "full" else {CONFIG}
    version = int(record["revision"].get("version", 0))
    revision = f"config/revisions/{version:08d}.json"
    entries = [
        e.path
        for e in manifest.entries
        if e.component in wanted
        and (e.component != CONFIG or e.path in (revision, "config/applied.json"))
    ]
    staged = _staged_dir(engine)
    record["staged"] = stage_components(archive, entries, staged)
    record.pop("problem", None)
    document = json.loads((staged / revision).read_text())["document"]
    document = map_interfaces(document, record.get("mappings") or {})
    document.setdefault("metadata", {}).pop("version", None)  # the engine numbers it
    write_atomic(staged / "document.json", json.dumps(document, sort_keys=True).encode(), 0o600)


def _apply(engine: Engine, record: dict[str, Any], actor: str) -> None:
    staged = _staged_dir(engine)
    try:
        document = parse_document(
            json.loads((staged / "document.json").read_text()), "the restored revision"
        )
    except (OSError, ValueError, DocumentError) as exc:
        _roll_back(engine, record, actor, f"the staged revision is unreadable: {exc}")
        return
    with engine.writer("restore", actor, wait=WRITER_WAIT):
        if record["mode"] == "full":
            for line in replace_leases(
                engine.daemons, staged, record, lambda: _save(engine, record)
            ):
                record.setdefault("notes", []).append(line)
        try:
            result = engine.transact(
                Change(
                    document,
                    kind="restore",
                    origin="restore",
                    actor=actor,
                    source=f"restore {record['id']} of {record['archive']}",
                )
            )
        except (Refused, NeedsConfirmation) as exc:
            _roll_back(engine, record, actor, f"the engine refused the restored revision: {exc}")
            return
        if not result.ok:
            failed = "; ".join(f"{k}: {v}" for k, v in result.failed.items())
            _roll_back(engine, record, actor, f"the transaction {result.outcome}: {failed}")
            return
    record["applied"] = {"version": result.version, "digest": result.digest, "txn": result.txn}
    _transition(engine, record, "verifying", f"transaction {result.outcome}")


def _roll_back(engine: Engine, record: dict[str, Any], actor: str, problem: str) -> None:
    """The restore failed: leases back (full), the previous revision converged, fence decided."""
    root = engine.state.root
    record["problem"] = problem
    with engine.writer("restore", actor, wait=WRITER_WAIT):
        put_back_leases(engine.daemons, record)
        previous = record.get("previous") or {}
        back = engine.state.applied()
        at_previous = (back.get("version"), back.get("digest")) == (
            previous.get("version"),
            previous.get("digest"),
        )
        current = engine.applied_document()
        if current is not None and at_previous:
            try:  # level-based: Kea stopped for the lease swap is started again
                result = engine.transact(
                    Change(current, kind="restore", origin="restore", actor=actor)
                )
                at_previous = result.ok
            except (Refused, NeedsConfirmation):
                at_previous = False
    if at_previous and not differences(engine):
        lift_fence(root, "dhcp")
        record["fence_held"] = False
    _transition(engine, record, "rolled_back", problem)
    assert_allocator(engine)
    engine.state.audit.append(
        "restore_rolled_back", actor, restore=record["id"], problem=problem[:500]
    )
