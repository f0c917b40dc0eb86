"""What a caller hands the engine and what it gets back: changes, results, refusals.

Types only (`trueup.reconcile.engine.Engine` does the work); split out so the
engine's modules share one vocabulary. Every `Change` in trueup is built here,
by one named constructor per purpose (`Change.apply`, `.heal`, `.rollback`,
`.confirm_timeout`, `.restore`, `.restore_undone`).

Why this module is over 400 lines: the constructors are the one place each
kind of change is decided (its mode, version rule, confirmation and source
text); spread over their callers they were ten copies that drifted apart.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, NotRequired, TypedDict

from trueup.journal.damage import Damage
from trueup.model.document import DeviceState
from trueup.model.reasons import ReasonCode
from trueup.subsystems.base import Plan

__all__ = [
    "CONTROL_PLANE_FILE",
    "ApplyResult",
    "ApplyResultJSON",
    "AuditBuilder",
    "Change",
    "DamagedState",
    "Kind",
    "Mode",
    "NeedsConfirmation",
    "Origin",
    "Outcome",
    "Refused",
    "StorageError",
    "UnknownRevision",
    "own_label",
]


class Mode(StrEnum):
    """How a transaction treats a failing subsystem; the CLI's `--mode` and the API's `mode`."""

    ATOMIC = "atomic"  # all or nothing: a failure rolls every subsystem back
    BEST_EFFORT = "best-effort"  # what converged stays; the failures are reported

    @classmethod
    def parse(cls, text: str) -> Mode:
        """The mode `text` names (`atomic`, `best-effort`); anything else is refused."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"mode {text!r}: expected atomic or best-effort") from None


Origin = Literal[
    "control-plane",
    "local-file",
    "local-cli",
    "rollback",
    "recovery",
    "confirm-timeout",
    "reconcile",
    "restore",
]


class Kind(StrEnum):
    """What a transaction is for; its journal `begin` line and audit events carry the value."""

    APPLY = "apply"
    RECONCILE = "reconcile"  # a heal: converges to the committed revision
    ROLLBACK = "rollback"
    CONFIRM_TIMEOUT = "confirm-timeout"
    RESTORE = "restore"


class Outcome(StrEnum):
    """How a transaction ended; `ApplyResult.outcome` and the journal's terminal line."""

    COMMITTED = "committed"
    PARTIAL = "partial"  # best-effort: committed with failed subsystems
    ROLLED_BACK = "rolled_back"
    UNCHANGED = "unchanged"
    FAILED = "failed"  # a heal that failed: nothing to roll back to
    # The agent's answers that are no transaction's outcome (`ApplyResult.from_json` reads them).
    REFUSED = "refused"  # a guarded write without a confirmation: nothing changed
    NOTHING_APPLIED = "nothing applied"  # a reconcile before the first apply
    RECONCILED = "reconciled"  # a forced pass that healed
    IN_SYNC = "in sync"  # a forced pass with nothing to heal


# Builds a transaction's audit lines from its outcome: (txn, failed, waiting, healed).
AuditBuilder = Callable[
    [str, dict[str, str], dict[str, str], dict[str, list[str]]], list[tuple[str, dict[str, Any]]]
]

# Written by the agent when it is managed by a control plane.
CONTROL_PLANE_FILE = "control-plane.json"


class UnknownRevision(LookupError):
    """A rollback target that is not among the accepted revisions."""


class Refused(Exception):
    """A write refused before anything changed, with the reason code that explains it."""

    def __init__(self, code: ReasonCode, message: str, **evidence: Any) -> None:
        self.code = code
        self.evidence = evidence
        super().__init__(message)


class StorageError(RuntimeError):
    """The state directory refused a write (full, read-only); nothing was left changed."""


class DamagedState(Refused):
    """A write refused because a state file it depends on is damaged; nothing was changed.

    Raised before the writer lock, the journal or the system are touched. The
    code is `STATE_APPLY_NOT_COMPLETED` for a damaged pending confirmation,
    else `STATE_VERSION_SKEW` (the agent cannot tell what is applied).
    """

    def __init__(self, damaged: list[Damage]) -> None:
        self.damaged = damaged
        first = damaged[0]
        code = (
            ReasonCode.APPLY_NOT_COMPLETED
            if first.file == "pending-confirm.json"
            else ReasonCode.VERSION_SKEW
        )
        also = (
            " Also damaged: " + ", ".join(d.sentence() for d in damaged[1:]) + "."
            if len(damaged) > 1
            else ""
        )
        super().__init__(
            code,
            f"{first.sentence()}. Writes are refused while it is damaged; nothing was changed "
            "(management and diagnostics keep running). Keep it as evidence (`trueup "
            f"evidence`), then restore it from a backup or move it aside (mv {first.path} "
            f"{first.path}.damaged); the refusal lifts at once.{also}",
            damaged=[d.to_json() for d in damaged],
        )


class NeedsConfirmation(Exception):
    """A change that would take management access away, refused without a confirmation."""

    def __init__(self, message: str, changes: list[str]) -> None:
        self.changes = changes
        super().__init__(message)


@dataclass(frozen=True)
class Change:
    """What a caller asks of the engine: every writer builds one with a constructor below.

    `only` limits the subsystems the transaction may change (a heal names the
    ones it heals); `contested` pins paths another writer keeps changing to
    what is observed; `skipped` names subsystems that could not start, with
    the reason. `management_confirmed` is set when the caller arranged a
    confirmation (or restores a confirmed revision). `new_version` gives the
    document the next version number (rollbacks). `override` is the operator's
    reason for a local change on a device the control plane manages.
    `former_virtual` adds HA virtual addresses of earlier revisions to the
    scope: at a start they are released wherever nobody holds them.
    """

    document: DeviceState
    kind: Kind = Kind.APPLY
    origin: Origin = "local-cli"
    actor: str = "local"
    mode: Mode = Mode.ATOMIC
    expect_version: int | None = None
    only: frozenset[str] | None = None
    contested: Mapping[str, Collection[str]] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    management_confirmed: bool = False
    new_version: bool = False
    override: str | None = None
    lock_wait: float = 0.0
    source: str = ""
    deadlines: Mapping[str, float] | None = None
    former_virtual: frozenset[str] = frozenset()
    # A restore's revision: it replaces a local override as a local apply does.
    replaces_override: bool = False
    # The audit lines to write with the commit; default one line of event `kind`.
    audit: AuditBuilder | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))  # "apply" read from a file, too
        object.__setattr__(self, "mode", Mode.parse(self.mode))

    # -- the writers: every `Change` in trueup is built by one of these -------
    @classmethod
    def apply(
        cls,
        document: DeviceState,
        *,
        origin: Origin = "local-cli",
        actor: str = "local",
        mode: Mode | str = Mode.ATOMIC,
        expect_version: int | None = None,
        override: str | None = None,
        source: str = "",
        lock_wait: float = 0.0,
        only: Collection[str] | None = None,
        skipped: Mapping[str, str] | None = None,
        deadlines: Mapping[str, float] | None = None,
        management_confirmed: bool = False,
        former_virtual: Collection[str] = (),
    ) -> Change:
        """An apply of `document`: an operator's (CLI, API), the control plane's, the start's.

        `mode` is a `Mode` or its string (`atomic`, `best-effort`: the CLI's
        `--mode`, the API's `mode`); any other string raises `ValueError`.
        """
        return cls(
            document,
            kind=Kind.APPLY,
            origin=origin,
            actor=actor,
            mode=Mode.parse(mode),
            expect_version=expect_version,
            only=frozenset(only) if only is not None else None,
            skipped=dict(skipped or {}),
            management_confirmed=management_confirmed,
            override=override,
            lock_wait=lock_wait,
            source=source,
            deadlines=deadlines,
            former_virtual=frozenset(former_virtual),
        )

    @classmethod
    def heal(
        cls,
        document: DeviceState,
        *,
        actor: str,
        origin: Origin = "reconcile",
        only: Collection[str] | None = None,
        contested: Mapping[str, Collection[str]] | None = None,
        lock_wait: float = 0.0,
        audit: AuditBuilder | None = None,
        source: str = "",
        skipped: Mapping[str, str] | None = None,
        deadlines: Mapping[str, float] | None = None,
        former_virtual: Collection[str] = (),
    ) -> Change:
        """A heal (`reconcile`) towards the committed revision `document`, best-effort.

        What works stays, so a failing link never takes restored management
        addresses away; `only` names the subsystems it heals, `contested` the
        paths it leaves alone.
        """
        return cls(
            document,
            kind=Kind.RECONCILE,
            origin=origin,
            actor=actor,
            mode=Mode.BEST_EFFORT,
            only=frozenset(only) if only is not None else None,
            contested=dict(contested or {}),
            skipped=dict(skipped or {}),
            lock_wait=lock_wait,
            source=source,
            deadlines=deadlines,
            former_virtual=frozenset(former_virtual),
            audit=audit,
        )

    @classmethod
    def rollback(
        cls,
        document: DeviceState,
        *,
        target: int,
        applied_version: int,
        actor: str,
        expect_version: int | None = None,
        override: str | None = None,
        management_confirmed: bool = False,
    ) -> Change:
        """`trueup rollback`: accepted revision `target` (its `document`) again, as a new version.

        It expects `applied_version` unless the caller names another.
        """
        return cls(
            document,
            kind=Kind.ROLLBACK,
            origin="rollback",
            actor=actor,
            expect_version=applied_version if expect_version is None else expect_version,
            new_version=True,
            management_confirmed=management_confirmed,
            override=override,
            source=f"revision {target}",
        )

    @classmethod
    def confirm_timeout(
        cls, document: DeviceState, *, target: int, unconfirmed: int | None, actor: str
    ) -> Change:
        """A missed confirmation: the last confirmed revision `target` again, as a new version.

        As much of it as possible (best-effort): an unrelated failing subsystem
        (a link deleted meanwhile) must not keep management away.
        """
        return cls(
            document,
            kind=Kind.CONFIRM_TIMEOUT,
            origin="confirm-timeout",
            mode=Mode.BEST_EFFORT,
            actor=actor,
            new_version=True,
            management_confirmed=True,  # back to what was confirmed
            lock_wait=2.0,
            source=f"confirmation of version {unconfirmed} missed its deadline; "
            f"back to revision {target}",
        )

    @classmethod
    def restore(cls, document: DeviceState, *, actor: str, source: str) -> Change:
        """A restore's revision: it replaces a local override as a local apply does."""
        return cls(
            document,
            kind=Kind.RESTORE,
            origin="restore",
            actor=actor,
            source=source,
            replaces_override=True,
        )

    @classmethod
    def restore_undone(cls, document: DeviceState, *, actor: str) -> Change:
        """A failed restore's way back: the revision before it converged again."""
        return cls(document, kind=Kind.RESTORE, origin="restore", actor=actor)


class ApplyResultJSON(TypedDict):
    """`ApplyResult.to_json`: the agent's answer to an apply, rollback or heal."""

    ok: bool
    version: int
    outcome: str  # an `Outcome` value
    txn: str | None
    steps: list[str]
    failed: dict[str, str]
    rollback_errors: list[str]
    waiting: NotRequired[dict[str, str]]
    origin: NotRequired[str]
    digest: NotRequired[str]
    attempted_version: NotRequired[int]
    carried: NotRequired[dict[str, str]]
    cleared: NotRequired[list[str]]


@dataclass(kw_only=True)
class ApplyResult:
    """What one transaction did; `to_json` / `from_json` are its wire form (the agent's API)."""

    ok: bool
    version: int
    outcome: Outcome
    txn: str | None = None
    plans: list[Plan] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    rollback_errors: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    healed: dict[str, list[str]] = field(default_factory=dict)  # subsystem → steps run
    origin: str | None = None
    digest: str | None = None
    # rolled_back: the version that was tried and undone (`version` is the one that remains).
    attempted: int | None = None
    # Failing before this write, their section unchanged by it: left out, still failing
    # (subsystem → why); the reconcile loop goes on healing them.
    carried: dict[str, str] = field(default_factory=dict)
    # Reason codes this write answered (an unchanged apply after crash recovery).
    cleared: list[str] = field(default_factory=list)
    # Set by `from_json`: the steps' descriptions as the wire carried them (no plans there).
    step_texts: list[str] | None = None

    @property
    def steps(self) -> list[str]:
        """What was planned, one description per step."""
        if self.step_texts is not None:
            return list(self.step_texts)
        return [s.describe() for p in self.plans for s in p.steps]

    def to_json(self) -> ApplyResultJSON:
        out: ApplyResultJSON = {
            "ok": self.ok,
            "version": self.version,
            "outcome": self.outcome.value,
            "txn": self.txn,
            "steps": self.steps,
            "failed": self.failed,
            "rollback_errors": self.rollback_errors,
        }
        if self.waiting:
            out["waiting"] = self.waiting
        if self.origin:
            out["origin"] = self.origin
        if self.digest:
            out["digest"] = self.digest
        if self.attempted is not None:
            out["attempted_version"] = self.attempted
        if self.carried:
            out["carried"] = self.carried
        if self.cleared:
            out["cleared"] = self.cleared
        return out

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ApplyResult:
        """The result `to_json` wrote (the agent's answer, read by a client)."""
        attempted = body.get("attempted_version")
        return cls(
            ok=bool(body.get("ok")),
            version=int(body.get("version") or 0),
            outcome=Outcome(str(body.get("outcome"))),
            txn=body.get("txn"),
            failed=dict(body.get("failed") or {}),
            rollback_errors=list(body.get("rollback_errors") or []),
            waiting=dict(body.get("waiting") or {}),
            origin=body.get("origin"),
            digest=body.get("digest"),
            attempted=int(attempted) if attempted is not None else None,
            carried=dict(body.get("carried") or {}),
            cleared=list(body.get("cleared") or []),
            step_texts=[str(s) for s in body.get("steps") or []],
        )


# How a transaction's own netlink notifications name their writer, by its kind.
_OWN_WORDS = {Kind.RECONCILE: "heal", Kind.CONFIRM_TIMEOUT: "confirm-timeout rollback"}


def own_label(kind: Kind, txn: str) -> str:
    """`trueup heal TXN`, `trueup apply TXN`, …: the writer of a transaction's own notifications."""
    return f"trueup {_OWN_WORDS.get(kind, kind)} {txn}"
