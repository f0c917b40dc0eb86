"""The startup orchestrator: management first, then journals, then subsystems.

Phases, in this order, each logged and visible in `status`:

0. `load`        read the state directory — no network needed; a damaged file
                 is recorded (`trueup.journal.damage`), never fatal;
1. `management`  converge the management interface, addresses and gateway
                 from the first readable source of management facts (a
                 console override, `management.json`, the last committed
                 revision, the config file, the installer fallback:
                 `trueup.startup.sources`), then the caller starts the API
                 listeners;
2. `recovery`    recover an open transaction to the last committed revision;
3. `subsystems`  apply the configured document tier by tier, each subsystem
                 within its own deadline;
4. `steady`      the reconcile loop.

Nothing before phase 1 may need the network, name resolution or a daemon;
no failure after phase 1 can take management down.

Why this module is over 400 lines: the five startup phases and the retry of
failed subsystems, each short; they share the per-subsystem startup verdicts.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from trueup.backup.analysis import current_device
from trueup.journal.atomic import StateFileError
from trueup.journal.audit import now_iso
from trueup.journal.identity import device_mismatch
from trueup.journal.state import StateDirError
from trueup.model.document import DeviceState, DocumentError, document_digest, load_document
from trueup.reconcile.changes import (
    ApplyResult,
    Change,
    DamagedState,
    Kind,
    Mode,
    NeedsConfirmation,
    Refused,
)
from trueup.reconcile.confirm import settle_at_startup
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine.converge import converge_management
from trueup.startup.sources import ManagementSource, management_source

__all__ = [
    "PHASES",
    "HealedAtStart",
    "Orchestrator",
    "PhaseJSON",
    "PhaseRecord",
    "StartupVerdict",
]

log = logging.getLogger("trueup.startup")

PHASES = ("load", "management", "recovery", "subsystems", "steady")


class PhaseJSON(TypedDict):
    """One startup phase as status' `agent.startup` shows it."""

    name: str
    state: str  # pending | running | done | failed
    started_at: str | None
    ended_at: str | None
    duration_ms: float | None
    detail: str


class StartupVerdict(TypedDict):
    """Startup's verdict on one subsystem, shown by status until the subsystem is healthy."""

    health: str  # pending | failed
    reason: str
    since: str | None
    # A late link the loop finishes: the verdict is moot once status sees it in sync.
    until_in_sync: NotRequired[bool]


class HealedAtStart(TypedDict):
    """A step the start took to bring a subsystem back to the committed revision."""

    subsystem: str
    path: str
    step: str


@dataclass
class PhaseRecord:
    name: str
    state: str = "pending"  # pending | running | done | failed
    started_at: str | None = None
    ended_at: str | None = None
    detail: str = ""
    duration_ms: float | None = None
    _t0: float = field(default=0.0, repr=False)

    def to_json(self) -> PhaseJSON:
        return {
            "name": self.name,
            "state": self.state,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_ms": self.duration_ms,
            "detail": self.detail,
        }


class Orchestrator:
    def __init__(
        self,
        engine: Engine,
        *,
        config_path: str | None = None,
        fallback_path: str | None = None,
    ) -> None:
        self.engine = engine
        self.config_path = config_path
        self.fallback_path = fallback_path
        self.phases = {name: PhaseRecord(name) for name in PHASES}
        self.config_document: DeviceState | None = None
        self.config_error: str | None = None
        self.management_document: DeviceState | None = None
        self.management_from = ManagementSource(None, "not read yet", "none")
        self.management_error: str | None = None
        self.document: DeviceState | None = None
        self.subsystem_health: dict[str, StartupVerdict] = {}
        self.startup_drift: list[HealedAtStart] = []
        self.lock = threading.Lock()

    # -- bookkeeping -------------------------------------------------------
    def _start(self, name: str) -> PhaseRecord:
        record = self.phases[name]
        record.state, record.started_at, record._t0 = "running", now_iso(), time.monotonic()
        log.info("phase %s: started", name)
        return record

    def _end(self, record: PhaseRecord, state: str, detail: str = "") -> None:
        record.state, record.ended_at = state, now_iso()
        record.duration_ms = round((time.monotonic() - record._t0) * 1000, 2)
        record.detail = detail
        log.info("phase %s: %s %s", record.name, state, detail)

    def phase_list(self) -> list[PhaseJSON]:
        return [p.to_json() for p in self.phases.values()]

    def _refused_by_damage(self, record: PhaseRecord) -> bool:
        """End the phase, not run, when a damaged state file refuses writes."""
        try:
            self.engine.refuse_if_damaged()
        except DamagedState as exc:
            self._end(record, "failed", f"not run: {exc}")
            return True
        return False

    # -- phase 0 ------------------------------------------------------------
    def load(self) -> None:
        """Read what phase 1 needs; never raises. Damaged files are recorded, left as evidence."""
        record = self._start("load")
        state = self.engine.state
        if self.config_path:
            try:
                self.config_document = load_document(self.config_path)
            except DocumentError as exc:
                self.config_error = str(exc)
                log.error("%s", exc)
        device = self.config_document.metadata.device if self.config_document else None
        applied_device = current_device(state)[0] if state.exists() else None
        refused = device_mismatch(state.root, device, known=applied_device)
        if refused is not None:
            # `agent run` refuses this before it starts (trueup.agent.fastboot) when it can
            # read the device without YAML; here the document is parsed: never applied.
            self.config_document, device = None, None
            self.config_error = f"{self.config_path}: {refused.removeprefix('trueup: ')}"
            log.error("%s", self.config_error)
        try:
            # The directory's identity: created, adopted from an older trueup, or its device bound.
            state.ensure(
                created_by="trueup agent run", device=device or applied_device, actor="agent"
            )
        except (StateDirError, OSError) as exc:  # reported by the damage check
            log.error("state directory: %s", exc)
        try:
            found = management_source(
                state,
                config=self.config_document,
                config_path=self.config_path,
                fallback_path=self.fallback_path,
            )
        except Exception as exc:  # phase 0 must never stop management: say why, go on
            log.exception("reading the management facts failed")
            found = ManagementSource(None, "none", "none", [f"reading failed: {exc}"])
        self.management_from = found
        self.management_document = found.document
        for why in found.skipped:
            log.warning("management source skipped: %s", why)
        damaged = self.engine.check.damaged()
        for damage in damaged:
            log.error("damaged state: %s — %s", damage.sentence(), damage.to_json()["consequence"])
        detail = f"management from {found.source}"
        if damaged:
            detail += "; damaged: " + ", ".join(d.file for d in damaged)
        self._end(record, "done", detail)

    # -- phase 1 ------------------------------------------------------------
    def management(self) -> bool:
        """Converge the management subsystem alone. Never raises.

        Needs only the kernel: the facts were read in phase 0, and the audit
        line is best effort (a read-only or full state directory must not
        keep management down).
        """
        record = self._start("management")
        document = self.management_document
        if document is None:
            self._end(record, "failed", "no accepted document and no fallback")
            self.management_error = "no management configuration"
            return False
        source = self.management_from.source
        try:
            done = converge_management(self.engine, document, actor="startup", source=source)
        except Exception as exc:  # management must report, never crash the agent
            self.management_error = str(exc)
            self._end(record, "failed", str(exc))
            return False
        detail = f"{len(done.steps)} step(s) from {source}"
        if done.audit_problem is not None:
            detail += " (not audited: the state directory refused the line)"
        self._end(record, "done", detail)
        self.management_error = None
        return True

    # -- phase 2 ------------------------------------------------------------
    def recovery(self) -> None:
        record = self._start("recovery")
        if self._refused_by_damage(record):
            return
        try:
            with self.engine.writer("recovery", "startup", wait=30.0):
                recovered = self.engine.recover(actor="startup")
                # An apply whose confirmation expired while the agent was down goes
                # back to the last confirmed revision now, right after management.
                confirmation = settle_at_startup(self.engine, time.time())
            detail = f"rolled back {recovered.txn}" if recovered else "no open transaction"
            if confirmation:
                detail += f"; {confirmation}"
            self._end(record, "done", detail)
        except Refused as exc:
            self._end(record, "failed", str(exc))
        except Exception as exc:
            log.exception("recovery failed")
            self._end(record, "failed", str(exc))

    # -- phase 3 ------------------------------------------------------------
    def subsystems(self) -> None:
        """Phase 3: prepare every subsystem within its deadline, then apply tier by tier.

        Preparation (name resolution, waiting for a daemon) changes nothing, so
        it runs outside the writer lock and in parallel; a subsystem that does
        not finish in time is skipped and reported failed, and the others
        proceed. Subsystems that failed are retried later with back-off.
        """
        record = self._start("subsystems")
        if self._refused_by_damage(record):
            return
        document = self.config_document
        state = self.engine.state
        config_digest = document_digest(document) if document is not None else None
        try:
            applied_config = state.read("config.json", {})
            applied_digest = (
                applied_config.get("digest") if isinstance(applied_config, dict) else None
            )
        except (StateFileError, OSError) as exc:
            # Unknown whether the file was applied before: applying it again could
            # replace a newer revision, so the accepted state is enforced instead.
            applied_digest = config_digest
            self.config_error = (
                f"{exc}: {self.config_path} is not applied again until it is repaired"
            )
        if document is not None and config_digest == applied_digest:
            # The config file was applied before; later revisions (from the control
            # plane or the API) win until the file itself changes.
            document = None
        if document is not None and self._managed_by_control_plane():
            # The control plane's revision is the source of truth here: a changed
            # config file is not a silent override (use `apply --override`).
            self.config_error = (
                f"{self.config_path}: not applied — this device is managed by the control plane "
                f"at {self.engine.managed_by()}; its desired revision is applied instead (to "
                "change the device locally, `trueup apply FILE --override REASON`)"
            )
            document = None
        enforcing = document is None
        if document is None:
            detail = self.config_error or "configuration unchanged; enforcing accepted state"
            document = self.engine.applied_document()
            if document is None:
                self._end(record, "done", detail)
                return
        self.document = document
        # Every subsystem, under every policy: a start (a reboot, the agent's own
        # restart) is not drift. `notify` governs what changes after the start; what
        # the start cannot finish (a late link, a failure) is finished by the loop.
        names = [s.name for s in self.engine.subsystems]
        try:
            result = self._prepare_and_apply(
                document, names, kind=Kind.RECONCILE if enforcing else Kind.APPLY
            )
            if result is None:
                self._end(record, "done", "nothing to do")
                return
            if result.ok and config_digest and self.config_document is not None:
                state.write(
                    "config.json",
                    {"digest": config_digest, "path": self.config_path, "version": result.version},
                )
            if enforcing and result.txn:
                healed: list[HealedAtStart] = [
                    {"subsystem": p.subsystem, "path": step.path, "step": step.describe()}
                    for p in result.plans
                    for step in p.steps
                ]
                if healed:
                    self.startup_drift = healed
                    state.audit.append("drift_healed", "startup", paths=healed)
            self._end(
                record,
                "done" if result.ok else "failed",
                f"version {result.version}: {result.outcome}"
                + (f" {result.failed}" if result.failed else ""),
            )
        except Refused as exc:
            self._end(record, "failed", f"{exc.code.value}: {exc}")
        except NeedsConfirmation as exc:
            self.config_error = f"{self.config_path}: not applied: {exc}"
            self._end(record, "failed", self.config_error)
        except Exception as exc:
            log.exception("subsystem phase failed")
            self._end(record, "failed", str(exc))

    def _managed_by_control_plane(self) -> bool:
        try:
            applied = self.engine.state.applied()
        except (StateFileError, ValueError):
            return False
        return self.engine.managed_by() is not None and applied.cp_version is not None

    def _prepare_and_apply(
        self, document: DeviceState, names: list[str], *, kind: Kind
    ) -> ApplyResult | None:
        """One engine transaction over `names`: each prepared and applied within its deadline."""
        if not names:
            return None
        for name in names:
            if name not in self.failed_subsystems():
                # A retried failure keeps its verdict until it succeeds.
                self._set_health(name, "pending", "preparing")
        deadlines = {n: document.spec.convergence.deadline_for(n) for n in names}
        source = self.config_path or ""
        # A VIP the revision before had, left on an interface, is nobody's.
        former = self.engine.former_virtual_addresses()
        if kind is Kind.RECONCILE:
            change = Change.heal(
                document,
                actor="startup",
                lock_wait=30.0,
                source=source,
                only=names,
                deadlines=deadlines,
                former_virtual=former,
            )
        else:
            change = Change.apply(
                document,
                origin="local-file",
                mode=Mode.BEST_EFFORT,
                actor="startup",
                lock_wait=30.0,
                source=source,
                only=names,
                deadlines=deadlines,
                former_virtual=former,
            )
        result = self.engine.transact(change)
        for name in names:
            if name in result.failed:
                self._set_health(name, "failed", result.failed[name])
            elif name in result.waiting:
                # A late link: the loop finishes it; moot once status sees it in sync.
                self._set_health(name, "pending", result.waiting[name], until_in_sync=True)
            else:
                self.clear_health(name)
        return result

    # -- per-subsystem startup health -------------------------------------------------
    def _set_health(
        self, name: str, health: str, reason: str, *, until_in_sync: bool = False
    ) -> None:
        with self.lock:
            current = self.subsystem_health.get(name)
            same = current is not None and current["health"] == health
            since = current["since"] if current is not None and same else now_iso()
            verdict: StartupVerdict = {"health": health, "reason": reason, "since": since}
            if until_in_sync:
                verdict["until_in_sync"] = True
            self.subsystem_health[name] = verdict

    def clear_health(self, name: str) -> None:
        with self.lock:
            self.subsystem_health.pop(name, None)

    def unsettled(self) -> list[str]:
        """Subsystems the start did not bring to the committed revision: pending or failed."""
        with self.lock:
            return [
                n for n, h in self.subsystem_health.items() if h["health"] in ("pending", "failed")
            ]

    def failed_subsystems(self) -> list[str]:
        with self.lock:
            return [n for n, h in self.subsystem_health.items() if h["health"] == "failed"]

    def retry_failed(
        self,
        stop: threading.Event,
        *,
        base: float = 1.0,
        cap: float = 30.0,
        budget: int = 20,
        may_heal: Callable[[str], bool] = lambda name: True,
    ) -> None:
        """Retry failed subsystems with back-off, within a budget, until they succeed.

        A link that was not running at start, a resolver that was unreachable:
        these recover by themselves here, per subsystem, never as a global state.
        A subsystem the reconcile loop may not heal now (notify, acknowledged,
        breaker open) is not retried; after `budget` attempts the rest stay
        failed, with the reason, until a new apply or reconcile.
        """
        delay = base
        attempts = 0
        while not stop.is_set():
            failed = self.failed_subsystems()
            if not failed:
                return
            jitter = random.uniform(0, delay / 4)
            if stop.wait(delay + jitter):
                return
            retriable = [name for name in failed if may_heal(name)]
            if not retriable:
                delay = min(cap, delay * 2)
                continue
            if attempts >= budget:
                for name in retriable:
                    verdict = self.subsystem_health.get(name)
                    reason = verdict["reason"] if verdict is not None else ""
                    self._set_health(
                        name,
                        "failed",
                        f"{reason} (gave up after {budget} retries; a new apply or "
                        "`trueup reconcile` tries again)",
                    )
                log.warning("giving up retrying %s after %d attempts", retriable, budget)
                return
            attempts += 1
            document = self.engine.applied_document() or self.document
            if document is None:
                continue
            try:
                result = self._prepare_and_apply(document, retriable, kind=Kind.RECONCILE)
            except Refused as exc:
                log.info("retry of %s deferred: %s", retriable, exc)
                continue
            except Exception:
                log.exception("retry of %s failed", retriable)
                result = None
            if result is not None and not set(retriable) & set(result.failed):
                delay = base
                log.info("recovered: %s", ", ".join(retriable))
            else:
                delay = min(cap, delay * 2)

    def steady(self) -> None:
        record = self._start("steady")
        record.state = "running"
