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
  hands out a lease until the restore is done. It is enforced before it is
  recorded: every running Kea is disabled and given the fence class, and the
  file each Kea starts from carries it, before the fence record is written;
* `staged` — the components the mode needs are copied into
  `STATE_DIR/restore/staged/`, each verified while it streams;
* `awaiting_restart` — with `--reboot` the restore waits until the boot ID
  changes; without, it goes straight on. Links the restored revision names
  that do not exist yet are waited for (`waiting`, bounded by `LINK_WAIT`,
  then rolled back with the fence lifted: nothing was applied), and the
  writer lock is taken before `applying` is written;
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

Why this module is over 400 lines: it is one write-ahead state machine, and
the order of its writes (the work of a state, then the record of the next)
is the whole point; each state's work, the link wait before `applying` and
the rollback sit beside the loop that orders them, so that order is read in
one place.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from trueup.backup.analysis import analyze
from trueup.backup.format import CONFIG, DNS, LEASES
from trueup.backup.interfaces import interface_refs, map_interfaces
from trueup.backup.leaseswap import file_sha256, put_back_leases, replace_leases, stage_components
from trueup.backup.reader import ArchiveError, ProblemJSON, read_manifest
from trueup.backup.restorechecks import assert_allocator, differences, fence_kea, verify
from trueup.journal.restore import (
    TERMINAL,
    RestoreRecord,
    boot_id,
    read_record,
    record_path,
    write_record,
)
from trueup.model.document import DocumentError, parse_document
from trueup.reconcile import faults
from trueup.reconcile.changes import Change, NeedsConfirmation, Refused
from trueup.reconcile.engine import Engine
from trueup.system.atomicfile import write_atomic
from trueup.system.fence import hold_fence, lift_fence
from trueup.system.kea import KeaError

__all__ = ["RestoreRefused", "resume", "start_restore"]

OWNER = "restore"
# How long `verifying` looks again before it records its problem (and waits for a resume).
VERIFY_SECONDS = 30.0
# The agent's startup resume and an API request never drive the record at once (the CLI
# hands a restore to a running agent, so one process drives it).
_ONE_AT_A_TIME = threading.Lock()


# How long a restore step waits for the writer lock (a heal pass holds it briefly).
WRITER_WAIT = 30.0
# How long a restore waits for the links its revision names (a link that appears late after
# a boot) before it gives up; it goes on as soon as they exist.
LINK_WAIT = 120.0
LINK_POLL = 0.2


class RestoreRefused(Exception):
    """A restore that was not started (or resumed): nothing was changed. `problems` name entries."""

    def __init__(self, message: str, problems: list[ProblemJSON] | None = None) -> None:
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
    link_wait: float = LINK_WAIT,
) -> RestoreRecord:
    """Analyse `archive` for `mode`, record it, and run the restore as far as it goes now.

    A pending restore of the same archive and mode is resumed instead; another
    one pending refuses (RestoreRefused). Returns the record. `link_wait`: how long
    this call waits for missing links before it returns the record waiting for them
    (the agent passes 0 and goes on by itself; the console waits for them).
    """
    with _ONE_AT_A_TIME:
        return _start(
            engine, archive, mode, mappings, links, reboot=reboot, actor=actor, link_wait=link_wait
        )


def _start(
    engine: Engine,
    archive: Path,
    mode: str,
    mappings: dict[str, str],
    links: list[str],
    *,
    reboot: bool,
    actor: str,
    link_wait: float,
) -> RestoreRecord:
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
        return run(engine, actor, resumed=True, link_wait=link_wait)
    analysis = analyze(archive, engine.state, links, mappings)
    if not analysis.eligible.get(mode):
        refusals = [p.to_json() for p in analysis.refusals(mode)]
        first = (
            f"{refusals[0]['entry']}: {refusals[0]['message']}" if refusals else "?: not eligible"
        )
        raise RestoreRefused(
            f"{archive}: a {mode} restore is refused: {first}"
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
    record: RestoreRecord = {
        "id": uuid.uuid4().hex[:12],
        "archive": str(archive),
        "archive_sha256": file_sha256(archive),
        "mode": mode,
        "mappings": mappings,
        "reboot": reboot,
        "actor": actor,
        "device": analysis.manifest.device,
        "revision": analysis.manifest.revision,
        "previous": {"version": applied.version, "digest": applied.digest},
    }
    _transition(engine, record, "analyzed", "analysis passed for " + mode)
    engine.state.audit.append(
        "restore_started", actor, archive=str(archive), mode=mode, restore=record["id"]
    )
    return run(engine, actor, resumed=False, link_wait=link_wait)


def resume(
    engine: Engine, actor: str = "agent", *, link_wait: float = LINK_WAIT
) -> RestoreRecord | None:
    """Resume a pending restore (the agent at startup and on its retry timer); None when none
    was ever recorded."""
    with _ONE_AT_A_TIME:
        return _resume(engine, actor, link_wait)


def note_retry(engine: Engine, attempts: int, at: float | None) -> None:
    """Record the agent's next retry of the pending restore (`at`: a UNIX time; None: none)."""
    with _ONE_AT_A_TIME:
        record = read_record(engine.state.root)
        if record is None or record.get("state") in (*TERMINAL, "damaged"):
            return
        if at is None:
            if record.pop("retry", None) is not None:
                _save(engine, record)
            return
        when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
        record["retry"] = {"attempts": attempts, "next_at": when}
        _save(engine, record)


def _resume(engine: Engine, actor: str, link_wait: float) -> RestoreRecord | None:
    record = read_record(engine.state.root)
    if record is not None and record.get("state") == "completed" and record.get("fence_held"):
        _finish(engine, record, actor)  # killed between `completed` and lifting the fence
    if record is None or record.get("state") in (*TERMINAL, "damaged"):
        return record
    return run(engine, actor, resumed=True, link_wait=link_wait)


def _transition(engine: Engine, record: RestoreRecord, state: str, note: str = "") -> None:
    write_record(engine.state.root, record, state, note)
    faults.hit(f"restore:{state}")


def _save(engine: Engine, record: RestoreRecord) -> None:
    """Write progress within a state (no transition, no history line)."""
    write_record(engine.state.root, record, record["state"], transition=False)


def run(
    engine: Engine, actor: str, *, resumed: bool, link_wait: float = LINK_WAIT
) -> RestoreRecord:
    """Drive the pending restore forward until it ends, waits for a reboot, or waits for links.

    Nothing here ends in an error: a writer lock still busy after `WRITER_WAIT`
    (a heal or an apply running long), a Kea that does not take the fence, an
    archive that changed, any failure of a step, is a refusal (`RestoreRefused`)
    with its `problem` and next step written into the record, which stays in its
    state; the agent retries it by itself (and `trueup restore apply` resumes it).
    """
    try:
        return _run(engine, actor, resumed=resumed, link_wait=link_wait)
    except RestoreRefused:
        raise
    except Refused as exc:
        _refused(engine, f"waiting for the writer lock: {exc}", exc)
    except KeaError as exc:
        _refused(engine, f"{exc}; the fence is not recorded until every Kea takes it", exc)
    except Exception as exc:  # every failure is a state with a next step, never a 500
        _refused(engine, f"{type(exc).__name__}: {exc}", exc)
    raise AssertionError("unreachable")  # pragma: no cover


def _refused(engine: Engine, why: str, exc: BaseException) -> None:
    record = read_record(engine.state.root)
    if record is None or record.get("state") in (*TERMINAL, "damaged"):
        raise RestoreRefused(why) from exc
    record["problem"] = (
        f"{why}; the restore stays {record['state']!r} — the agent retries it by itself, "
        f"or now: trueup restore apply {record.get('archive')} --mode {record.get('mode')}"
    )
    _save(engine, record)
    raise RestoreRefused(record["problem"]) from exc


def _run(engine: Engine, actor: str, *, resumed: bool, link_wait: float) -> RestoreRecord:
    root = engine.state.root
    record = read_record(root)
    if record is None or record.get("state") in (*TERMINAL, "damaged"):
        raise RestoreRefused("no restore is pending")
    note = ""
    if record.get("boot_id") != boot_id():
        note = "resumed after a reboot (the boot ID changed)"
    elif resumed:
        note = "resumed (same boot)"
    last = record["history"][-1] if record.get("history") else {}
    if note and (last.get("note"), last.get("state")) != (note, record["state"]):
        record["history"].append({"state": record["state"], "note": note})  # once per state
    while True:
        state = record["state"]
        if state == "analyzed":
            # Enforced before it is recorded: every running Kea drops and is disabled, and
            # the file each starts from carries the fence class, before the fence record
            # (and `fenced`) is written. No moment says fenced while Kea serves.
            fence_kea(engine)  # a Kea that does not take it: refused, the fence not recorded
            reason = f"restore of {record['archive']} ({record['mode']}) in progress"
            hold_fence(root, "dhcp", OWNER, reason)
            assert_allocator(engine)  # a Kea (re)started in between follows the record too
            record["fence_held"] = True
            engine.state.audit.append("fence_held", actor, subsystem="dhcp", owner=OWNER)
            _transition(engine, record, "fenced")
        elif state == "fenced":
            _stage(engine, record)
            _transition(engine, record, "staged")
        elif state == "staged":
            record["awaiting_boot_id"] = boot_id()
            _transition(engine, record, "awaiting_restart")
        elif state in ("awaiting_restart", "applying"):
            if (
                state == "awaiting_restart"
                and record.get("reboot")
                and boot_id() == record.get("awaiting_boot_id")
            ):
                return record
            if not _links_ready(engine, record, actor, link_wait):
                return record  # waiting for links (or given up: rolled back)
            # The writer is taken before `applying` is written: a busy writer leaves the
            # record where it was, never `applying` with nothing applying it.
            with engine.writer("restore", actor, wait=WRITER_WAIT):
                if state == "awaiting_restart":
                    record.pop("problem", None)
                    _transition(engine, record, "applying")
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
            record.pop("retry", None)
            _transition(engine, record, "completed")
            _finish(engine, record, actor)
            return record
        else:
            return record


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _required_links(engine: Engine) -> set[str]:
    """The interface names the restored revision (mapped) uses."""
    try:
        document = json.loads((_staged_dir(engine) / "document.json").read_text())
    except (OSError, ValueError):
        return set()  # `_apply` names the unreadable staged revision
    return {name for _where, name in interface_refs(document)}


def _link_names(engine: Engine) -> set[str]:
    netlink = engine.netlink_factory()
    try:
        return {link.name for link in netlink.links()}
    finally:
        netlink.close()


def _links_ready(engine: Engine, record: RestoreRecord, actor: str, wait: float) -> bool:
    """True when every link the restored revision names exists; else wait up to `wait`
    seconds for them (recorded: `waiting`), and give up after `LINK_WAIT` in all."""
    required = _required_links(engine)
    deadline = time.monotonic() + wait
    while True:
        missing = sorted(required - _link_names(engine))
        waiting = record.get("waiting")
        if not missing:
            if waiting is not None:
                record.pop("waiting", None)
                record.pop("problem", None)
                record.setdefault("notes", []).append(
                    f"links {', '.join(waiting.get('links', []))} appeared at {_now()}"
                )
                _save(engine, record)
            return True
        if not isinstance(waiting, dict) or waiting.get("boot_id") != boot_id():
            waiting = {"for": "links", "since": _now(), "boot_id": boot_id(), "links": []}
        if waiting.get("links") != missing:
            waiting["links"] = missing
            waiting["seconds"] = LINK_WAIT
            record["waiting"] = waiting
            record["problem"] = (
                f"waiting for links {', '.join(missing)} (since {waiting['since']}): the restored "
                f"revision names them; the restore goes on as soon as they exist, and gives up "
                f"after {LINK_WAIT:g} s"
            )
            _save(engine, record)
        since = datetime.fromisoformat(str(waiting["since"]))
        if (datetime.now(UTC) - since).total_seconds() >= LINK_WAIT:
            _give_up_on_links(engine, record, actor, missing, str(waiting["since"]))
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(LINK_POLL)


def _give_up_on_links(
    engine: Engine, record: RestoreRecord, actor: str, missing: list[str], since: str
) -> None:
    problem = (
        f"links {', '.join(missing)} did not appear within {LINK_WAIT:g} s (waited since "
        f"{since}); nothing of the restored revision was applied"
    )
    record.pop("waiting", None)
    if record["state"] == "awaiting_restart":
        # Nothing was changed by this restore: the system is as it was, the fence goes.
        record["problem"] = problem
        lift_fence(engine.state.root, "dhcp")
        record["fence_held"] = False
        _transition(engine, record, "rolled_back", problem)
        assert_allocator(engine)
        engine.state.audit.append(
            "restore_rolled_back", actor, restore=record["id"], problem=problem[:500]
        )
        return
    _roll_back(engine, record, actor, problem)


def _finish(engine: Engine, record: RestoreRecord, actor: str) -> None:
    """After `completed`: lift the fence, tell Kea, drop the staged copies, audit."""
    lift_fence(engine.state.root, "dhcp")
    record["fence_held"] = False
    _save(engine, record)
    assert_allocator(engine)
    shutil.rmtree(_staged_dir(engine), ignore_errors=True)
    engine.state.audit.append(
        "restore_completed", actor, restore=record["id"], archive=record["archive"]
    )


def _stage(engine: Engine, record: RestoreRecord) -> None:
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


def _apply(engine: Engine, record: RestoreRecord, actor: str) -> None:
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
                Change.restore(
                    document,
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


def _roll_back(engine: Engine, record: RestoreRecord, actor: str, problem: str) -> None:
    """The restore failed: leases back (full), the previous revision converged, fence decided."""
    root = engine.state.root
    record["problem"] = problem
    with engine.writer("restore", actor, wait=WRITER_WAIT):
        put_back_leases(engine.daemons, record)
        previous = record.get("previous") or {}
        back = engine.state.applied()
        at_previous = (back.version, back.digest) == (
            previous.get("version"),
            previous.get("digest"),
        )
        current = engine.applied_document()
        if current is not None and at_previous:
            try:  # level-based: Kea stopped for the lease swap is started again
                result = engine.transact(Change.restore_undone(current, actor=actor))
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
